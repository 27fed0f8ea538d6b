"""pscluster: train with the pscluster parameter servers from Python.

    import pscluster
    client = pscluster.connect()                      # inside an entrypoint task (PSCLUSTER_TASK_FILE)
    client = pscluster.connect(servers=["127.0.0.1:7001", "127.0.0.1:7002"], job_id="mine")
    client.declare(pscluster.dense("w", (784, 10), optimizer=pscluster.Optimizer("adam", 1e-3)))
    client.create_tables()
    client.pull(client.step, dense={"w": w})          # float32 numpy arrays / CPU torch tensors
    client.push_pull(client.step, push_dense={"w": g}, pull_dense={"w": w}); client.step += 1
    pscluster.report_progress(step, loss=0.3)

Arrays are read and written in place (no copies); anything else than a C-contiguous float32
array of the table's size (uint64/int64 for keys) is refused with TypeError or ValueError naming
the table, before anything is sent. Errors from the servers raise pscluster.Error, with `.code`
the gRPC status code's name ("INVALID_ARGUMENT", "NOT_FOUND", ...) and `.message` the server's.
"""
import json
import os

from . import _pscluster
from .specs import Init, Optimizer, dense, sparse, consistency

__all__ = ["Error", "Client", "Context", "connect", "context_from_env", "report_progress",
           "dense", "sparse", "consistency", "Optimizer", "Init"]
__version__ = "0.1.0"


class Error(Exception):
    """A call to the servers failed: `.code` is the status code's name, `.message` the reason."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


_pscluster._set_error_class(Error)


class Context:
    """Who this process is in its job: job id, rank, workers, shard map, credentials, spec.

    From an entrypoint task (context_from_env) or given explicitly (servers=...)."""

    def __init__(self, job_id, rank=0, num_workers=1, shard_map=None, servers=None, attempt=0,
                 start_step=0, lead_rank=0, scheduler="", num_virtual_shards=0, tls_ca="",
                 tls_cert="", tls_key="", token="", task=None, data_secret=b""):
        if shard_map is None:
            if not servers:
                raise ValueError("give servers=[host:port, ...] (or run as an entrypoint task)")
            shard_map = _pscluster.round_robin_shard_map(job_id, list(servers), num_virtual_shards)
            self.standalone = True
        else:
            self.standalone = False
        if not 0 <= rank < num_workers:
            raise ValueError(f"rank {rank} is not in [0, num_workers={num_workers})")
        self.job_id, self.rank, self.num_workers = job_id, rank, num_workers
        self.shard_map, self.attempt, self.start_step = shard_map, attempt, start_step
        self.lead_rank, self.scheduler = lead_rank, scheduler
        self.tls_ca, self.tls_cert, self.tls_key, self.token = tls_ca, tls_cert, tls_key, token
        # The job's data secret (from the task): proven on the data connections to its servers.
        self.data_secret = data_secret
        # The task's job spec (read_task's dict: epochs, batch_size, seed, consistency, optimizer,
        # table_optimizers, ...); None outside a task.
        self.task = task


def _read_text(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as e:
        raise Error("INVALID_ARGUMENT", f"{what} {path}: {e.strerror}") from None


def context_from_env(env=None):
    """The context of an entrypoint task, from PSCLUSTER_TASK_FILE and friends; None outside one."""
    env = os.environ if env is None else env
    path = env.get("PSCLUSTER_TASK_FILE")
    if not path:
        return None
    t = _pscluster.read_task(path)
    token_file = env.get("PSCLUSTER_TOKEN_FILE", "")
    return Context(t["job_id"], rank=t["rank"], num_workers=t["num_workers"],
                   shard_map=t["shard_map"], attempt=t["attempt"], start_step=t["start_step"],
                   lead_rank=t["lead_rank"], scheduler=env.get("PSCLUSTER_SCHEDULER", ""),
                   tls_ca=env.get("PSCLUSTER_TLS_CA", ""), tls_cert=env.get("PSCLUSTER_TLS_CERT", ""),
                   tls_key=env.get("PSCLUSTER_TLS_KEY", ""),
                   token=_read_text(token_file, "PSCLUSTER_TOKEN_FILE") if token_file else "",
                   task=t, data_secret=t["data_secret"])


def _pairs(d):
    return list(d.items()) if d else []


def _triples(d):
    return [(name, keys, rows) for name, (keys, rows) in d.items()] if d else []


def _buf(x):
    """A torch tensor as a numpy view of its memory (no copy); anything else as it is."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise TypeError(f"tensor on {x.device}: pscluster reads and writes CPU tensors")
        return x.detach().numpy()
    return x


def _bufs2(d):
    return {k: _buf(v) for k, v in d.items()} if d else None


def _bufs3(d):
    return {k: (_buf(a), _buf(b)) for k, (a, b) in d.items()} if d else None


class Client:
    """Pulls and pushes a job's tables on its servers (one PsClient; thread-safe).

    `step` is this worker's clock: the step about to be computed. Pull with clock=step, push
    the gradients of `step`, then advance it (push_pull does both and the caller adds 1)."""

    def __init__(self, context, call_timeout_sec=60.0, data_transport="auto"):
        self.context = context
        self.step = context.start_step
        self._c = _pscluster.Client(context.job_id, context.rank, context.attempt,
                                    context.shard_map, context.scheduler, context.tls_ca,
                                    context.tls_cert, context.tls_key, context.token,
                                    call_timeout_sec, data_transport, context.data_secret)
        self._specs = {}

    # Tables -------------------------------------------------------------------------------------
    def declare(self, *specs):
        """Declares tables (pscluster.dense / pscluster.sparse); again with the same spec: no-op."""
        for s in specs:
            self._c.declare(s.text())
            self._specs[s.name] = s

    def table(self, name):
        return self._specs[name]

    def job_optimizer(self, table=None):
        """The job's server-side optimizer for `table` (the task's spec), or None outside a task."""
        t = self.context.task
        if t is None:
            return None
        text = t["table_optimizers"].get(table, t["optimizer"]) if table else t["optimizer"]
        return Optimizer.from_text(text)

    def create_tables(self, consistency=None, checkpoint_every_steps=None, checkpoint_dir=None):
        """Creates the declared tables on every server (idempotent; every worker may call it).

        consistency: pscluster.consistency(...) or "bsp"/"asp"/"ssp:<staleness>"; default the
        task's (BSP outside a task). A standalone context first installs its shard map."""
        t = self.context.task
        if consistency is None:
            consistency = t["consistency"] if t else "mode: BSP"
        else:
            consistency = _consistency_text(consistency)
        if checkpoint_every_steps is None:
            checkpoint_every_steps = t["checkpoint_every_steps"] if t else 0
        if checkpoint_dir is None:
            checkpoint_dir = t["checkpoint_dir"] if t else ""
        if self.context.standalone:
            self._c.install_shard_map()
        self._c.create_tables(consistency, self.context.num_workers, checkpoint_every_steps,
                              checkpoint_dir)

    # Data plane ---------------------------------------------------------------------------------
    def pull(self, clock, dense=None, sparse=None):
        """Reads tables as of `clock` into the given arrays: dense={name: array},
        sparse={name: (keys, rows)} (rows: len(keys) x row_width float32)."""
        self._c.pull(clock, _pairs(_bufs2(dense)), _triples(_bufs3(sparse)))

    def push(self, step, dense=None, sparse=None, end_of_step=True):
        """Pushes gradients of `step`; end_of_step=False leaves the step open for more pushes."""
        self._c.push(step, _pairs(_bufs2(dense)), _triples(_bufs3(sparse)), end_of_step)

    def push_pull(self, step, push_dense=None, push_sparse=None, pull_dense=None, pull_sparse=None):
        """Push of `step` (ending it) and pull at clock step + 1, in one round trip per server."""
        self._c.push_pull(step, _pairs(_bufs2(push_dense)), _triples(_bufs3(push_sparse)),
                          _pairs(_bufs2(pull_dense)), _triples(_bufs3(pull_sparse)))

    # Control ------------------------------------------------------------------------------------
    def checkpoint(self, dir=""):
        return self._c.checkpoint(dir)

    def server_statuses(self):
        return self._c.server_statuses()

    def drop_job(self):
        self._c.drop_job()

    def last_min_clock(self):
        return self._c.last_min_clock()

    def stats(self):
        return self._c.stats()

    def close(self):
        """Fails calls in flight and every later call with Error("CANCELLED")."""
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _consistency_text(s):
    return consistency(s).text() if isinstance(s, str) else s.text()  # a specs.Consistency


def connect(servers=None, job_id="pscluster-python", rank=0, num_workers=1, num_virtual_shards=0,
            call_timeout_sec=60.0, data_transport="auto", **creds):
    """A Client: the entrypoint task's (PSCLUSTER_TASK_FILE set and no servers given), or a
    standalone one over `servers` (host:port list) with an explicit job id, rank and size.
    creds: tls_ca, tls_cert, tls_key, token (standalone only)."""
    ctx = context_from_env() if servers is None else None
    if ctx is None:
        if servers is None:
            raise ValueError("pscluster.connect: not in an entrypoint task (no PSCLUSTER_TASK_FILE);"
                             " give servers=[host:port, ...]")
        ctx = Context(job_id, rank=rank, num_workers=num_workers, servers=servers,
                      num_virtual_shards=num_virtual_shards, **creds)
    return Client(ctx, call_timeout_sec=call_timeout_sec, data_transport=data_transport)


def report_progress(step, loss=None, epoch=None, examples=None, metrics=None, total_steps=None):
    """Reports the task's progress to its worker (one JSON line on PSCLUSTER_PROGRESS_FD), which
    forwards it to the scheduler (psctl status: step of total_steps, loss, metrics["accuracy"]
    as train accuracy, samples/s from examples). A no-op outside an entrypoint task."""
    fd = os.environ.get("PSCLUSTER_PROGRESS_FD")
    if not fd:
        return False
    line = {"step": int(step)}
    if epoch is not None:
        line["epoch"] = int(epoch)
    if examples is not None:
        line["examples"] = int(examples)
    if loss is not None:
        line["loss"] = float(loss)
    if total_steps is not None:
        line["total_steps"] = int(total_steps)
    if metrics:
        line["metrics"] = {str(k): float(v) for k, v in metrics.items()}
    data = (json.dumps(line) + "\n").encode()
    while data:
        data = data[os.write(int(fd), data):]
    return True
