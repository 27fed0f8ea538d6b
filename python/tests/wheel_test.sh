#!/usr/bin/env bash
# The wheel (//python:wheel) installs with pip (offline, into a scratch directory) and the
# installed package imports and runs: its RECORD matches its files, and a client built from it
# pulls from a real ps_server.
set -euo pipefail
root="${TEST_SRCDIR}/pscluster"
wheel="$(ls "${root}"/python/pscluster-*.whl)"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
target="${TEST_TMPDIR}/site"
if "$py" -m pip --version >/dev/null 2>&1; then
  "$py" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$target" "$wheel"
else
  echo "wheel_test: pip is missing (deploy/install_deps.sh installs python3-pip); unzipping"
  "$py" -m zipfile -e "$wheel" "$target"
fi
test -f "$target/pscluster/_pscluster.so"
ls "$target"/pscluster-*.dist-info/RECORD
cd "${TEST_TMPDIR}"
PYTHONPATH="$target:${root}/python/tests" "$py" - "$wheel" <<'PY'
import base64, hashlib, sys, zipfile
import numpy as np
import pscluster
from local_cluster import LocalServers
assert pscluster.__file__.startswith(sys.path[1]) or "site" in pscluster.__file__, pscluster.__file__
with zipfile.ZipFile(sys.argv[1]) as z:
    names = set(z.namelist())
    record = [l.split(",") for l in z.read([n for n in names if n.endswith("RECORD")][0]).decode().splitlines()]
    assert {r[0] for r in record} == names, (names, record)
    for name, digest, size in record:
        if digest:
            data = z.read(name)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == want and int(size) == len(data), name
with LocalServers(n=1) as s:
    c = pscluster.connect(servers=s.addresses, job_id="wheel")
    c.declare(pscluster.dense("b", (4,), optimizer=pscluster.Optimizer("sgd", 1.0),
                              init=pscluster.Init("constant", value=3.0)))
    c.create_tables()
    b = np.zeros(4, np.float32)
    c.pull(0, dense={"b": b})
    assert (b == 3.0).all(), b
print("wheel_test: installed from", pscluster.__file__, "and pulled", b)
PY
