"""pscluster's low-level client against two real ps_server processes on loopback: dense and
sparse pulls and pushes with numpy arrays and torch tensors written in place, the job's clock,
bad input refused before anything is sent (servers unchanged), server errors as pscluster.Error
with the gRPC code and message, a task file read as an entrypoint task, progress lines."""
import json
import os
import struct
import threading
import unittest

import numpy as np
import torch

import pscluster
from local_cluster import LocalServers

SERVERS = None


def setUpModule():
    global SERVERS
    SERVERS = LocalServers(n=2).__enter__()


def tearDownModule():
    SERVERS.__exit__(None, None, None)


def new_client(job, **kw):
    c = pscluster.connect(servers=SERVERS.addresses, job_id=job, **kw)
    c.declare(pscluster.dense("w", (300, 7), optimizer=pscluster.Optimizer("sgd", 1.0),
                              init=pscluster.Init("uniform", low=-1, high=1, seed=3)),
              pscluster.dense("b", (5,), optimizer=pscluster.Optimizer("sgd", 0.5),
                              init=pscluster.Init("constant", value=2.0)),
              pscluster.sparse("emb", 4, optimizer=pscluster.Optimizer("sgd", 1.0),
                               init=pscluster.Init("zeros")))
    c.create_tables(consistency="bsp")
    return c


def snapshot(c, keys):
    w = np.empty((300, 7), np.float32)
    b = np.empty(5, np.float32)
    rows = np.empty((len(keys), 4), np.float32)
    c.pull(c.step, dense={"w": w, "b": b}, sparse={"emb": (np.asarray(keys, np.uint64), rows)})
    return w, b, rows


class RoundTrip(unittest.TestCase):
    def test_numpy_dense_and_sparse(self):
        c = new_client("rt-numpy")
        w, b, rows = snapshot(c, [1, 2])
        self.assertTrue(np.all(b == 2.0))
        self.assertTrue(np.all(np.abs(w) <= 1) and w.std() > 0.3, w.std())
        self.assertTrue(np.all(rows == 0))
        gw = np.random.default_rng(0).standard_normal((300, 7)).astype(np.float32)
        keys = np.array([7, 1 << 40, 7], np.uint64)  # duplicate keys add up
        grows = np.arange(12, dtype=np.float32).reshape(3, 4)
        c.push(c.step, dense={"w": gw, "b": np.ones(5, np.float32)}, sparse={"emb": (keys, grows)})
        c.step += 1
        w2, b2, rows2 = snapshot(c, [7, 1 << 40, 99])
        np.testing.assert_allclose(w2, w - gw, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(b2, b - 0.5)
        np.testing.assert_allclose(rows2[0], -(grows[0] + grows[2]))
        np.testing.assert_allclose(rows2[1], -grows[1])
        np.testing.assert_allclose(rows2[2], 0)

    def test_torch_push_pull_in_place(self):
        c = new_client("rt-torch")
        w = torch.zeros(300, 7)
        c.pull(0, dense={"w": w})
        before = w.clone()
        # The pull target is a row of a bigger tensor: the values land in its storage.
        big = torch.zeros(3, 5)
        keys = torch.tensor([3, 4], dtype=torch.int64)
        rows = torch.zeros(2, 4)
        c.push_pull(0, push_dense={"w": torch.full((300, 7), 0.25), "b": torch.ones(5)},
                    push_sparse={"emb": (keys, torch.ones(2, 4))},
                    pull_dense={"w": w, "b": big[1]}, pull_sparse={"emb": (keys, rows)})
        torch.testing.assert_close(w, before - 0.25)
        torch.testing.assert_close(big[1], torch.full((5,), 1.5))
        self.assertTrue(bool((big[0] == 0).all() and (big[2] == 0).all()))
        torch.testing.assert_close(rows, torch.full((2, 4), -1.0))
        # A parameter (requires_grad) is written in place too.
        p = torch.nn.Parameter(torch.zeros(5))
        c.pull(1, dense={"b": p})
        torch.testing.assert_close(p.detach(), torch.full((5,), 1.5))

    def test_push_without_end_of_step_then_end(self):
        c = new_client("rt-steps")
        c.push(0, dense={"b": np.ones(5, np.float32)}, end_of_step=False)
        c.push(0, dense={"b": np.ones(5, np.float32)}, end_of_step=True)
        b = np.empty(5, np.float32)
        c.pull(1, dense={"b": b})
        np.testing.assert_allclose(b, 1.0)  # 2 - 0.5 - 0.5
        self.assertGreaterEqual(c.last_min_clock(), 1)


class Clock(unittest.TestCase):
    def test_bsp_pull_waits_without_the_gil(self):
        # Rank 0's pull of clock 1 waits for rank 1 to end step 0. Rank 1 pushes from this
        # thread while rank 0's pull is parked: it could not if the waiting call held the GIL.
        cs = [pscluster.connect(servers=SERVERS.addresses, job_id="clock", rank=r, num_workers=2,
                                call_timeout_sec=20) for r in range(2)]
        for c in cs:
            c.declare(pscluster.dense("b", (5,), optimizer=pscluster.Optimizer("sgd", 1.0)))
            c.create_tables(consistency="bsp")
        b = np.zeros(5, np.float32)
        done = threading.Event()

        def rank0():
            cs[0].push_pull(0, push_dense={"b": np.ones(5, np.float32)}, pull_dense={"b": b})
            done.set()
        t = threading.Thread(target=rank0)
        t.start()
        self.assertFalse(done.wait(1.0))  # parked: rank 1 has not ended step 0
        np.testing.assert_array_equal(b, 0)
        cs[1].push(0, dense={"b": np.full(5, 2.0, np.float32)})
        t.join()
        np.testing.assert_allclose(b, -3.0)  # both pushes applied before the pull answered


class BadInput(unittest.TestCase):
    def setUp(self):
        self.c = new_client("bad-" + self._testMethodName)
        self.before = snapshot(self.c, [1, 2, 3])

    def assertUnchanged(self):
        for a, b in zip(self.before, snapshot(self.c, [1, 2, 3])):
            np.testing.assert_array_equal(a, b)

    def test_wrong_dtype(self):
        with self.assertRaisesRegex(TypeError, r"table 'w'.*float32.*'d'.*\(300, 7\)"):
            self.c.push(0, dense={"w": np.ones((300, 7))})
        with self.assertRaisesRegex(TypeError, r"table 'b'.*float32"):
            self.c.pull(0, dense={"b": torch.zeros(5, dtype=torch.float64)})
        with self.assertRaisesRegex(TypeError, r"table 'emb': keys must be uint64 or int64"):
            self.c.push(0, sparse={"emb": (np.array([1, 2], np.int32), np.ones((2, 4), np.float32))})
        with self.assertRaisesRegex(TypeError, r"table 'b'.*numpy array"):
            self.c.push(0, dense={"b": [1, 2, 3, 4, 5]})
        self.assertUnchanged()

    def test_wrong_shape(self):
        # A valid push first in the same call: nothing is sent when any entry is bad.
        with self.assertRaisesRegex(ValueError, r"table 'w'.*\(299, 7\).*needs \(300, 7\)"):
            self.c.push(0, dense={"b": np.ones(5, np.float32), "w": np.ones((299, 7), np.float32)})
        with self.assertRaisesRegex(ValueError, r"table 'emb'.*\(2, 4\) for 2 keys"):
            self.c.push(0, sparse={"emb": (np.array([1, 2], np.uint64), np.ones((2, 3), np.float32))})
        with self.assertRaisesRegex(ValueError, r"table 'w'.*not C-contiguous"):
            self.c.pull(0, dense={"w": np.zeros((7, 300), np.float32).T})
        with self.assertRaisesRegex(ValueError, r"table 'emb': key -1 at index 1 is negative"):
            self.c.push(0, sparse={"emb": (np.array([1, -1], np.int64), np.ones((2, 4), np.float32))})
        ro = np.zeros(5, np.float32)
        ro.flags.writeable = False
        with self.assertRaisesRegex(ValueError, r"table 'b': pull target is read-only"):
            self.c.pull(0, dense={"b": ro})
        self.assertUnchanged()

    def test_unknown_table(self):
        with self.assertRaises(pscluster.Error) as e:
            self.c.push(0, dense={"nope": np.ones(5, np.float32)})
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertIn("'nope' is not declared", e.exception.message)
        # Declared here but never created on the servers: the servers' answer.
        self.c.declare(pscluster.dense("late", (3,), optimizer=pscluster.Optimizer("sgd", 1.0)))
        with self.assertRaises(pscluster.Error) as e:
            self.c.push(0, dense={"late": np.ones(3, np.float32), "b": np.ones(5, np.float32)})
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertIn("unknown table 'late'", e.exception.message)
        self.assertUnchanged()

    def test_bad_spec(self):
        with self.assertRaisesRegex(ValueError, "shape"):
            pscluster.dense("z", (0, 3))
        with self.assertRaisesRegex(ValueError, "already declared with another spec"):
            self.c.declare(pscluster.dense("w", (300, 8), optimizer=pscluster.Optimizer("sgd", 1.0)))
        self.c.declare(pscluster.dense("neg", (3,), optimizer=pscluster.Optimizer("sgd", 1.0),
                                       init=pscluster.Init("normal", stddev=-1)))
        with self.assertRaises(pscluster.Error) as e:
            self.c.create_tables()
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("init.stddev", e.exception.message)
        self.assertUnchanged()

    def test_closed(self):
        self.c.close()
        with self.assertRaises(pscluster.Error) as e:
            self.c.pull(0, dense={"b": np.zeros(5, np.float32)})
        self.assertEqual(e.exception.code, "CANCELLED")
        other = new_client(self.c.context.job_id)  # the servers still hold the same values
        for a, b in zip(self.before, snapshot(other, [1, 2, 3])):
            np.testing.assert_array_equal(a, b)


class ServerGone(unittest.TestCase):
    def test_unreachable_server(self):
        with LocalServers(n=1) as one:
            c = pscluster.connect(servers=one.addresses, job_id="gone", call_timeout_sec=3)
            c.declare(pscluster.dense("b", (5,), optimizer=pscluster.Optimizer("sgd", 1.0)))
            c.create_tables()
            one.kill(0)
            with self.assertRaises(pscluster.Error) as e:
                c.pull(0, dense={"b": np.zeros(5, np.float32)})
            self.assertIn(e.exception.code, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
            self.assertIn(one.addresses[0], e.exception.message)


def _varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _field(num, data):  # length-delimited
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _int(num, v):
    return _varint(num << 3) + _varint(v)


class EntrypointContext(unittest.TestCase):
    def test_task_file_and_progress(self):
        job = "task-job"
        shard_map = pscluster._pscluster.round_robin_shard_map(job, SERVERS.addresses)
        optimizer = _int(1, 0) + _varint(2 << 3 | 5) + struct.pack("<f", 0.5)  # SGD lr 0.5
        spec = _field(1, b"tj") + _field(4, optimizer) + _field(7, _int(1, 2)) + _int(12, 32)
        task = (_field(1, job.encode()) + _field(2, spec) + _int(3, 1) + _int(4, 2) +
                _field(6, shard_map) + _int(8, 3))
        path = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "task.pb")
        with open(path, "wb") as f:
            f.write(task)
        r, w = os.pipe()
        env = {"PSCLUSTER_TASK_FILE": path, "PSCLUSTER_PROGRESS_FD": str(w)}
        ctx = pscluster.context_from_env(env)
        self.assertEqual((ctx.job_id, ctx.rank, ctx.num_workers, ctx.start_step), (job, 1, 2, 0))
        self.assertEqual(ctx.attempt, 3)
        self.assertEqual(ctx.task["batch_size"], 32)
        self.assertIn("ASP", ctx.task["consistency"])
        c = pscluster.Client(ctx)
        self.assertIn("learning_rate: 0.5", c.job_optimizer("b").text())
        c.declare(pscluster.dense("b", (5,), optimizer=c.job_optimizer("b"),
                                  init=pscluster.Init("constant", value=1.0)))
        # The scheduler installs a task's shard map; standalone here, so install it once.
        c._c.install_shard_map()
        c.create_tables()  # the task's consistency (ASP) and worker count
        b = np.zeros(5, np.float32)
        c.push_pull(c.step, push_dense={"b": np.ones(5, np.float32)}, pull_dense={"b": b})
        np.testing.assert_allclose(b, 0.5)  # ASP: rank 0 never pushed, the pull does not wait
        os.environ["PSCLUSTER_PROGRESS_FD"] = str(w)
        try:
            self.assertTrue(pscluster.report_progress(6, loss=0.25, epoch=0, examples=192,
                                                      metrics={"accuracy": 0.5}, total_steps=90))
        finally:
            del os.environ["PSCLUSTER_PROGRESS_FD"]
        os.close(w)
        line = os.read(r, 4096).decode()
        self.assertTrue(line.endswith("\n"))
        self.assertEqual(json.loads(line), {"step": 6, "epoch": 0, "examples": 192, "loss": 0.25,
                                            "total_steps": 90, "metrics": {"accuracy": 0.5}})
        self.assertFalse(pscluster.report_progress(7))  # no fd: a no-op
        with open(path, "wb") as f:
            f.write(b"\xff\xff")
        with self.assertRaises(pscluster.Error) as e:
            pscluster.context_from_env({"PSCLUSTER_TASK_FILE": path})
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")


if __name__ == "__main__":
    unittest.main(verbosity=2)
