"""One maker per op: builds a random, well-typed application of the op in a `Draft`
(contractions: `kiln.fuzz.makers_contraction`; which maker builds which op: `kiln.fuzz.table`).

A maker picks operands (from the pool or new), random attributes within the op's domain, and
emits the node; it raises `Reject` when it cannot, and type inference rejects the rest.
Numbers, fills and weights appear as operands often, since that is what the rewrite rules
match (``x * 1``, ``x / c``, a transposed weight, a batch norm of a convolution).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kiln.fuzz.generate import FLOATS, INTS, Draft, Reject
from kiln.fuzz.values import positive_values
from kiln.ir import attrs as A
from kiln.ir.attrs import Number, Operand
from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType

FLOAT_NUMBERS: tuple[float, ...] = (
    0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 0.25, 3.0, 1 / 3, 0.1, 1e10, 3e38, 1e39, 1e-39,
    1e-45, 1e-300, math.inf, -math.inf, math.nan)
INT_NUMBERS: tuple[int, ...] = (0, 1, -1, 2, 3, 7, -4, 1024)


def number(d: Draft) -> Number:
    r = d.rng.random()
    if r < 0.6:
        return d.rng.choice(FLOAT_NUMBERS)
    if r < 0.92:
        return d.rng.choice(INT_NUMBERS)
    return d.rng.choice((True, False))


def number_for(d: Draft, dtype: DType) -> Number:
    """A number an op on ``dtype`` may take without changing its result type (ATen refuses a
    float that overflows the tensor's type)."""
    if dtype.is_floating:
        if d.rng.random() < 0.3:
            return d.rng.choice(INT_NUMBERS)
        biggest = torch.finfo(dtype.torch).max
        return d.rng.choice([v for v in FLOAT_NUMBERS
                             if not (math.isfinite(v) and abs(v) > biggest)])
    if dtype is DType.BOOL:
        return d.rng.choice((True, False))
    return d.rng.choice(INT_NUMBERS)


def tensor_type(d: Draft, dtypes: tuple[DType, ...] | None = None,
                rank: int | None = None) -> Callable[[], TensorType]:
    return lambda: TensorType(d.shape(rank), d.dtype(dtypes))


def is_float(v: Value) -> bool:
    return v.type.dtype.is_floating


def any_operand(d: Draft, floats: float = 0.5) -> Value:
    """Any pool value; a float one with chance ``floats`` (most ops want floats)."""
    if d.rng.random() < floats:
        return d.operand(is_float, tensor_type(d, FLOATS))
    return d.operand(lambda v: True, tensor_type(d))


def broadcast_shape(d: Draft, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: fewer leading dims, some dims 1, or the other
    way round (``shape``'s ones grown, a leading dim added)."""
    rng = d.rng
    s = list(shape)
    if s and rng.random() < 0.3:
        s = s[rng.randint(1, len(s)):]
    grow = rng.random() < 0.25
    s = [1 if rng.random() < 0.3 else d.dim() if n == 1 and grow and rng.random() < 0.5 else n
         for n in s]
    if rng.random() < 0.15 and len(shape) == len(s) < d.limits.max_rank:
        s.insert(0, d.dim())
    return tuple(s)


def broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        torch.broadcast_shapes(a, b)
    except RuntimeError:
        return False
    return True


def partner(d: Draft, x: Value, dtype: DType | None = None) -> Value:
    """A second operand for ``x``: itself, a number, a fill, or a tensor it broadcasts with."""
    r = d.rng.random()
    if r < 0.1:
        return x
    if r < 0.3:
        return d.number(number_for(d, x.type.dtype) if d.rng.random() < 0.8 else number(d))
    shape = broadcast_shape(d, x.type.shape)
    if not d.fits(shape) or not d.fits(torch.broadcast_shapes(shape, x.type.shape)):
        shape = x.type.shape
    dtype = dtype or (x.type.dtype if d.rng.random() < 0.75 else d.dtype())
    if r < 0.4:
        value = number_for(d, dtype)
        return d.emit1(Op.FULL, attrs=A.FullAttrs(shape, value, dtype))
    return d.operand(lambda v: v.type.dtype == dtype and broadcasts(v.type.shape, x.type.shape)
                     and v is not x, lambda: TensorType(shape, dtype))


# -- elementwise -----------------------------------------------------------------------------

_TRANSCENDENTAL = frozenset({Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIPROCAL, Op.SIN, Op.COS,
                             Op.TANH, Op.SIGMOID, Op.ERF, Op.GELU})


def activation_args(d: Draft, op: Op, dtype: DType) -> tuple[object, ...]:
    if op is Op.GELU:
        return (d.rng.choice(("none", "tanh")),)
    if op is Op.LEAKY_RELU:
        return (d.rng.choice((0.01, 0.0, -0.5, 2.0, 1.0, 0.2)),)
    if op is Op.CLAMP:
        lo = number_for(d, dtype) if d.rng.random() < 0.8 else None
        hi = number_for(d, dtype) if d.rng.random() < 0.8 or lo is None else None
        return (lo, hi)
    return ()


def make_unary(d: Draft, op: Op) -> None:
    x = any_operand(d, 0.9 if op in _TRANSCENDENTAL else 0.6)
    if x.type.dtype is DType.BOOL and op is not Op.LOGICAL_NOT:
        raise Reject("ATen's CPU kernels take no bool here (meta kernels do not say so)")
    args = activation_args(d, op, x.type.dtype)
    attrs: A.Attrs = A.NO_ATTRS
    if op is Op.GELU:
        attrs = A.GeluAttrs(*args)
    elif op is Op.LEAKY_RELU:
        attrs = A.LeakyReluAttrs(*args)
    elif op is Op.CLAMP:
        attrs = A.ClampAttrs(*args)
    d.emit1(op, x, attrs=attrs)


def make_cast(d: Draft, op: Op) -> None:
    x = any_operand(d)
    target = d.dtype()
    if x.type.dtype.is_floating and target in INTS:
        x = finite_in_range(d, x, target)
    d.emit1(Op.CAST, x, attrs=A.CastAttrs(target))


def finite_in_range(d: Draft, x: Value, target: DType) -> Value:
    """``x`` with NaN made 0 and values clamped into ``target``'s range: a float outside an
    integer type's range (NaN and ±inf included) converts to an unspecified integer in C, and
    ATen's vectorized and scalar loops disagree on it."""
    info = torch.iinfo(target.torch)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    nan = d.emit1(Op.NE, x, x)
    zero = d.emit1(Op.FULL, attrs=A.FullAttrs((), 0.0, x.type.dtype))
    clamped = d.emit1(Op.CLAMP, x, attrs=A.ClampAttrs(float(lo), float(hi)))
    return d.emit1(Op.WHERE, nan, zero, clamped)


def make_binary(d: Draft, op: Op) -> None:
    x = any_operand(d, 0.7)
    y = partner(d, x)
    if op is Op.SUB and DType.BOOL in (x.type.dtype, y.type.dtype):
        raise Reject("ATen refuses to subtract bools (meta kernels do not say so)")
    if op is Op.POW and not x.type.dtype.is_floating and not is_float(y):
        y = d.number(d.rng.choice((0, 1, 2, 3)))  # integers to negative powers raise
    if d.rng.random() < 0.3 or (op is Op.POW and y.node.op is Op.SCALAR
                                and d.rng.random() < 0.3):
        x, y = y, x
    d.emit1(op, x, y)


def make_div(d: Draft, op: Op) -> None:
    mode = d.rng.choice((None, None, "trunc", "floor"))
    x = any_operand(d, 0.7)
    y = partner(d, x)
    if mode is not None and not x.type.dtype.is_floating and not is_float(y):
        # integer division traps (SIGFPE) on INT_MIN // -1 and raises on zero: divide by
        # positive numbers only
        if d.rng.random() < 0.5:
            y = d.number(d.rng.choice((1, 2, 3, 7)))
        else:
            t = TensorType(broadcast_shape(d, x.type.shape), x.type.dtype)
            if not d.fits(t.shape):
                t = x.type
            y = d.source(t, positive_values(t, d.gen))
    elif d.rng.random() < 0.2:
        x, y = y, x
    if x.node.op is Op.SCALAR and y.node.op is Op.SCALAR:
        raise Reject("two numbers")
    d.emit1(Op.DIV, x, y, attrs=A.DivAttrs(mode))


def make_where(d: Draft, op: Op) -> None:
    x = any_operand(d, 0.7)
    y = partner(d, x)
    shape = broadcast_shape(d, x.type.shape)
    if not d.fits(shape):
        shape = x.type.shape
    cond = d.operand(lambda v: v.type.dtype is DType.BOOL and broadcasts(v.type.shape, shape),
                     lambda: TensorType(shape, DType.BOOL))
    if d.rng.random() < 0.3:
        x, y = y, x
    d.emit1(Op.WHERE, cond, x, y)


# -- reductions and normalizations ------------------------------------------------------------

def reduce_dims(d: Draft, rank: int) -> tuple[int, ...] | None:
    r = d.rng.random()
    if r < 0.2:
        return None
    if r < 0.25:
        return ()  # ATen: an empty list reduces every dimension
    if rank == 0:
        return d.rng.choice(((0,), (-1,), ()))
    dims = [i for i in range(rank) if d.rng.random() < 0.5] or [d.rng.randrange(rank)]
    return tuple(i - rank if d.rng.random() < 0.3 else i for i in dims)


def _nonempty(shape: tuple[int, ...], dims: tuple[int, ...] | None) -> bool:
    """amax/amin/argmax of an empty slice raise at run time (meta kernels do not check)."""
    if not shape:
        return True
    reduced = range(len(shape)) if not dims else [i % len(shape) for i in dims]
    return all(shape[i] > 0 for i in reduced)


def make_reduce(d: Draft, op: Op) -> None:
    if op is Op.MEAN and d.float32 and d.rng.random() < 0.6:
        return make_rms_norm(d)
    x = any_operand(d, 0.8 if op in (Op.MEAN, Op.VAR) else 0.6)
    dims = reduce_dims(d, x.type.rank)
    keepdim = d.rng.random() < 0.4
    if op in (Op.AMAX, Op.AMIN) and not _nonempty(x.type.shape, dims):
        raise Reject("empty reduction")
    if op is Op.VAR:
        correction = d.rng.choice((1, 0, 2, 0.5))
        d.emit1(op, x, attrs=A.VarAttrs(dims, correction, keepdim))
    else:
        d.emit1(op, x, attrs=A.ReduceAttrs(dims, keepdim))


def make_rms_norm(d: Draft) -> None:
    """RMSNorm as models write it (`kiln.passes.rms_norm`, one row kernel), in its variants:
    ``x ** 2`` or ``x * x``, either operand order, with or without a weight over the rows."""
    x = d.operand(lambda v: is_float(v) and v.type.rank >= 1,
                  tensor_type(d, FLOATS, d.rng.randint(1, 3)))
    rank = x.type.rank
    square = d.emit1(Op.POW, x, d.number(2)) if d.rng.random() < 0.7 \
        else d.emit1(Op.MUL, x, x)
    dim = rank - 1 if d.rng.random() < 0.5 else -1
    mean = d.emit1(Op.MEAN, square, attrs=A.ReduceAttrs((dim,), True))
    eps = d.number(d.rng.choice((1e-6, 1e-5, 0.0)))
    shifted = d.emit1(Op.ADD, mean, eps) if d.rng.random() < 0.8 else d.emit1(Op.ADD, eps, mean)
    rstd = d.emit1(Op.RSQRT, shifted)
    scaled = d.emit1(Op.MUL, x, rstd) if d.rng.random() < 0.8 else d.emit1(Op.MUL, rstd, x)
    if d.rng.random() < 0.7:
        n = x.type.shape[-1]
        w = d.operand(lambda v: v.type == TensorType((n,), x.type.dtype),
                      lambda: TensorType((n,), x.type.dtype), fresh=0.8)
        d.emit1(Op.MUL, w, scaled) if d.rng.random() < 0.7 else d.emit1(Op.MUL, scaled, w)


def make_arg_reduce(d: Draft, op: Op) -> None:
    x = any_operand(d, 0.7)
    rank = x.type.rank
    dim = None if rank == 0 or d.rng.random() < 0.3 else d.rng.randrange(-rank, rank)
    if not _nonempty(x.type.shape, None if dim is None else (dim,)):
        raise Reject("empty reduction")
    d.emit1(op, x, attrs=A.ArgReduceAttrs(dim, d.rng.random() < 0.4))


def make_softmax(d: Draft, op: Op) -> None:
    x = d.operand(is_float, tensor_type(d, FLOATS))
    rank = max(x.type.rank, 1)
    dim = d.rng.randrange(-rank, rank) if d.rng.random() < 0.5 else rank - 1
    d.emit1(op, x, attrs=A.SoftmaxAttrs(dim))


def make_layer_norm(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: is_float(v) and v.type.rank >= 1, tensor_type(d, FLOATS, 2))
    k = d.rng.randint(1, min(2, x.type.rank))
    shape = x.type.shape[-k:]
    params = [d.operand(lambda v, s=shape: v.type.shape == s and v.type.dtype == x.type.dtype,
                        lambda: TensorType(shape, x.type.dtype), fresh=0.7) for _ in range(2)]
    eps = d.rng.choice((1e-5, 1e-5, 0.0, 1e-12, 0.1))
    y, mean, rstd = d.emit(op, x, *params, attrs=A.LayerNormAttrs(shape, eps))
    if x.type.dtype in (DType.F16, DType.BF16):
        # excluded: ATen's meta kernel (kiln's type inference) says mean and rstd are float32
        # for half inputs; its CPU kernel returns them in the input's type (reported)
        d.pool.remove(mean)
        d.pool.remove(rstd)


def make_batch_norm(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: is_float(v) and 2 <= v.type.rank <= 4,
                  tensor_type(d, FLOATS, d.rng.choice((2, 3, 4))))
    c = TensorType((x.type.shape[1],), x.type.dtype)
    params = []
    for role in ("weight", "bias", "mean", "var"):
        values = None
        if role == "var" and d.rng.random() < 0.8:  # mostly a real variance; sometimes not
            values = torch.rand(c.shape, generator=d.gen).to(c.dtype.torch) * 2
        params.append(d.source(c, values, constant=0.7))
    d.emit1(op, x, *params, attrs=A.BatchNormAttrs(d.rng.choice((1e-5, 0.0, 1e-3))))


# -- movement ---------------------------------------------------------------------------------

def reshape_to(d: Draft, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A random shape with as many elements as ``shape``."""
    n = math.prod(shape)
    rank = d.rng.randint(0 if n == 1 else 1, d.limits.max_rank)
    if n == 0:
        dims = [d.dim() for _ in range(rank)]
        dims[d.rng.randrange(rank)] = 0
        return tuple(dims)
    dims = [1] * rank
    for p in _prime_factors(n):
        dims[d.rng.randrange(rank)] *= p
    return tuple(dims)


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors + ([n] if n > 1 else [])


def make_view(d: Draft, op: Op) -> None:
    x = d.dense(any_operand(d, 0.6))
    d.emit1(Op.VIEW, x, attrs=A.ShapeAttrs(reshape_to(d, x.type.shape)))


def make_permute(d: Draft, op: Op) -> None:
    x = any_operand(d, 0.6)
    dims = list(range(x.type.rank))
    d.rng.shuffle(dims)
    if dims and d.rng.random() < 0.2:
        dims = [i - len(dims) for i in dims]  # negative dims
    d.emit1(op, x, attrs=A.PermuteAttrs(tuple(dims)))


def make_expand(d: Draft, op: Op) -> None:
    x = any_operand(d, 0.6)
    shape = [d.dim() if n == 1 and d.rng.random() < 0.7 else n for n in x.type.shape]
    while d.rng.random() < 0.3 and len(shape) < d.limits.max_rank:
        shape.insert(0, d.dim())
    if not d.fits(tuple(shape)):
        raise Reject("too large")
    d.emit1(op, x, attrs=A.ShapeAttrs(tuple(shape)))


def make_squeeze(d: Draft, op: Op) -> None:
    x = any_operand(d, 0.6)
    rank = x.type.rank
    ones = [i for i, n in enumerate(x.type.shape) if n == 1]
    candidates = ones if ones and d.rng.random() < 0.8 else list(range(rank))
    dims = tuple(i for i in candidates if d.rng.random() < 0.7) if rank else ()
    d.emit1(op, x, attrs=A.SqueezeAttrs(dims))


def make_unsqueeze(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: v.type.rank < d.limits.max_rank, tensor_type(d))
    rank = x.type.rank
    d.emit1(op, x, attrs=A.DimAttrs(d.rng.randint(-rank - 1, rank)))


def make_slice(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: v.type.rank >= 1, tensor_type(d, rank=d.rng.randint(1, 4)))
    dim = d.rng.randrange(x.type.rank)
    n = x.type.shape[dim]
    start = d.rng.randint(-n - 1, n + 1)
    end = d.rng.choice((d.rng.randint(-n - 1, n + 2), 9223372036854775807))
    step = d.rng.choice((1, 1, 2, 3))
    d.emit1(op, x, attrs=A.SliceAttrs(dim - x.type.rank if d.rng.random() < 0.2 else dim,
                                      start, end, step))


def make_select(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: any(n > 0 for n in v.type.shape), tensor_type(d, rank=2))
    dims = [i for i, n in enumerate(x.type.shape) if n > 0]
    if not dims:
        raise Reject("nothing to select")
    dim = d.rng.choice(dims)
    n = x.type.shape[dim]
    d.emit1(op, x, attrs=A.SelectAttrs(dim, d.rng.randint(-n, n - 1)))


def make_split(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: v.type.rank >= 1, tensor_type(d, rank=2))
    dim = d.rng.randrange(x.type.rank)
    n = x.type.shape[dim]
    pieces = d.rng.randint(1, 3)
    cuts = sorted(d.rng.randint(0, n) for _ in range(pieces - 1))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n])]
    d.emit(op, x, attrs=A.SplitAttrs(tuple(sizes), dim))


def make_cat(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: v.type.rank >= 1, tensor_type(d, rank=d.rng.randint(1, 4)))
    dim = d.rng.randrange(x.type.rank)
    parts = [x]
    for _ in range(d.rng.randint(0, 2)):
        if d.rng.random() < 0.1:  # a 1-d empty tensor: ATen's cat skips it, whatever x is
            parts.append(d.source(TensorType((0,), x.type.dtype)))
            continue
        shape = list(x.type.shape)
        shape[dim] = d.dim()
        dtype = x.type.dtype if d.rng.random() < 0.8 else d.dtype()
        parts.append(d.operand(lambda v, s=tuple(shape), t=dtype: v.type.shape == s
                               and v.type.dtype == t, lambda s=tuple(shape), t=dtype:
                               TensorType(s, t)))
    d.rng.shuffle(parts)
    d.emit1(op, *parts, attrs=A.DimAttrs(dim - x.type.rank if d.rng.random() < 0.2 else dim))


def make_clone(d: Draft, op: Op) -> None:
    d.emit1(op, any_operand(d, 0.6))


def make_to_layout(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: v.type.rank == 4, tensor_type(d, rank=4))
    d.emit1(op, x, attrs=A.LayoutAttrs(d.rng.random() < 0.8))


def make_pad(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: v.type.rank >= 1, tensor_type(d, rank=d.rng.randint(1, 4)))
    shape = x.type.shape
    pad: list[int] = []
    for n in reversed(shape[-d.rng.randint(1, min(3, len(shape))):]):
        before = d.rng.randint(-min(n, 2), 3)
        after = d.rng.randint(-(n + before) if n + before <= 2 else -2, 3)
        pad += [before, after]
    d.emit1(op, x, attrs=A.PadAttrs(tuple(pad), number_for(d, x.type.dtype)))

# -- creation and opaque calls ----------------------------------------------------------------

def make_full(d: Draft, op: Op) -> None:
    dtype = d.dtype()
    d.emit1(op, attrs=A.FullAttrs(d.shape(), number_for(d, dtype), dtype))


def make_arange(d: Draft, op: Op) -> None:
    dtype = d.dtype((DType.F32, DType.F64, DType.I64, DType.I32))
    floats = dtype.is_floating and d.rng.random() < 0.5
    start = d.rng.choice((0, 1, -3, 2.5, -0.5)) if floats else d.rng.randint(-5, 5)
    step = d.rng.choice((1, 2, -1, 0.5, -0.25)) if floats else d.rng.choice((1, 2, 3, -1, -2))
    length = d.rng.randint(0, 12)
    end = start + step * length
    d.emit1(op, attrs=A.ArangeAttrs(start, end, step, dtype))


aten = torch.ops.aten


def make_call(d: Draft, op: Op) -> None:
    x = d.operand(lambda v: v.type.rank >= 1, tensor_type(d, rank=2))
    rank = x.type.rank
    kind = d.rng.choice(("cumsum", "flip", "roll", "triu"))
    if kind == "cumsum":
        attrs = A.CallAttrs(aten.cumsum.default, (Operand(0), d.rng.randrange(-rank, rank)))
    elif kind == "flip":
        dims = tuple(i for i in range(rank) if d.rng.random() < 0.6)
        attrs = A.CallAttrs(aten.flip.default, (Operand(0), dims))
    elif kind == "roll":
        attrs = A.CallAttrs(aten.roll.default, (Operand(0), (d.rng.randint(-3, 3),),
                                                (d.rng.randrange(rank),)))
    else:
        if rank < 2:
            raise Reject("triu needs a matrix")
        attrs = A.CallAttrs(aten.triu.default, (Operand(0), d.rng.randint(-2, 2)))
    d.emit1(op, x, attrs=attrs)
