"""Table specs, optimizers, initializers and consistency, as pscluster.v1 messages in protobuf
text format (proto/job.proto): what Client.declare and Client.create_tables send."""
import re

_OPTIMIZERS = {"sgd": "SGD", "momentum": "MOMENTUM", "adagrad": "ADAGRAD", "adam": "ADAM"}
_INITS = {"zeros": "ZEROS", "constant": "CONSTANT", "uniform": "UNIFORM", "normal": "NORMAL",
          "glorot_uniform": "GLOROT_UNIFORM", "he_normal": "HE_NORMAL"}
_OPT_FIELDS = {"learning_rate", "weight_decay", "momentum", "nesterov", "beta1", "beta2",
               "epsilon", "decoupled_weight_decay", "initial_accumulator", "lr_schedule",
               "lr_decay_steps", "lr_min_ratio", "lr_warmup_steps"}
_INIT_FIELDS = {"value", "low", "high", "mean", "stddev", "seed"}


def _fields(fields, allowed, what):
    out = []
    for k, v in fields.items():
        if k not in allowed:
            raise ValueError(f"{what}: unknown field '{k}' (one of {sorted(allowed)})")
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, str):
            v = v.upper()  # enums (lr_schedule)
        out.append(f"{k}: {v}")
    return " ".join(out)


class Optimizer:
    """A server-side update rule: Optimizer("adam", learning_rate=1e-3, weight_decay=...)."""

    def __init__(self, kind="sgd", learning_rate=0.01, **fields):
        if kind.lower() not in _OPTIMIZERS:
            raise ValueError(f"optimizer '{kind}': one of {sorted(_OPTIMIZERS)}")
        if not learning_rate > 0:
            raise ValueError(f"optimizer '{kind}': learning_rate must be > 0, got {learning_rate}")
        self._text = f"kind: {_OPTIMIZERS[kind.lower()]} learning_rate: {learning_rate} " + \
            _fields(fields, _OPT_FIELDS, f"optimizer '{kind}'")

    @classmethod
    def from_text(cls, text):
        o = cls.__new__(cls)
        o._text = text
        return o

    def text(self):
        return self._text


class Init:
    """A table's initial values: Init("uniform", low=-0.1, high=0.1, seed=1), Init("zeros"), ..."""

    def __init__(self, kind="zeros", **fields):
        if kind.lower() not in _INITS:
            raise ValueError(f"initializer '{kind}': one of {sorted(_INITS)}")
        self._text = f"kind: {_INITS[kind.lower()]} " + _fields(fields, _INIT_FIELDS,
                                                                 f"initializer '{kind}'")

    def text(self):
        return self._text


class TableSpec:
    def __init__(self, name, text, kind, shape=None, row_width=None):
        self.name, self._text, self.kind = name, text, kind
        self.shape, self.row_width = shape, row_width

    def text(self):
        return self._text


_NAME = re.compile(r"[A-Za-z0-9_./-]{1,128}")


def _check_name(name):
    if not _NAME.fullmatch(name):
        raise ValueError(f"table name '{name}': use 1-128 of [A-Za-z0-9_./-]")


def _common(optimizer, init, transport):
    text = ""
    if init is not None:
        text += f" init {{ {init.text()} }}"
    if optimizer is not None:
        text += f" optimizer {{ {optimizer.text()} }}"
    if transport:
        t = {"float32": "DT_FLOAT32", "float16": "DT_FLOAT16", "bfloat16": "DT_BFLOAT16"}.get(transport)
        if t is None:
            raise ValueError(f"transport '{transport}': float32, float16 or bfloat16")
        text += f" compression {{ transport: {t} }}"
    return text


def dense(name, shape, optimizer=None, init=None, block_elems=0, transport=None):
    """A dense table: a float32 tensor of `shape`, cut into blocks of block_elems (0 = 65536)."""
    _check_name(name)
    shape = tuple(int(d) for d in shape)
    if not shape or any(d <= 0 for d in shape):
        raise ValueError(f"table '{name}': shape {shape} needs dimensions > 0")
    dims = " ".join(f"dims: {d}" for d in shape)
    text = (f'name: "{name}" kind: DENSE dtype: DT_FLOAT32 shape {{ {dims} }} '
            f"block_elems: {int(block_elems)}" + _common(optimizer, init, transport))
    return TableSpec(name, text, "dense", shape=shape)


def sparse(name, row_width, optimizer=None, init=None, key_space=0, transport=None):
    """A sparse table: rows of row_width floats keyed by uint64 (< key_space when > 0)."""
    _check_name(name)
    if int(row_width) <= 0:
        raise ValueError(f"table '{name}': row_width must be > 0")
    text = (f'name: "{name}" kind: SPARSE dtype: DT_FLOAT32 row_width: {int(row_width)} '
            f"key_space: {int(key_space)}" + _common(optimizer, init, transport))
    return TableSpec(name, text, "sparse", row_width=int(row_width))


class Consistency:
    def __init__(self, text):
        self._text = text

    def text(self):
        return self._text


def consistency(mode="bsp", staleness=0, aggregate=False):
    """BSP (optionally aggregating the workers' pushes of a step), SSP with a staleness bound,
    or ASP. mode may also be written "ssp:3"."""
    if ":" in mode:
        mode, s = mode.split(":", 1)
        staleness = int(s)
    m = mode.lower()
    if m not in ("bsp", "ssp", "asp"):
        raise ValueError(f"consistency '{mode}': bsp, ssp or asp")
    if aggregate and m != "bsp":
        raise ValueError("consistency: aggregate applies to bsp only")
    return Consistency(f"mode: {m.upper()} staleness: {int(staleness)} "
                       f"aggregate: {'true' if aggregate else 'false'}")
