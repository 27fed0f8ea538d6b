#!/usr/bin/env python3
"""The Grafana dashboard queries only metrics the daemons export.

Starts a real ps_scheduler, ps_server and ps_worker with --metrics_listen, reads the metric
families each one's /metrics declares (# TYPE lines, present even before any job runs), and
checks that every pscluster_* name in the dashboard's queries is one of them (a histogram's
_bucket, _sum and _count series count as the histogram), that the dashboard is well-formed JSON
with the fields Grafana needs, and that `by (...)` and legend labels are ones the code sets.
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), "pscluster")


def runfile(rel):
    return os.path.join(RUNFILES, rel)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, deadline):
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return r.read().decode()
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def families(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def main():
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    sched_port, m_sched, m_server, m_worker = (free_port() for _ in range(4))
    sched = f"127.0.0.1:{sched_port}"
    procs = []
    logs = []

    def start(args, name):
        log = open(os.path.join(tmp, name + ".log"), "w")
        logs.append((name, log.name))
        procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))

    try:
        start([runfile("scheduler/ps_scheduler"), f"--listen={sched}",
               f"--db={tmp}/scheduler.db", f"--metrics_listen=127.0.0.1:{m_sched}"], "scheduler")
        start([runfile("server/ps_server"), "--listen=127.0.0.1:0", f"--scheduler={sched}",
               f"--metrics_listen=127.0.0.1:{m_server}"], "server")
        start([runfile("worker/ps_worker"), "--listen=127.0.0.1:0", f"--scheduler={sched}",
               "--device=cpu", f"--metrics_listen=127.0.0.1:{m_worker}"], "worker")
        deadline = time.time() + 60
        exported = {}
        for port in (m_sched, m_server, m_worker):
            exported.update(families(scrape(port, deadline)))
    except Exception:
        for name, path in logs:
            print(f"--- {name} log ---\n" + open(path).read(), file=sys.stderr)
        raise
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()

    dash = json.load(open(runfile("deploy/grafana/pscluster.json")))
    failures = []
    for key in ("title", "uid", "panels", "schemaVersion"):
        if key not in dash:
            failures.append(f"dashboard: no '{key}'")
    ids = [p["id"] for p in dash["panels"]]
    if len(ids) != len(set(ids)):
        failures.append("dashboard: panel ids repeat")
    queried = 0
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        targets = panel.get("targets", [])
        if not targets:
            failures.append(f"panel '{panel['title']}': no queries")
        for t in targets:
            expr = t["expr"]
            for name in re.findall(r"pscluster_[a-z0-9_]+", expr):
                queried += 1
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                if name in exported and exported[name] != "histogram":
                    continue
                if base != name and exported.get(base) == "histogram":
                    continue
                failures.append(f"panel '{panel['title']}': {name} is not exported by any daemon")
    print(f"{len(exported)} metric families exported; {queried} metric references checked")
    # Labels the panels group or name series by, and where the code sets them.
    code_labels = {"job", "phase", "call", "method", "role", "state", "instance", "le"}
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            used = set(re.findall(r"by \(([^)]*)\)", t["expr"]))
            names = {l.strip() for group in used for l in group.split(",")}
            names |= set(re.findall(r"\{\{(\w+)\}\}", t.get("legendFormat", "")))
            for l in names - code_labels:
                failures.append(f"panel '{panel['title']}': label '{l}' is not one the daemons set")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print("dashboard OK")


if __name__ == "__main__":
    main()
