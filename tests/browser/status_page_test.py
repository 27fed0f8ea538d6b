#!/usr/bin/env python3
"""The scheduler's web status page in a real browser (headless Chromium driven by Selenium)
against a real local cluster: a scheduler with --http_listen, 2 servers and 3 workers (one
spare), a Fashion-MNIST job on 2 of the workers. The page lists the job, its loss curve grows
as it trains, and once one of the job's workers is killed (SIGKILL) the hand-over of its rank
shows up among the job's events as a recovery; psctl export writes the running job's model. A
screenshot of the page is a test output. Then a scheduler with a token file: the page asks for a
token and opens with a viewer's.

Usage: status_page_test.py BIN_DIR (holding scheduler/ps_scheduler, scheduler/psctl,
server/ps_server, worker/ps_worker). Exits 0 with a SKIP line when Chromium, chromedriver or
Selenium is not installed (deploy/install_deps.sh installs them)."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]
OUT = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or tempfile.mkdtemp()
WORK = tempfile.mkdtemp(prefix="status_page_", dir=os.environ.get("TEST_TMPDIR"))
DEADLINE = time.time() + 150  # The whole test; each wait below is shorter.

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:
    print("SKIP: python3-selenium is not installed (deploy/install_deps.sh installs it)")
    sys.exit(0)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not CHROMIUM or not DRIVER:
    print("SKIP: chromium or chromedriver is not installed (apt-get install chromium "
          "chromium-driver; deploy/install_deps.sh installs them)")
    sys.exit(0)

procs = {}


def log_tail(name, n=30):
    try:
        with open(f"{WORK}/{name}.log") as f:
            return f"---- {name}\n" + "".join(f.readlines()[-n:])
    except OSError:
        return ""


def fail(msg):
    print("FAIL:", msg)
    for name in procs:
        print(log_tail(name))
    sys.exit(1)


def wait_for(what, cond, timeout):
    end = min(time.time() + timeout, DEADLINE)
    while time.time() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.25)
    fail(f"timed out waiting for {what}")


def start(name, args):
    log = open(f"{WORK}/{name}.log", "w")
    procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)


def port_file(name):
    path = f"{WORK}/{name}.port"
    return wait_for(f"{name} to listen", lambda: os.path.exists(path) and open(path).read().strip(), 30)


def psctl(*args):
    r = subprocess.run([f"{BIN}/scheduler/psctl", f"--scheduler={sched}", *args],
                       capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout + r.stderr


def stop_all():
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


try:
    start("scheduler", [f"{BIN}/scheduler/ps_scheduler", "--listen=127.0.0.1:0",
                        f"--port_file={WORK}/scheduler.port", f"--db={WORK}/s.db", "--db_sync=normal",
                        "--lease_ms=2000", "--startup_grace_ms=200", "--rebalance_every_ms=0",
                        "--http_listen=127.0.0.1:0"])
    sched = port_file("scheduler")
    http = wait_for("the status page's address in the scheduler's log", lambda: (
        re.search(r"status page at (http://[0-9.]+:\d+)/", open(f"{WORK}/scheduler.log").read()) or
        [None, None])[1], 10)
    for i in range(2):
        start(f"server-{i}", [f"{BIN}/server/ps_server", f"--scheduler={sched}", "--listen=127.0.0.1:0",
                             f"--port_file={WORK}/server-{i}.port", f"--checkpoint_dir={WORK}/ckpt-{i}"])
    for i in range(3):
        start(f"worker-{i}", [f"{BIN}/worker/ps_worker", f"--scheduler={sched}", "--listen=127.0.0.1:0",
                             f"--port_file={WORK}/worker-{i}.port", "--device=cpu", "--cpu_threads=1"])
    for name in ["server-0", "server-1", "worker-0", "worker-1", "worker-2"]:
        port_file(name)

    def nodes_alive():
        code, out = psctl("nodes", "-o", "json")
        return code == 0 and out.count("NODE_ALIVE") == 5
    wait_for("5 nodes alive", nodes_alive, 30)

    with open(f"{WORK}/job.yaml", "w") as f:
        f.write("name: page-test\nmodel:\n  kind: mlp\n  hidden: [32]\ndataset:\n  name: fashion_mnist\n"
                "optimizer:\n  kind: adam\n  learning_rate: 0.002\nconsistency:\n  mode: bsp\n"
                "num_servers: 2\nnum_workers: 2\ndevice: cpu\nepochs: 200\nbatch_size: 50\n"
                "num_virtual_shards: 16\nseed: 7\n")
    code, out = psctl("submit", f"{WORK}/job.yaml")
    if code != 0:
        fail(f"submit: {out}")
    job = out.strip().splitlines()[0]

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1600", f"--user-data-dir={WORK}/chrome"]:
        options.add_argument(a)
    browser = webdriver.Chrome(service=Service(DRIVER, log_output=f"{WORK}/chromedriver.log"),
                               options=options)
    browser.set_page_load_timeout(30)
    try:
        browser.get(f"{http}/#job={job}")

        def attr(css, name):
            els = browser.find_elements(By.CSS_SELECTOR, css)
            return els[0].get_attribute(name) if els else None

        wait_for("the page to list the job", lambda: attr(f'#jobs tr[data-job="{job}"]', "data-job"), 30)
        print("page lists", job)
        wait_for("the detail view of the job", lambda: attr("#detail", "data-job") == job, 20)
        first = int(wait_for("a loss curve with 2+ points",
                             lambda: int(attr("#loss-chart", "data-points") or 0) >= 2 and
                             attr("#loss-chart", "data-points"), 40))
        later = int(wait_for("the loss curve to grow",
                             lambda: int(attr("#loss-chart", "data-points") or 0) > first and
                             attr("#loss-chart", "data-points"), 30))
        print(f"loss curve: {first} points, then {later}")
        cells = wait_for("the shard map's 16 shards", lambda: len(
            browser.find_elements(By.CSS_SELECTOR, "#heat div[data-shard]")) == 16, 20)
        wait_for("per-shard traffic on the heat map", lambda: any(
            float(e.get_attribute("data-load") or 0) > 0
            for e in browser.find_elements(By.CSS_SELECTOR, "#heat div[data-shard]")), 20)
        print("heat map: 16 shards, traffic shown")

        # psctl export: the running job's model now, as a safetensors file, while it trains on.
        target = f"{WORK}/exports/now.safetensors"
        code, out = psctl("export", job, f"--to={target}")
        if code != 0:
            fail(f"psctl export: {out}")
        with open(target, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        step = int(header["__metadata__"]["steps"])
        if step <= 0 or not any(k.endswith("weight") for k in header) or f"step {step} exported" not in out:
            fail(f"export: {out} / {header}")
        code, out = psctl("export", "job-99")
        if code != 1 or "no job 'job-99'" not in out:
            fail(f"psctl export of an unknown job: {code} {out}")
        print(f"exported step {step}: {sorted(k for k in header if k != '__metadata__')}")

        # Kill one of the job's workers; its rank goes to the spare worker (a recovery).
        code, out = psctl("status", job, "-o", "json")
        placed = json.loads(out)["workers"]
        ports = {open(f"{WORK}/worker-{i}.port").read().strip(): f"worker-{i}" for i in range(3)}
        code, out = psctl("nodes", "-o", "json")
        address = {n["info"]["node_id"]: n["info"]["address"] for n in json.loads(out)["nodes"]}
        victim = next((ports[address[w]] for w in placed if address.get(w) in ports), None)
        if victim is None:
            fail(f"no worker process for {placed} among {ports} / {address}")
        procs[victim].kill()
        print("killed", victim)
        wait_for("a recovery among the job's events",
                 lambda: browser.find_elements(By.CSS_SELECTOR, '#events li[data-class="recovery"]'), 40)
        text = browser.find_element(By.CSS_SELECTOR, '#events li[data-class="recovery"]').text
        print("recovery shown:", text)
        # The jobs table comes from the refresh's first fetch and the events from its last, so
        # the table may count the recovery one refresh later.
        wait_for("the jobs table to count the recovery", lambda: int(
            attr(f'#jobs tr[data-job="{job}"] td[data-recoveries]', "data-recoveries") or 0) >= 1, 10)
        wait_for("the killed worker marked not alive", lambda: any(
            e.get_attribute("data-state") in ("SUSPECT", "DEAD")
            for e in browser.find_elements(By.CSS_SELECTOR, "#nodes tr[data-node]")), 20)
        browser.save_screenshot(f"{OUT}/status_page.png")
        print("screenshot:", f"{OUT}/status_page.png")

        # A scheduler with a token file: the page asks for a token, and a viewer's token opens it.
        import hashlib
        with open(f"{WORK}/tokens", "w") as f:
            f.write(hashlib.sha256(b"viewer-secret").hexdigest() + " vera viewer\n")
        start("secured", [f"{BIN}/scheduler/ps_scheduler", "--listen=127.0.0.1:0",
                          f"--port_file={WORK}/secured.port", f"--db={WORK}/secured.db",
                          f"--token_file={WORK}/tokens", "--http_listen=127.0.0.1:0"])
        port_file("secured")
        secured = wait_for("the secured status page's address", lambda: (
            re.search(r"status page at (http://[0-9.]+:\d+)/", open(f"{WORK}/secured.log").read()) or
            [None, None])[1], 10)
        browser.get(secured + "/")
        wait_for("the page to ask for a token",
                 lambda: browser.find_element(By.ID, "auth").is_displayed(), 15)
        browser.find_element(By.ID, "token").send_keys("viewer-secret")
        browser.find_element(By.ID, "token-save").click()
        wait_for("the page to load with the token", lambda: not browser.find_element(
            By.ID, "auth").is_displayed() and "0 nodes" in browser.find_element(By.ID, "meta").text, 15)
        print("secured page: asked for a token, opened with a viewer's")
    finally:
        browser.quit()
    psctl("cancel", job)
    print("PASS")
finally:
    stop_all()
