"""PyTorch on the pscluster parameter servers.

    import pscluster, pscluster.torch as pst
    client = pscluster.connect(...)
    opt = pst.DistributedOptimizer(model, client, optimizer=pscluster.Optimizer("adam", 1e-3))
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Each parameter is a dense table updated by the servers' optimizer (the job's, in an entrypoint
task). During backward every gradient is pushed as soon as autograd produces it (a tensor hook),
on a background thread, while the rest of backward runs; step() waits for those pushes, ends the
step on every server and pulls the next parameters in one round trip (PushPull), writing them
into the parameters in place. Embedding and EmbeddingBag keep their rows in a sparse table:
forward pulls the rows of the batch's unique keys only, backward pushes their gradient rows.
"""
import concurrent.futures
import threading

import torch

import pscluster

__all__ = ["DistributedOptimizer", "Embedding", "EmbeddingBag", "init_like"]


def init_like(t, seed=0):
    """A server initializer close to the tensor's current values: CONSTANT when all are equal,
    UNIFORM(-m, m) when they look uniform around 0 (max|t| / std < 2.5: torch's Linear and Conv
    defaults), else NORMAL(mean, std). The servers draw their own values from it."""
    t = t.detach().double()
    if t.numel() == 0 or bool((t == t.flatten()[0]).all()):
        return pscluster.Init("constant", value=float(t.flatten()[0]) if t.numel() else 0.0)
    m, std = float(t.abs().max()), float(t.std()) if t.numel() > 1 else 0.0
    if std > 0 and m / std < 2.5:
        return pscluster.Init("uniform", low=-m, high=m, seed=seed)
    return pscluster.Init("normal", mean=float(t.mean()), stddev=max(std, 1e-12), seed=seed)


class _StepPushes:
    """Gradient pushes of the current step running on a background thread (one per client)."""

    def __init__(self, client):
        self.client = client
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                          thread_name_prefix="pscluster-push")
        self.lock = threading.Lock()
        self.pending = []

    def submit(self, step, dense=None, sparse=None):
        f = self.pool.submit(self.client.push, step, dense, sparse, False)
        with self.lock:
            self.pending.append(f)

    def wait(self):
        with self.lock:
            pending, self.pending = self.pending, []
        for f in pending:
            f.result()  # Raises the push's pscluster.Error.


def _pushes(client):
    p = getattr(client, "_torch_pushes", None)
    if p is None:
        p = client._torch_pushes = _StepPushes(client)
    return p


def _view(t):
    return t.detach().numpy()


class DistributedOptimizer:
    """Trains `model`'s parameters (or an iterable of (name, parameter)) on the servers.

    optimizer: pscluster.Optimizer for every table (default: the job's, in an entrypoint task);
    prefix: table names are prefix + parameter name; init: "auto" (init_like) or a function
    (name, tensor) -> pscluster.Init; overlap: push each gradient while backward runs (False:
    push them all in step(), which also allows accumulating gradients over several backward
    passes); grad_scale: multiplies every pushed gradient (e.g. 1 / num_workers); consistency:
    for create_tables (default: the task's, else BSP).

    Creating it declares and creates the tables (idempotent across workers) and pulls the
    current parameters into the model. Every worker must build the model the same way (same
    seed, or the same init=): a table created with other initial values is refused by the
    servers (pscluster.Error ALREADY_EXISTS naming it). Create Embedding / EmbeddingBag modules
    first: their sparse tables are created here with the rest."""

    def __init__(self, model, client, optimizer=None, prefix="", init="auto", overlap=True,
                 grad_scale=1.0, seed=0, transport=None, consistency=None):
        named = model.named_parameters() if isinstance(model, torch.nn.Module) else model
        self.client = client
        self.params = []  # (table, parameter)
        self.overlap = overlap
        self.grad_scale = float(grad_scale)
        self._fired = {}
        specs = []
        for i, (name, p) in enumerate(named):
            if not p.requires_grad:
                continue
            if p.dtype != torch.float32 or p.device.type != "cpu" or not p.is_contiguous():
                raise TypeError(f"parameter '{name}': pscluster trains contiguous float32 CPU "
                                f"parameters, got {p.dtype} on {p.device}")
            table = prefix + name
            opt = optimizer or client.job_optimizer(table)
            if opt is None:
                raise ValueError("DistributedOptimizer: give optimizer=pscluster.Optimizer(...) "
                                 "(outside an entrypoint task there is no job optimizer)")
            ini = init_like(p, seed + i) if init == "auto" else init(name, p)
            shape = tuple(p.shape) or (1,)
            specs.append(pscluster.dense(table, shape, optimizer=opt, init=ini,
                                         transport=transport))
            self.params.append((table, p))
        if not self.params:
            raise ValueError("DistributedOptimizer: no parameter requires grad")
        client.declare(*specs)
        client.create_tables(consistency=consistency)
        client.pull(client.step, dense={t: _view(p) for t, p in self.params})
        self._pushes = _pushes(client)
        self._hooks = []
        if overlap:
            for table, p in self.params:
                self._hooks.append(p.register_hook(self._hook(table)))

    def _hook(self, table):
        def hook(grad):
            if self._fired.get(table):
                raise RuntimeError(
                    f"parameter '{table}' got a second gradient in step {self.client.step}: "
                    "accumulating gradients over several backward passes needs overlap=False")
            self._fired[table] = True
            g = grad.detach()
            if self.grad_scale != 1.0:
                g = g * self.grad_scale
            g = g.to(torch.float32).contiguous()
            self._pushes.submit(self.client.step, dense={table: g})
            return grad
        return hook

    def zero_grad(self, set_to_none=True):
        for _, p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self):
        """Ends the step: waits for the gradients pushed during backward (or pushes p.grad of
        every parameter, overlap=False), then pulls the parameters of the next step."""
        step = self.client.step
        push = {}
        if self.overlap:
            self._pushes.wait()
        else:
            self._pushes.wait()
            for table, p in self.params:
                if p.grad is not None:
                    g = p.grad.detach()
                    if self.grad_scale != 1.0:
                        g = g * self.grad_scale
                    push[table] = g.contiguous()
        self._fired.clear()
        self.client.push_pull(step, push_dense=push,
                              pull_dense={t: _view(p) for t, p in self.params})
        self.client.step = step + 1

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []


class _SparseRows(torch.nn.Module):
    def __init__(self, client, name, embedding_dim, num_embeddings, optimizer, init, transport):
        super().__init__()
        opt = optimizer or client.job_optimizer(name)
        if opt is None:
            raise ValueError(f"embedding '{name}': give optimizer=pscluster.Optimizer(...) "
                             "(outside an entrypoint task there is no job optimizer)")
        self.client, self.table, self.dim = client, name, int(embedding_dim)
        self.num_embeddings = num_embeddings
        client.declare(pscluster.sparse(name, embedding_dim, optimizer=opt,
                                        init=init or pscluster.Init("normal", stddev=1.0),
                                        key_space=num_embeddings or 0, transport=transport))
        self._pushes = _pushes(client)

    def _rows(self, input):
        """(rows leaf of the unique keys, index of each input in them)."""
        if input.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"embedding '{self.table}': input must be int64 keys, got {input.dtype}")
        flat = input.reshape(-1).to(torch.int64)
        if flat.numel() and int(flat.min()) < 0:
            raise ValueError(f"embedding '{self.table}': negative key {int(flat.min())}")
        if self.num_embeddings and flat.numel() and int(flat.max()) >= self.num_embeddings:
            raise ValueError(f"embedding '{self.table}': key {int(flat.max())} is not below "
                             f"num_embeddings {self.num_embeddings}")
        keys, inverse = torch.unique(flat, return_inverse=True)
        keys = keys.contiguous()
        rows = torch.empty(keys.numel(), self.dim, dtype=torch.float32)
        self.client.pull(self.client.step, sparse={self.table: (keys, rows)})
        if torch.is_grad_enabled() and self.training:
            rows.requires_grad_(True)
            step = self.client.step

            def hook(grad):
                self._pushes.submit(step, sparse={self.table: (keys, grad.detach().contiguous())})
                return grad
            rows.register_hook(hook)
        return rows, inverse.reshape(input.shape)


class Embedding(_SparseRows):
    """torch.nn.Embedding over a sparse table `name` (rows of embedding_dim floats). Its rows
    are trained by the servers' optimizer; push them with a DistributedOptimizer's step() on the
    same client (it ends the step). num_embeddings: keys must be below it (None: any int64 >= 0)."""

    def __init__(self, num_embeddings, embedding_dim, client, name, optimizer=None, init=None,
                 transport=None):
        super().__init__(client, name, embedding_dim, num_embeddings, optimizer, init, transport)

    def forward(self, input):
        rows, idx = self._rows(input)
        return torch.nn.functional.embedding(idx, rows)


class EmbeddingBag(_SparseRows):
    """torch.nn.EmbeddingBag (mode "mean" or "sum") over a sparse table `name`: forward(input,
    offsets) with 1-D input and offsets, or a 2-D input of equal bags."""

    def __init__(self, num_embeddings, embedding_dim, client, name, mode="mean", optimizer=None,
                 init=None, transport=None):
        if mode not in ("mean", "sum"):
            raise ValueError(f"EmbeddingBag '{name}': mode must be 'mean' or 'sum', got '{mode}'")
        super().__init__(client, name, embedding_dim, num_embeddings, optimizer, init, transport)
        self.mode = mode

    def forward(self, input, offsets=None, per_sample_weights=None):
        rows, idx = self._rows(input)
        return torch.nn.functional.embedding_bag(idx, rows, offsets, mode=self.mode,
                                                 per_sample_weights=per_sample_weights)
