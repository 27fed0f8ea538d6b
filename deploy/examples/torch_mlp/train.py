#!/usr/bin/env python3
"""A PyTorch MLP on Fashion-MNIST trained through the pscluster parameter servers.

Three ways to run it (PYTHONPATH=bazel-bin/python/pkg, or the wheel installed):
  * as a job's entrypoint (job.yaml here): ps_worker starts it per rank; rank, workers, servers,
    epochs, batch size, seed and the server-side optimizer come from the task
    (PSCLUSTER_TASK_FILE), progress goes to the scheduler (psctl status);
  * standalone, against running ps_server daemons:
        train.py --servers=HOST:PORT,HOST:PORT --job_id=mine --rank=0 --num_workers=2
    (start every rank with the same --job_id; the optimizer is --lr with Adam on the servers);
  * without parameter servers (--local): the same model with torch.optim.Adam, the baseline.
Prints one JSON line at the end: {"test_accuracy": ..., "samples_per_sec": ..., ...}.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir):
    def split(prefix):
        x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
        y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
        return x.reshape(len(x), -1).astype(np.float32) / 255.0, y.astype(np.int64)
    xtr, ytr = split("train")
    xte, yte = split("t10k")
    mean, std = xtr.mean(), xtr.std()
    return (xtr - mean) / std, ytr, (xte - mean) / std, yte


def mlp(hidden, seed):
    torch.manual_seed(seed)
    layers, width = [], 784
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(x[i:i + 2000])).argmax(1)
                          for i in range(0, len(x), 2000)])
    model.train()
    return float((pred.numpy() == y).mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--servers", default="", help="standalone: comma-separated host:port of ps_server")
    ap.add_argument("--job_id", default="torch-mlp")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--num_workers", type=int, default=1)
    ap.add_argument("--local", action="store_true", help="no parameter servers: torch.optim.Adam")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch_size", type=int, default=64, help="examples per worker per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max_steps", type=int, default=0, help="stop after this many steps (0 = all)")
    ap.add_argument("--consistency", default="bsp", help="standalone: bsp, asp or ssp:N")
    ap.add_argument("--no_aggregate", action="store_true",
                    help="standalone BSP: apply each worker's push on its own (default: the servers "
                         "sum the workers' gradients of a step, each scaled by 1/num_workers, and "
                         "apply the mean once, as one process with batch_size * num_workers would)")
    ap.add_argument("--no_overlap", action="store_true", help="push gradients in step(), not in backward")
    ap.add_argument("--data_dir", default=DATA_DIR)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    client = None
    rank, workers = a.rank, a.num_workers
    epochs, batch, seed = a.epochs, a.batch_size, a.seed
    if not a.local:
        import pscluster
        import pscluster.torch as pst
        if a.servers:
            client = pscluster.connect(servers=a.servers.split(","), job_id=a.job_id, rank=rank,
                                       num_workers=workers)
        else:
            client = pscluster.connect()  # an entrypoint task: everything from the task
            t = client.context.task
            rank, workers = client.context.rank, client.context.num_workers
            epochs, batch, seed = t["epochs"] or epochs, t["batch_size"] or batch, t["seed"] or seed
    xtr, ytr, xte, yte = load(a.data_dir)
    model = mlp([int(h) for h in a.hidden.split(",") if h], seed)
    if client is None:
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    else:
        # Outside a task the servers run Adam with --lr; in a task the job's optimizer.
        task = client.context.task
        if task:
            server_opt, consistency = None, None  # the job's
            aggregate = "aggregate: true" in task["consistency"]
            ranks = task["training_ranks"]
        else:
            server_opt = pscluster.Optimizer("adam", a.lr)
            aggregate = a.consistency == "bsp" and not a.no_aggregate
            consistency = pscluster.consistency(a.consistency, aggregate=aggregate) \
                if a.consistency == "bsp" else a.consistency
            ranks = workers
        opt = pst.DistributedOptimizer(
            model, client, optimizer=server_opt, seed=seed, overlap=not a.no_overlap,
            consistency=consistency, grad_scale=1.0 / ranks if aggregate else 1.0)

    # This rank's part of the data: every workers-th example of a fixed shuffle. Every rank runs
    # the same number of steps (the smallest part's), as BSP needs.
    order = np.random.default_rng(seed).permutation(len(xtr))
    part = order[rank::workers]
    steps_per_epoch = (len(xtr) // workers) // batch
    total_steps = epochs * steps_per_epoch
    if a.max_steps:
        total_steps = min(total_steps, a.max_steps)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed + 1000 + rank)
    # A rank handed over to a new attempt resumes at the step the servers have for it
    # (client.step = the task's start_step), with the batches it would have read from there on.
    start = client.step if client is not None else 0
    step, examples, t0 = start, 0, time.perf_counter()
    loss_sum, loss_n = 0.0, 0
    done = start >= total_steps
    for epoch in range(epochs):
        if done:
            break
        idx = part[rng.permutation(len(part))]
        for s in range(steps_per_epoch):
            if epoch * steps_per_epoch + s < start:
                continue
            b = idx[s * batch:(s + 1) * batch]
            x, y = torch.from_numpy(xtr[b]), torch.from_numpy(ytr[b])
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            examples += len(b)
            loss_sum, loss_n = loss_sum + float(loss), loss_n + 1
            if client is not None and step % 50 == 0:
                pscluster.report_progress(client.step, loss=loss_sum / loss_n, epoch=epoch,
                                          examples=examples, total_steps=total_steps)
                loss_sum, loss_n = 0.0, 0
            if a.max_steps and step >= a.max_steps:
                done = True
                break
    elapsed = time.perf_counter() - t0
    acc = accuracy(model, xte, yte)
    if client is not None:
        pscluster.report_progress(client.step, epoch=epoch, examples=examples,
                                  metrics={"test_accuracy": acc})
    out = {"rank": rank, "workers": workers, "steps": step, "start_step": start, "epochs": epochs, "batch_size": batch,
           "test_accuracy": acc, "samples_per_sec": examples / elapsed, "seconds": elapsed,
           "mode": "local" if client is None else "pscluster"}
    if client is not None:
        out["client_stats"] = client.stats()
        client.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
