"""ATen op -> kiln op: one converter per ATen overload that kiln models.

A converter receives the importer context and the call's arguments (fx nodes already mapped
to kiln Values, Python numbers left as they are) and returns the kiln value(s), or None when
this particular call is outside what the kiln op means (say ``add`` with ``alpha=2``); the
importer then keeps the call as an opaque CALL node, so nothing is ever mis-translated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from kiln.ir import attrs as A
from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType

aten = torch.ops.aten


class Context(Protocol):
    """What a converter may use; implemented by the importer."""

    out_types: tuple[TensorType, ...]  # the captured output types of the call
    target: Any  # the ATen overload being converted
    device: torch.device

    def operand(self, x: Value | bool | int | float) -> Value: ...
    def emit(self, op: Op, *inputs: Value, attrs: A.Attrs = A.NO_ATTRS) -> tuple[Value, ...]: ...
    def constant_value(self, x: Value) -> torch.Tensor | None: ...  # a weight's tensor


# A converter may leave an output None when the op's graph never reads it.
Converter = Callable[..., "tuple[Value | None, ...] | None"]
CONVERTERS: dict[Any, Converter] = {}


def converts(*targets: Any) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for target in targets:
            CONVERTERS[target] = fn
        return fn

    return register


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _rank(x: Value) -> int:
    return x.type.rank


def _pair(v: Any, n: int = 2) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


# -- elementwise -------------------------------------------------------------------------------

_UNARY = {
    aten.abs.default: Op.ABS, aten.neg.default: Op.NEG, aten.exp.default: Op.EXP,
    aten.log.default: Op.LOG, aten.sqrt.default: Op.SQRT, aten.rsqrt.default: Op.RSQRT,
    aten.reciprocal.default: Op.RECIPROCAL, aten.sin.default: Op.SIN, aten.cos.default: Op.COS,
    aten.tanh.default: Op.TANH, aten.sigmoid.default: Op.SIGMOID, aten.erf.default: Op.ERF,
    aten.relu.default: Op.RELU, aten.floor.default: Op.FLOOR, aten.ceil.default: Op.CEIL,
    aten.logical_not.default: Op.LOGICAL_NOT,
}
for _target, _op in _UNARY.items():
    CONVERTERS[_target] = (lambda op: lambda ctx, x: ctx.emit(op, x))(_op)

_BINARY = {
    aten.add: Op.ADD, aten.sub: Op.SUB, aten.mul: Op.MUL, aten.div: Op.DIV,
    aten.eq: Op.EQ, aten.ne: Op.NE, aten.lt: Op.LT, aten.le: Op.LE, aten.gt: Op.GT,
    aten.ge: Op.GE,
}


def _binary(op: Op) -> Converter:
    def convert(ctx: Context, a: Any, b: Any, alpha: Any = 1) -> tuple[Value, ...] | None:
        if alpha != 1 or isinstance(alpha, float):
            return None  # a + alpha*b rounds once in ATen; no kiln op means that
        if not isinstance(a, Value):
            return None  # scalar first operand: ATen has no such overload but rsub
        attrs = A.DivAttrs(None) if op is Op.DIV else A.NO_ATTRS
        return ctx.emit(op, a, ctx.operand(b), attrs=attrs)

    return convert


for _packet, _op in _BINARY.items():
    for _overload in ("Tensor", "Scalar"):
        CONVERTERS[getattr(_packet, _overload)] = _binary(_op)


@converts(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(ctx: Context, x: Value, other: Any, alpha: Any = 1) -> Any:
    """other - x (``1.0 - attention_mask``): with a number, -x + other, the same value
    (IEEE subtraction adds the negation), since kiln's ops take a number second."""
    if alpha != 1 or isinstance(alpha, float):
        return None
    if isinstance(other, Value):
        return ctx.emit(Op.SUB, other, x)
    (negated,) = ctx.emit(Op.NEG, x)
    return ctx.emit(Op.ADD, negated, ctx.operand(other))


@converts(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx: Context, a: Any, b: Any, *, rounding_mode: str | None) -> Any:
    if not isinstance(a, Value):
        return None  # two numbers (Longformer's padded length over its window, retraced at
        # a concrete shape): ATen's call takes them
    return ctx.emit(Op.DIV, a, ctx.operand(b), attrs=A.DivAttrs(rounding_mode))


@converts(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(ctx: Context, a: Value, b: Any) -> Any:
    """a // b: torch's floor_divide rounds toward -inf, as div(rounding_mode='floor') does
    (MoE routers' expert indices)."""
    if not isinstance(a, Value):
        return None  # (two numbers: see _div_mode)
    return ctx.emit(Op.DIV, a, ctx.operand(b), attrs=A.DivAttrs("floor"))


@converts(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor)
def _pow(ctx: Context, a: Any, b: Any) -> Any:
    return ctx.emit(Op.POW, a, ctx.operand(b))


@converts(aten.maximum.default, aten.minimum.default, aten.logical_and.default,
          aten.logical_or.default)
def _tensor_binary(ctx: Context, a: Value, b: Value) -> Any:
    op = {"maximum": Op.MAXIMUM, "minimum": Op.MINIMUM, "logical_and": Op.LOGICAL_AND,
          "logical_or": Op.LOGICAL_OR}[ctx.target._opname]  # type: ignore[attr-defined]
    return ctx.emit(op, a, b)


@converts(aten.where.self)
def _where(ctx: Context, cond: Value, a: Value, b: Value) -> Any:
    return ctx.emit(Op.WHERE, cond, a, b)


# the next ones as torch's core-ATen decompositions spell them (kiln.frontend.export reads
# graphs these were not decomposed in)
@converts(aten.silu.default)
def _silu(ctx: Context, x: Value) -> Any:
    (s,) = ctx.emit(Op.SIGMOID, x)
    return ctx.emit(Op.MUL, x, s)


@converts(aten.glu.default)
def _glu(ctx: Context, x: Value, dim: int = -1) -> Any:
    """a * sigmoid(b), a and b x's halves along ``dim`` (Conformer's convolution module)."""
    d = _dim(dim, _rank(x))
    half = x.type.shape[d] // 2
    if x.type.shape[d] % 2:
        return None  # (ATen raises: left to it)
    a, b = ctx.emit(Op.SPLIT, x, attrs=A.SplitAttrs((half, half), d))
    (gate,) = ctx.emit(Op.SIGMOID, b)
    return ctx.emit(Op.MUL, a, gate)


@converts(aten.masked_fill.Tensor)
def _masked_fill_tensor(ctx: Context, x: Value, mask: Value, value: Value) -> Any:
    """masked_fill with a 0-d tensor of x's dtype: where(mask, value, x)."""
    if mask.type.dtype is not DType.BOOL or value.type.shape != () or \
            value.type.dtype is not x.type.dtype:
        return None
    return ctx.emit(Op.WHERE, mask, value, x)


@converts(aten.hardsigmoid.default, aten.hardswish.default)
def _hard(ctx: Context, x: Value) -> Any:
    """clamp(x + 3, 0, 6) / 6, times x for hardswish (MobileNetV3, LeViT): left to the
    decomposition table, one of these made the capture trace the model twice."""
    (shifted,) = ctx.emit(Op.ADD, x, ctx.operand(3))
    (gate,) = ctx.emit(Op.CLAMP, shifted, attrs=A.ClampAttrs(0, 6))
    if ctx.target is aten.hardswish.default:
        (gate,) = ctx.emit(Op.MUL, x, gate)
    return ctx.emit(Op.DIV, gate, ctx.operand(6), attrs=A.DivAttrs(None))


@converts(aten.masked_fill.Scalar)
def _masked_fill(ctx: Context, x: Value, mask: Value, value: Any) -> Any:
    if mask.type.dtype is not DType.BOOL:
        return None
    (fill,) = ctx.emit(Op.FULL, attrs=A.FullAttrs((), value, x.type.dtype))
    return ctx.emit(Op.WHERE, mask, fill, x)


@converts(aten.gelu.default)
def _gelu(ctx: Context, x: Value, approximate: str = "none") -> Any:
    return ctx.emit(Op.GELU, x, attrs=A.GeluAttrs(approximate))


@converts(aten.leaky_relu.default)
def _leaky_relu(ctx: Context, x: Value, negative_slope: float = 0.01) -> Any:
    return ctx.emit(Op.LEAKY_RELU, x, attrs=A.LeakyReluAttrs(negative_slope))


@converts(aten.hardtanh.default)
def _hardtanh(ctx: Context, x: Value, min_val: Any = -1.0, max_val: Any = 1.0) -> Any:
    return ctx.emit(Op.CLAMP, x, attrs=A.ClampAttrs(min_val, max_val))


@converts(aten.clamp.default)
def _clamp(ctx: Context, x: Value, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    return ctx.emit(Op.CLAMP, x, attrs=A.ClampAttrs(min, max))


@converts(aten.clamp_min.default)
def _clamp_min(ctx: Context, x: Value, min: Any) -> Any:  # noqa: A002
    return ctx.emit(Op.CLAMP, x, attrs=A.ClampAttrs(min, None))


@converts(aten.clamp_max.default)
def _clamp_max(ctx: Context, x: Value, max: Any) -> Any:  # noqa: A002
    return ctx.emit(Op.CLAMP, x, attrs=A.ClampAttrs(None, max))


@converts(aten._to_copy.default)
def _to_copy(ctx: Context, x: Value, *, dtype: Any = None, layout: Any = None,
             device: Any = None, pin_memory: Any = None, non_blocking: bool = False,
             memory_format: Any = None) -> Any:
    if layout not in (None, torch.strided) or pin_memory or memory_format not in (
            None, torch.preserve_format):
        return None
    if device is not None and torch.device(device) != ctx.device:
        return None
    if dtype is None or dtype == x.type.dtype.torch:
        return ctx.emit(Op.CLONE, x)
    return ctx.emit(Op.CAST, x, attrs=A.CastAttrs(DType.from_torch(dtype)))


@converts(aten.clone.default)
def _clone(ctx: Context, x: Value, *, memory_format: Any = None) -> Any:
    if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
        return None
    return ctx.emit(Op.CLONE, x)


@converts(aten.copy.default)
def _copy(ctx: Context, x: Value, src: Any, non_blocking: bool = False) -> Any:
    """Functional ``copy``: ``src``'s values broadcast to ``x``'s shape, in ``x``'s dtype
    (``x`` gives only its metadata; functionalized ``out[:, i] = y`` writes)."""
    out = ctx.out_types[0]
    v = ctx.operand(src)
    if v.type.dtype != out.dtype:
        (v,) = ctx.emit(Op.CAST, v, attrs=A.CastAttrs(out.dtype))
    if v.type.shape != out.shape:
        (v,) = ctx.emit(Op.EXPAND, v, attrs=A.ShapeAttrs(out.shape))
    return (v,)  # a value of its own in a functional graph, as alias's is


@converts(aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def _identity(ctx: Context, x: Value) -> Any:
    return (x,)


# -- reductions and normalizations -------------------------------------------------------------

def _dims(x: Value, dim: Any) -> tuple[int, ...] | None:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    return tuple(sorted({_dim(d, max(_rank(x), 1)) for d in dims}))


def _reduce(op: Op) -> Converter:
    def convert(ctx: Context, x: Value, dim: Any = None, keepdim: bool = False, *,
                dtype: Any = None) -> Any:
        if dtype is not None:
            return None
        return ctx.emit(op, x, attrs=A.ReduceAttrs(_dims(x, dim), keepdim))

    return convert


for _target, _op in {aten.sum.dim_IntList: Op.SUM, aten.sum.default: Op.SUM,
                     aten.mean.dim: Op.MEAN, aten.mean.default: Op.MEAN,
                     aten.amax.default: Op.AMAX, aten.amin.default: Op.AMIN}.items():
    CONVERTERS[_target] = _reduce(_op)


@converts(aten.argmax.default, aten.argmin.default)
def _argreduce(ctx: Context, x: Value, dim: int | None = None, keepdim: bool = False) -> Any:
    op = Op.ARGMAX if ctx.target is aten.argmax.default else Op.ARGMIN  # type: ignore[attr-defined]
    d = None if dim is None else _dim(dim, max(_rank(x), 1))
    return ctx.emit(op, x, attrs=A.ArgReduceAttrs(d, keepdim))


@converts(aten.var.correction)
def _var(ctx: Context, x: Value, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> Any:
    return ctx.emit(Op.VAR, x, attrs=A.VarAttrs(_dims(x, dim),
                                                1 if correction is None else correction, keepdim))


@converts(aten.std.correction)
def _std(ctx: Context, x: Value, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> Any:
    """sqrt(var(x)), as torch's decomposition spells it."""
    (var,) = _var(ctx, x, dim, correction=correction, keepdim=keepdim)
    return ctx.emit(Op.SQRT, var)


@converts(aten._softmax.default, aten._log_softmax.default)
def _softmax(ctx: Context, x: Value, dim: int, half_to_float: bool) -> Any:
    if half_to_float:
        return None
    op = Op.SOFTMAX if ctx.target is aten._softmax.default else Op.LOG_SOFTMAX  # type: ignore
    return ctx.emit(op, x, attrs=A.SoftmaxAttrs(_dim(dim, max(_rank(x), 1))))


@converts(aten._safe_softmax.default)
def _safe_softmax(ctx: Context, x: Value, dim: int, dtype: Any = None) -> Any:
    """softmax, 0 over a row that is all -inf (attention with every key masked), as ATen's
    kernel: where(all(x == -inf), 0, softmax(x)). all(x == -inf) is amax(x) == -inf (a NaN
    makes both false); an empty row, where amax has no value, and a 0-d x are left to ATen."""
    if dtype is not None or not x.type.shape or x.type.shape[_dim(dim, _rank(x))] == 0:
        return None
    d = _dim(dim, _rank(x))
    (soft,) = ctx.emit(Op.SOFTMAX, x, attrs=A.SoftmaxAttrs(d))
    (top,) = ctx.emit(Op.AMAX, x, attrs=A.ReduceAttrs((d,), True))
    (dead,) = ctx.emit(Op.EQ, top, ctx.operand(float("-inf")))
    (zero,) = ctx.emit(Op.FULL, attrs=A.FullAttrs((), 0.0, x.type.dtype))
    return ctx.emit(Op.WHERE, dead, zero, soft)


@converts(aten.native_layer_norm.default)
def _layer_norm(ctx: Context, x: Value, shape: Any, weight: Any, bias: Any, eps: float) -> Any:
    # without an affine (data2vec-audio's positional convolutions): ones and zeros, exact
    # (a normalized 0 is +0: x - mean is +0 where they are equal, so + 0 keeps every sign)
    shape = tuple(int(d) for d in shape)
    if weight is None:
        (weight,) = ctx.emit(Op.FULL, attrs=A.FullAttrs(shape, 1.0, x.type.dtype))
    if bias is None:
        (bias,) = ctx.emit(Op.FULL, attrs=A.FullAttrs(shape, 0.0, x.type.dtype))
    return ctx.emit(Op.LAYER_NORM, x, weight, bias, attrs=A.LayerNormAttrs(shape, float(eps)))


@converts(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(ctx: Context, x: Value, weight: Any, bias: Any, mean: Value, var: Value,
                momentum: float, eps: float) -> Any:
    if weight is None or bias is None:
        return None
    y = ctx.emit(Op.BATCH_NORM, x, weight, bias, mean, var, attrs=A.BatchNormAttrs(float(eps)))
    return (y[0], None, None)  # the saved statistics are empty in inference


# -- movement ----------------------------------------------------------------------------------

@converts(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(ctx: Context, x: Value, shape: Any) -> Any:
    return ctx.emit(Op.VIEW, x, attrs=A.ShapeAttrs(ctx.out_types[0].shape))


@converts(aten.expand.default)
def _expand(ctx: Context, x: Value, shape: Any, *, implicit: bool = False) -> Any:
    return ctx.emit(Op.EXPAND, x, attrs=A.ShapeAttrs(ctx.out_types[0].shape))


@converts(aten.permute.default)
def _permute(ctx: Context, x: Value, dims: Any) -> Any:
    return ctx.emit(Op.PERMUTE, x,
                    attrs=A.PermuteAttrs(tuple(_dim(d, _rank(x)) for d in dims)))


@converts(aten.t.default, aten.transpose.int)
def _transpose(ctx: Context, x: Value, d0: int = 0, d1: int = 1) -> Any:
    rank = _rank(x)
    if rank < 2:
        return (x,)
    dims = list(range(rank))
    a, b = _dim(d0, rank), _dim(d1, rank)
    dims[a], dims[b] = dims[b], dims[a]
    return ctx.emit(Op.PERMUTE, x, attrs=A.PermuteAttrs(tuple(dims)))


@converts(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(ctx: Context, x: Value, dim: Any = None) -> Any:
    shape = x.type.shape
    if dim is None:
        dims = tuple(i for i, s in enumerate(shape) if s == 1)
    else:
        wanted = [dim] if isinstance(dim, int) else list(dim)
        dims = tuple(sorted({_dim(d, max(len(shape), 1)) for d in wanted}))
        dims = tuple(d for d in dims if d < len(shape) and shape[d] == 1)
    return ctx.emit(Op.SQUEEZE, x, attrs=A.SqueezeAttrs(dims))


@converts(aten.unsqueeze.default)
def _unsqueeze(ctx: Context, x: Value, dim: int) -> Any:
    return ctx.emit(Op.UNSQUEEZE, x, attrs=A.DimAttrs(_dim(dim, _rank(x) + 1)))


@converts(aten.slice.Tensor)
def _slice(ctx: Context, x: Value, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Any:
    d = _dim(dim, _rank(x))
    size = x.type.shape[d]
    begin, stop, _ = slice(start, end, step).indices(size)
    stop = max(stop, begin)
    return ctx.emit(Op.SLICE, x, attrs=A.SliceAttrs(d, begin, stop, step))


@converts(aten.index.Tensor)
def _index(ctx: Context, x: Value, indices: Any) -> Any:
    """``x[..., [8, 9], ...]``: one constant index list along one dim that steps evenly is a
    slice (a view), not ATen's gather (Falcon takes its shared key and value heads out of
    the fused projection as ``qkv[..., [-2], :]``: 50-130 us a call for a copy of 32 KB)."""
    tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(tensors) != 1 or not isinstance(tensors[0][1], Value):
        return None
    d, index = tensors[0]
    values = ctx.constant_value(index)
    if values is None or values.dim() != 1 or values.dtype not in (torch.int64, torch.int32) \
            or values.numel() == 0:
        return None
    size = x.type.shape[d]
    points = [v + size if v < 0 else v for v in values.tolist()]
    if not all(0 <= v < size for v in points):
        return None  # (out of range: ATen's call raises)
    step = points[1] - points[0] if len(points) > 1 else 1
    if step < 1 or points != list(range(points[0], points[0] + step * len(points), step)):
        return None
    return ctx.emit(Op.SLICE, x, attrs=A.SliceAttrs(d, points[0], points[-1] + 1, step))


@converts(aten.select.int)
def _select(ctx: Context, x: Value, dim: int, index: int) -> Any:
    d = _dim(dim, _rank(x))
    return ctx.emit(Op.SELECT, x, attrs=A.SelectAttrs(d, index % x.type.shape[d]))


@converts(aten.split_with_sizes.default, aten.split.Tensor)
def _split(ctx: Context, x: Value, sizes: Any, dim: int = 0) -> Any:
    d = _dim(dim, _rank(x))
    pieces = tuple(t.shape[d] for t in ctx.out_types)
    return ctx.emit(Op.SPLIT, x, attrs=A.SplitAttrs(pieces, d))


@converts(aten.cat.default)
def _cat(ctx: Context, tensors: list[Value], dim: int = 0) -> Any:
    rank = max(_rank(t) for t in tensors)
    # torch.cat skips 1-D empty operands whatever the rank (HF's DynamicCache starts each
    # layer's keys and values as one, so a compiled decode step concatenates the cache
    # onto it); they go where they do not decide the result's dtype, and a lone operand
    # left is copied, as cat copies it
    dtype = ctx.out_types[0].dtype
    kept = [t for t in tensors if not (t.type.shape == (0,) and rank > 1)]
    if kept != tensors and kept and all(t.type.dtype == dtype for t in kept):
        if len(kept) == 1:
            return ctx.emit(Op.CLONE, kept[0])
        tensors = kept
    return ctx.emit(Op.CAT, *tensors, attrs=A.DimAttrs(_dim(dim, rank)))


@converts(aten.stack.default)
def _stack(ctx: Context, tensors: list[Value], dim: int = 0) -> Any:
    d = _dim(dim, _rank(tensors[0]) + 1)
    parts = [ctx.emit(Op.UNSQUEEZE, t, attrs=A.DimAttrs(d))[0] for t in tensors]
    return ctx.emit(Op.CAT, *parts, attrs=A.DimAttrs(d))


@converts(aten.unbind.int)
def _unbind(ctx: Context, x: Value, dim: int = 0) -> Any:
    d = _dim(dim, _rank(x))
    return tuple(ctx.emit(Op.SELECT, x, attrs=A.SelectAttrs(d, i))[0]
                 for i in range(x.type.shape[d]))


@converts(aten.constant_pad_nd.default)
def _pad(ctx: Context, x: Value, pad: Any, value: Any = 0) -> Any:
    if not any(pad):  # (HF's TF-style "same" padding pads 1x1 convolutions by nothing)
        return (x,)
    return ctx.emit(Op.PAD, x, attrs=A.PadAttrs(tuple(pad), value))


# -- contractions, pooling, lookup ----------------------------------------------------------------

@converts(aten.mm.default)
def _mm(ctx: Context, a: Value, b: Value) -> Any:
    return ctx.emit(Op.MM, a, b)


@converts(aten.bmm.default)
def _bmm(ctx: Context, a: Value, b: Value) -> Any:
    return ctx.emit(Op.BMM, a, b)


@converts(aten.baddbmm.default)
def _baddbmm(ctx: Context, x: Value, b1: Value, b2: Value, *, beta: Any = 1,
             alpha: Any = 1) -> Any:
    """beta * x + alpha * (b1 @ b2) (WavLM's relative position bias), spelled as torch's
    decomposition: the product, scaled where alpha != 1, x (scaled where beta != 1) added
    where beta != 0 (a NaN in x is then ignored, as ATen ignores it)."""
    if x.type.dtype is not DType.F32 or not all(
            isinstance(c, (int, float)) and not isinstance(c, bool) for c in (beta, alpha)):
        return None
    (result,) = ctx.emit(Op.BMM, b1, b2)
    if alpha != 1:
        (result,) = ctx.emit(Op.MUL, result, ctx.operand(alpha))
    if beta == 0:
        return (result,)
    if beta != 1:
        (x,) = ctx.emit(Op.MUL, x, ctx.operand(beta))
    return ctx.emit(Op.ADD, x, result)


@converts(aten.addmm.default)
def _addmm(ctx: Context, bias: Value, a: Value, b: Value, *, beta: Any = 1,
           alpha: Any = 1) -> Any:
    return ctx.emit(Op.ADDMM, bias, a, b, attrs=A.AddmmAttrs(beta, alpha))


@converts(aten.convolution.default)
def _convolution(ctx: Context, x: Value, w: Value, b: Value | None, stride: Any, padding: Any,
                 dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Any:
    n = _rank(x) - 2
    attrs = A.ConvAttrs(_pair(stride, n), _pair(padding, n), _pair(dilation, n),
                        bool(transposed), _pair(output_padding, n), int(groups))
    operands = (x, w) if b is None else (x, w, b)
    return ctx.emit(Op.CONVOLUTION, *operands, attrs=attrs)


@converts(aten.embedding.default)
def _embedding(ctx: Context, weight: Value, indices: Value, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    return ctx.emit(Op.EMBEDDING, weight, indices)


@converts(aten.max_pool2d_with_indices.default)
def _max_pool2d(ctx: Context, x: Value, kernel: Any, stride: Any = (), padding: Any = 0,
                dilation: Any = 1, ceil_mode: bool = False) -> Any:
    kernel = _pair(kernel)
    attrs = A.MaxPoolAttrs(kernel, _pair(stride) if stride else kernel, _pair(padding),
                           _pair(dilation), bool(ceil_mode))
    return ctx.emit(Op.MAX_POOL2D, x, attrs=attrs)


@converts(aten.avg_pool2d.default)
def _avg_pool2d(ctx: Context, x: Value, kernel: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Any = None) -> Any:
    kernel = _pair(kernel)
    attrs = A.AvgPoolAttrs(kernel, _pair(stride) if stride else kernel, _pair(padding),
                           bool(ceil_mode), bool(count_include_pad), divisor_override)
    return ctx.emit(Op.AVG_POOL2D, x, attrs=attrs)


@converts(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx: Context, x: Value, output_size: Any) -> Any:
    return ctx.emit(Op.ADAPTIVE_AVG_POOL2D, x, attrs=A.AdaptivePoolAttrs(_pair(output_size)))


@converts(aten.bitwise_not.default)
def _bitwise_not(ctx: Context, x: Value) -> Any:
    if x.type.dtype is not DType.BOOL:
        return None  # on integers it flips bits: no kiln op means that
    return ctx.emit(Op.LOGICAL_NOT, x)


@converts(aten.bitwise_and.Tensor, aten.bitwise_or.Tensor)
def _bitwise_bool(ctx: Context, a: Any, b: Any) -> Any:
    """On two bool tensors, ``&`` and ``|`` are the logical ops (HF's attention masks combine
    a causal and a padding mask so); on integers they work on bits: no kiln op means that."""
    if not all(isinstance(v, Value) and v.type.dtype is DType.BOOL for v in (a, b)):
        return None
    op = Op.LOGICAL_AND if ctx.target._opname == "bitwise_and" else Op.LOGICAL_OR  # type: ignore
    return ctx.emit(op, a, b)


# (the creation ops' converters live in their own module; importing it registers them)
from kiln.frontend import creation  # noqa: E402, F401
