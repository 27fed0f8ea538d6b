"""Throughput of a PyTorch MLP (784-512-256-10, Fashion-MNIST, batch 512) trained through
pscluster against the same script with no parameter server, and against the C++ worker
(ps_worker standalone) on the same model, all in one run on this machine:

  local      deploy/examples/torch_mlp/train.py --local (torch.optim.Adam in the process)
  pscluster  the same script, 1 worker, 2 ps_server processes on loopback, Adam on the servers,
             gradients pushed during backward (and with --no_overlap: all in step())
  ps_worker  the C++ worker, standalone, the same MLP and servers (job YAML written here)

The runs are interleaved round by round (local, pscluster, pscluster --no_overlap, ps_worker),
and each ratio is the median over the rounds of that round's ratio to its own `local` run, so
both sides of a ratio saw the same load on a shared machine. Prints every round's samples/s and
the median ratios. Every run uses one compute thread.
Usage: torch_mlp_bench.py [STEPS [ROUNDS]]  (default 300 steps of 512 examples per run, 3 rounds)."""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from local_cluster import LocalServers, runfiles_root

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
BATCH = 512
HIDDEN = "512,256"


def script():
    p = os.path.join(runfiles_root(), "deploy", "examples", "torch_mlp", "train.py")
    if os.path.exists(p):
        return p
    return os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "examples", "torch_mlp",
                        "train.py")


def run_py(*args):
    cmd = [sys.executable, script(), f"--batch_size={BATCH}", f"--hidden={HIDDEN}", "--epochs=10",
           f"--max_steps={STEPS}", "--threads=1"] + list(args)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{cmd} exited {out.returncode}:\n{out.stdout[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_cpp(servers, work):
    job = os.path.join(work, "mlp.yaml")
    with open(job, "w") as f:
        f.write(f"""name: torch-mlp-bench-cpp
model: {{kind: mlp, hidden: [{HIDDEN}], input_dim: 784, num_classes: 10, activation: relu}}
dataset: {{name: fashion_mnist}}
optimizer: {{kind: adam, learning_rate: 0.001}}
consistency: {{mode: bsp}}
num_servers: 2
num_workers: 1
device: cpu
epochs: 1
batch_size: {BATCH}
seed: 1
""")
    cmd = [os.path.join(runfiles_root(), "worker", "ps_worker"), f"--job={job}",
           f"--servers={','.join(servers)}", "--device=cpu", "--cpu_threads=1"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.search(r"steps (\d+)\s+test accuracy ([0-9.]+).*?([0-9.]+) samples/s", out.stdout)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"{cmd} exited {out.returncode}:\n{out.stdout[-3000:]}")
    return {"steps": int(m.group(1)), "test_accuracy": float(m.group(2)),
            "samples_per_sec": float(m.group(3))}


def main():
    rounds = []
    with LocalServers(n=2) as s:
        servers = ",".join(s.addresses)
        for i in range(ROUNDS):
            r = {"local": run_py("--local")}
            r["pscluster"] = run_py(f"--servers={servers}", f"--job_id=bench-overlap-{i}")
            r["pscluster_no_overlap"] = run_py(f"--servers={servers}", f"--job_id=bench-step-{i}",
                                               "--no_overlap")
            with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as work:
                r["ps_worker_cpp"] = run_cpp(s.addresses, work)
            rounds.append(r)
            print(f"round {i + 1}: " + ", ".join(
                f"{name} {x['samples_per_sec']:.0f}/s" for name, x in r.items()), flush=True)
    print(f"torch_mlp_bench: MLP 784-{HIDDEN.replace(',', '-')}-10, batch {BATCH}, "
          f"{STEPS} steps per Python run (ps_worker: 1 epoch), 1 thread, 2 servers, "
          f"{ROUNDS} rounds")
    print(f"{'run':<22}{'median samples/s':>18}{'median ratio to local':>23}{'test acc':>10}")
    for name in rounds[0]:
        rate = statistics.median(r[name]["samples_per_sec"] for r in rounds)
        ratio = statistics.median(r[name]["samples_per_sec"] / r["local"]["samples_per_sec"]
                                  for r in rounds)
        print(f"{name:<22}{rate:>18.0f}{ratio:>23.2f}{rounds[-1][name]['test_accuracy']:>10.4f}")


if __name__ == "__main__":
    main()
