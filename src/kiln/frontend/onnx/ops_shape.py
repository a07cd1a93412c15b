"""Shape, indexing and data-movement ops (ONNX semantics in torch)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kiln.frontend.onnx.optable import Decline, NodeCall, axes_of, axis_of, onnx_op
from kiln.frontend.onnx.types import torch_dtype


@onnx_op("Constant")
def _constant(n: NodeCall) -> torch.Tensor:
    for name, dtype in (("value_float", torch.float32), ("value_int", torch.int64),
                        ("value_floats", torch.float32), ("value_ints", torch.int64)):
        v = n.attr(name)
        if v is not None:
            return torch.tensor(v, dtype=dtype)
    value = n.attr("value")
    if value is None:
        raise Decline("Constant without a tensor value")
    return value


@onnx_op("Shape")
def _shape(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    dims = list(x.shape)
    start, end = n.attr("start", 0), n.attr("end")
    return torch.tensor(dims[start:end] if end is not None else dims[start:], dtype=torch.int64)


@onnx_op("Size")
def _size(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(x.numel(), dtype=torch.int64)


@onnx_op("Cast")
def _cast(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    return _cast_to(x, _target(n.attr("to")))


@onnx_op("CastLike")
def _cast_like(n: NodeCall, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return _cast_to(x, like.dtype)


def _target(elem_type: int) -> torch.dtype:
    try:
        return torch_dtype(elem_type)
    except ValueError:
        raise Decline(f"cast to element type {elem_type}") from None


_CASTABLE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
             torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}


def _cast_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if x.dtype not in _CASTABLE or dtype not in _CASTABLE:
        raise Decline(f"cast {x.dtype} -> {dtype}")
    if x.dtype.is_floating_point and not dtype.is_floating_point and dtype != torch.bool:
        raise Decline("float -> integer cast: out-of-range values differ between runtimes")
    return x.to(dtype)


@onnx_op("Reshape")
def _reshape(n: NodeCall, x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    target = n.ints(1)
    assert target is not None
    if not n.attr("allowzero", 0):  # 0 copies the input's size there
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return torch.reshape(x, target)


@onnx_op("Flatten")
def _flatten(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    axis = n.attr("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    if not 0 <= axis <= x.dim():
        raise Decline(f"Flatten axis {axis}")
    return torch.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@onnx_op("Transpose")
def _transpose(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    perm = n.attr("perm") or list(reversed(range(x.dim())))
    return x.permute(*perm)


@onnx_op("Squeeze")
def _squeeze(n: NodeCall, x: torch.Tensor, axes: torch.Tensor | None = None) -> torch.Tensor:
    dims = n.ints(1)
    if dims is None:
        return torch.reshape(x, [d for d in x.shape if d != 1])
    dims = axes_of(dims, x.dim())
    if any(x.shape[d] != 1 for d in dims):
        raise Decline("Squeeze of a dimension that is not 1")
    return torch.reshape(x, [d for i, d in enumerate(x.shape) if i not in dims])


@onnx_op("Unsqueeze")
def _unsqueeze(n: NodeCall, x: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    dims = n.ints(1)
    assert dims is not None
    rank = x.dim() + len(dims)
    dims = sorted(axes_of(dims, rank))
    if len(set(dims)) != len(dims):
        raise Decline("repeated Unsqueeze axes")
    shape = list(x.shape)
    for d in dims:
        shape.insert(d, 1)
    return torch.reshape(x, shape)


@onnx_op("Concat")
def _concat(n: NodeCall, *xs: torch.Tensor) -> torch.Tensor:
    if any(x.dtype != xs[0].dtype for x in xs):
        raise Decline("Concat of mixed types")
    return torch.cat(xs, axis_of(n.attr("axis"), xs[0].dim()))


@onnx_op("Split")
def _split(n: NodeCall, x: torch.Tensor, split: torch.Tensor | None = None,
           ) -> tuple[torch.Tensor, ...]:
    axis = axis_of(n.attr("axis", 0), x.dim())
    sizes = n.ints(1)
    if sizes is None:
        parts = n.attr("num_outputs") or n.num_outputs
        each = -(-x.shape[axis] // parts)  # ceil: the last part may be smaller (opset 18)
        if n.attr("num_outputs") is None and x.shape[axis] % parts:
            raise Decline("Split into unequal parts without sizes")
        sizes = [min(each, x.shape[axis] - i * each) for i in range(parts)]
    if sum(sizes) != x.shape[axis] or len(sizes) != n.num_outputs:
        raise Decline("Split sizes do not add up")
    return tuple(torch.split(x, sizes, axis))


@onnx_op("Slice")
def _slice(n: NodeCall, x: torch.Tensor, *rest: torch.Tensor | None) -> torch.Tensor:
    starts, ends = n.ints(1), n.ints(2)
    assert starts is not None and ends is not None
    axes = n.ints(3) or list(range(len(starts)))
    steps = n.ints(4) or [1] * len(starts)
    index = [slice(None)] * x.dim()
    for start, end, axis, step in zip(starts, ends, axes_of(axes, x.dim()), steps):
        if step <= 0:
            raise Decline("Slice with a negative step")
        size = x.shape[axis]
        start = max(0, min(size, start + size if start < 0 else start))
        end = max(0, min(size, end + size if end < 0 else end))
        index[axis] = slice(start, max(start, end), step)
    return x[tuple(index)]


def _normalized(n: NodeCall, index: torch.Tensor, size: int, at: int) -> torch.Tensor:
    """Indices with negatives counted from the end, as ONNX allows and torch does not."""
    known = n.value(at) if n.proto.input[at] in n.known else None
    if known is not None and bool(((known < -size) | (known >= size)).any()):
        raise Decline("index out of range")
    return torch.where(index < 0, index + size, index)


@onnx_op("Gather")
def _gather(n: NodeCall, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    axis = axis_of(n.attr("axis", 0), x.dim())
    index = _normalized(n, index, x.shape[axis], 1)
    if axis == 0 and x.dim() == 2 and x.dtype.is_floating_point:  # a lookup table's rows
        return F.embedding(index.to(torch.int64), x)
    picked = torch.index_select(x, axis, index.reshape(-1).to(torch.int64))
    return torch.reshape(picked, (*x.shape[:axis], *index.shape, *x.shape[axis + 1:]))


@onnx_op("GatherElements")
def _gather_elements(n: NodeCall, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    axis = axis_of(n.attr("axis", 0), x.dim())
    index = _normalized(n, index, x.shape[axis], 1)
    return torch.gather(x, axis, index.to(torch.int64))


@onnx_op("Expand")
def _expand(n: NodeCall, x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    target = n.ints(1)
    assert target is not None
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(target))).clone()


@onnx_op("Tile")
def _tile(n: NodeCall, x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
    times = n.ints(1)
    assert times is not None
    if len(times) != x.dim():
        raise Decline("Tile repeats of another rank")
    return x.repeat(*times) if times else x


@onnx_op("ConstantOfShape")
def _constant_of_shape(n: NodeCall, shape: torch.Tensor) -> torch.Tensor:
    dims = n.ints(0)
    assert dims is not None
    value = n.attr("value")
    fill = value.reshape(-1)[0] if value is not None else torch.tensor(0.0)
    return torch.full(dims, fill.item(), dtype=fill.dtype)


@onnx_op("Range")
def _range(n: NodeCall, start: torch.Tensor, limit: torch.Tensor,
           delta: torch.Tensor) -> torch.Tensor:
    a, b, d = (n.scalar(i) for i in range(3))
    count = max(math.ceil((b - a) / d), 0)
    return (torch.arange(count, dtype=torch.float64 if start.dtype.is_floating_point
                         else torch.int64) * d + a).to(start.dtype)


@onnx_op("Trilu")
def _trilu(n: NodeCall, x: torch.Tensor, k: torch.Tensor | None = None) -> torch.Tensor:
    offset = n.ints(1)[0] if n.has_input(1) else 0  # type: ignore[index]
    return torch.triu(x, offset) if n.attr("upper", 1) else torch.tril(x, offset)


@onnx_op("Pad")
def _pad(n: NodeCall, x: torch.Tensor, *rest: torch.Tensor | None) -> torch.Tensor:
    pads = n.ints(1)
    assert pads is not None
    axes = n.ints(3)
    axes = axes_of(axes, x.dim()) if axes is not None else list(range(x.dim()))
    if len(pads) != 2 * len(axes):
        raise Decline("Pad pads and axes disagree")
    begin, end = dict(zip(axes, pads[:len(axes)])), dict(zip(axes, pads[len(axes):]))
    torch_pads: list[int] = []  # torch's: last dimension first, (begin, end) pairs
    for d in reversed(range(x.dim())):
        torch_pads += [begin.get(d, 0), end.get(d, 0)]
    mode = n.attr("mode", "constant")
    if mode == "constant":
        fill = n.scalar(2)
        return F.pad(x, torch_pads, value=fill if fill is not None else 0)
    if any(p < 0 for p in torch_pads) or x.dim() < 2:
        raise Decline(f"{mode} Pad with negative pads or of rank < 2")
    return _pad_mode(x, torch_pads, mode)


def _pad_mode(x: torch.Tensor, torch_pads: list[int], mode: str) -> torch.Tensor:
    """torch pads the last one to three dimensions in reflect/edge/wrap mode: only pad those."""
    used = max((i // 2 + 1 for i, p in enumerate(torch_pads) if p), default=0)
    if used > 3 or used > x.dim() - 1:
        raise Decline(f"{mode} Pad of more dimensions than torch pads")
    torch_mode = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(mode)
    if torch_mode is None:
        raise Decline(f"Pad mode {mode}")
    lead = x.dim() - used
    batch = x.reshape((1, math.prod(x.shape[:lead]), *x.shape[lead:]))
    out = F.pad(batch, torch_pads[:2 * used], mode=torch_mode)
    return out.reshape((*x.shape[:lead], *out.shape[2:]))


@onnx_op("DepthToSpace")
def _depth_to_space(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    bs = n.attr("blocksize")
    if n.attr("mode", "DCR") == "DCR":
        y = x.reshape(b, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(b, c // (bs * bs), bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(b, c // (bs * bs), h * bs, w * bs)


@onnx_op("SpaceToDepth")
def _space_to_depth(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    bs = n.attr("blocksize")
    y = x.reshape(b, c, h // bs, bs, w // bs, bs).permute(0, 3, 5, 1, 2, 4)
    return y.reshape(b, c * bs * bs, h // bs, w // bs)


@onnx_op("Dropout")
def _dropout(n: NodeCall, x: torch.Tensor, *rest: torch.Tensor | None,
             ) -> tuple[torch.Tensor, ...]:
    if n.scalar(2):
        raise Decline("Dropout in training mode is random")
    if n.wants(1):
        return x, torch.ones_like(x, dtype=torch.bool)
    return (x,)


@onnx_op("Einsum")
def _einsum(n: NodeCall, *xs: torch.Tensor) -> torch.Tensor:
    if any(x.dtype != xs[0].dtype for x in xs):
        raise Decline("Einsum of mixed types")
    return torch.einsum(n.attr("equation").replace(" ", ""), *xs)
