"""Real ps_server processes on loopback for the Python package's tests and examples.

    with LocalServers(bin_dir, n=2) as servers:   # servers.addresses: ["127.0.0.1:PORT", ...]
        ...
Each server listens on a free port (--listen=127.0.0.1:0 --port_file) and logs to its work dir;
on exit they get SIGTERM (then SIGKILL) and the work dir is removed.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time


def runfiles_root():
    """The Bazel runfiles root holding server/ps_server etc. (TEST_SRCDIR), or bazel-bin."""
    src = os.environ.get("TEST_SRCDIR")
    if src:
        return os.path.join(src, "pscluster")
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "bazel-bin")


class LocalServers:
    def __init__(self, bin_dir=None, n=2, extra_flags=()):
        self.bin_dir = bin_dir or runfiles_root()
        self.n = n
        self.extra_flags = list(extra_flags)
        self.procs = []
        self.addresses = []
        self.work = None

    def __enter__(self):
        self.work = tempfile.mkdtemp(prefix="pscluster-py-", dir=os.environ.get("TEST_TMPDIR"))
        for i in range(self.n):
            self.start(i)
        self.addresses = [self.wait_port(i) for i in range(self.n)]
        return self

    def start(self, i):
        port_file = os.path.join(self.work, f"server-{i}.port")
        args = [os.path.join(self.bin_dir, "server", "ps_server"), "--listen=127.0.0.1:0",
                f"--port_file={port_file}", "--data_threads=2", "--log_level=warn"] + self.extra_flags
        with open(os.path.join(self.work, f"server-{i}.log"), "ab") as log:
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        if i < len(self.procs):
            self.procs[i] = p
        else:
            self.procs.append(p)

    def wait_port(self, i, timeout=60):
        path = os.path.join(self.work, f"server-{i}.port")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"ps_server {i} exited with {self.procs[i].returncode}: "
                                   + self.log(i))
            if os.path.exists(path):
                with open(path) as f:
                    text = f.read().strip()
                if text:
                    return text
            time.sleep(0.05)
        raise RuntimeError(f"ps_server {i} wrote no port file in {timeout}s")

    def log(self, i):
        with open(os.path.join(self.work, f"server-{i}.log"), errors="replace") as f:
            return f.read()[-4000:]

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if exc[0] is not None:
            for i in range(len(self.procs)):
                print(f"--- ps_server {i} log ---\n{self.log(i)}")
        shutil.rmtree(self.work, ignore_errors=True)
