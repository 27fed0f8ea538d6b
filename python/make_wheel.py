"""Writes a wheel (PEP 427) of the pscluster package from its built files, offline.

Usage: make_wheel.py --version V --out FILE.whl FILE...
Each FILE's path below its last "pkg/" is its path in the wheel (pscluster/...). The wheel holds
the package, its .dist-info (METADATA, WHEEL, RECORD with sha256 of every file) and nothing else.
"""
import argparse
import base64
import hashlib
import zipfile

TAG = "cp311-cp311-linux_x86_64"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    dist = f"pscluster-{a.version}.dist-info"
    entries = []
    for f in sorted(a.files):
        if "pkg/" not in f:
            raise SystemExit(f"make_wheel: {f} is not under a pkg/ directory")
        with open(f, "rb") as fh:
            entries.append((f[f.rindex("pkg/") + 4:], fh.read()))
    metadata = (f"Metadata-Version: 2.1\nName: pscluster\nVersion: {a.version}\n"
                "Summary: Python client of the pscluster parameter servers, with PyTorch support\n"
                "Requires-Python: >=3.11,<3.12\nRequires-Dist: numpy\n").encode()
    wheel = (f"Wheel-Version: 1.0\nGenerator: pscluster make_wheel.py\nRoot-Is-Purelib: false\n"
             f"Tag: {TAG}\n").encode()
    entries += [(f"{dist}/METADATA", metadata), (f"{dist}/WHEEL", wheel)]
    record = "\n".join([record_line(n, d) for n, d in entries] + [f"{dist}/RECORD,,", ""])
    entries.append((f"{dist}/RECORD", record.encode()))
    with zipfile.ZipFile(a.out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)


if __name__ == "__main__":
    main()
