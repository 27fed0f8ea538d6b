"""deploy/examples/torch_mlp/train.py through 2 real ps_server processes and 2 worker processes
(standalone: explicit servers, BSP summing both workers' gradients of a step, Adam on the
servers, gradients pushed during backward), against the same script in one process with
torch.optim.Adam and the same examples per step (128): the cluster's test accuracy is at
least 0.88 and within 0.5 points of the baseline's. Usage: torch_mlp_test.py [EPOCHS]."""
import json
import os
import subprocess
import sys

from local_cluster import LocalServers, runfiles_root

EPOCHS = sys.argv[1] if len(sys.argv) > 1 else "8"


def train_cmd(*args):
    script = os.path.join(runfiles_root(), "deploy", "examples", "torch_mlp", "train.py")
    if not os.path.exists(script):
        script = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "examples",
                              "torch_mlp", "train.py")
    return [sys.executable, script, f"--epochs={EPOCHS}"] + list(args)


def result(p):
    out, _ = p.communicate()
    if p.returncode != 0:
        raise AssertionError(f"{p.args} exited {p.returncode}:\n{out[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main():
    with LocalServers(n=2) as servers:
        workers = [subprocess.Popen(
            train_cmd(f"--servers={','.join(servers.addresses)}", "--job_id=mlp-test",
                      f"--rank={r}", "--num_workers=2", "--batch_size=64"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        cluster = [result(p) for p in workers]
    # The baseline after the cluster run: both get the machine's cores the same way.
    # The same examples per step: 2 workers x 64 summed by the servers (BSP aggregate) = 128.
    local = result(subprocess.Popen(train_cmd("--local", "--batch_size=128"),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for r in cluster + [local]:
        print(json.dumps(r))
    # Under BSP both ranks end with the same parameters.
    assert cluster[0]["test_accuracy"] == cluster[1]["test_accuracy"], cluster
    acc, base = cluster[0]["test_accuracy"], local["test_accuracy"]
    print(f"torch_mlp_test: cluster (2 servers, 2 workers) test accuracy {acc:.4f}, "
          f"one process with torch.optim.Adam {base:.4f}, difference {100 * (acc - base):+.2f} points")
    assert acc >= 0.88, f"cluster test accuracy {acc:.4f} < 0.88"
    assert acc >= base - 0.005, f"cluster {acc:.4f} more than 0.5 points below baseline {base:.4f}"


if __name__ == "__main__":
    main()
