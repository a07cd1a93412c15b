"""Compute definitions of contractions (matmul, batched matmul, addmm, direct convolution) and
pooling. Padding is a bounds check around the load (Select is lazy), not a padded copy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.ir import attrs as A
from kiln.ir.graph import Node
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.tir.nodes import BinOp, Buffer, CmpOp, Compare, Expr, Var, const
from kiln.tir.te import (
    Builder,
    NotLowerable,
    TensorRef,
    all_of,
    cast,
    identity_of,
    in_range,
    max_,
    min_,
    select,
)

Index = tuple[Var, ...]
LowerFn = Callable[[Builder, Node, list[TensorRef], list[Buffer]], None]


def _float_only(node: Node, out: Buffer) -> None:
    if not out.dtype.is_floating:
        raise NotLowerable(node.op, f"{out.dtype.value} contraction")


def lower_mm(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    x, y = args
    out = outs[0]
    _float_only(node, out)
    k = x.shape[-1]
    if node.op is Op.MM:
        b.reduce(node.name, out, (k,), BinOp.ADD,
                 lambda v, r: cast(x.read((v[0], r[0])), out.dtype)
                 * cast(y.read((r[0], v[1])), out.dtype))
    else:
        b.reduce(node.name, out, (k,), BinOp.ADD,
                 lambda v, r: cast(x.read((v[0], v[1], r[0])), out.dtype)
                 * cast(y.read((v[0], r[0], v[2])), out.dtype))


def lower_addmm(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.AddmmAttrs)
    bias, x, y = args
    out = outs[0]
    _float_only(node, out)
    k = x.shape[-1]

    def product(v: Index, r: Index) -> Expr:
        return cast(x.read((v[0], r[0])), out.dtype) * cast(y.read((r[0], v[1])), out.dtype)

    if a.alpha == 1 and a.beta == 1:  # bias as the accumulator's start: no extra pass
        b.reduce(node.name, out, (k,), BinOp.ADD, product,
                 lambda v: bias.as_dtype(out.dtype, out.shape, v))
        return
    mm = b.temp(f"{node.name}_mm", out.shape, out.dtype)
    b.reduce(f"{node.name}_mm", mm, (k,), BinOp.ADD, product)

    def epilogue(v: Index) -> Expr:
        e = mm[v] * float(a.alpha) if a.alpha != 1 else mm[v]
        if a.beta == 0:  # ATen ignores the bias (even NaN) when beta is 0
            return e
        return e + bias.as_dtype(out.dtype, out.shape, v) * float(a.beta)
    b.compute(node.name, out, epilogue)


def lower_conv(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.ConvAttrs)
    out = outs[0]
    _float_only(node, out)
    if a.transposed:
        raise NotLowerable(node.op, "transposed convolution")
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 and args[2].buffer is not None else None
    nsp = len(a.stride)
    if len(x.shape) != nsp + 2:
        raise NotLowerable(node.op, "unbatched convolution")
    cout, cin_g = w.shape[0], w.shape[1]
    cout_g = cout // a.groups

    def body(v: Index, r: Index) -> Expr:
        ci = (v[1] // cout_g) * cin_g + r[0] if a.groups > 1 else r[0]
        pos = [v[2 + d] * a.stride[d] - a.padding[d] + r[1 + d] * a.dilation[d]
               for d in range(nsp)]
        conds = [c for d in range(nsp) if a.padding[d] > 0 for c in in_range(pos[d],
                                                                            x.shape[2 + d])]
        value = cast(x.read((v[0], ci, *pos)), out.dtype)
        guard = all_of(conds)
        if guard is not None:
            value = select(guard, value, 0.0)
        return value * cast(w.read((v[1], *r)), out.dtype)

    finit = None
    if bias is not None:
        finit = lambda v: cast(bias.read((v[1],)), out.dtype)  # noqa: E731
    b.reduce(node.name, out, tuple(w.shape[1:]), BinOp.ADD, body, finit)


def _window(o: Var, k: Expr, stride: int, pad: int, dilation: int) -> Expr:
    return o * stride - pad + k * dilation


def lower_max_pool(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.MaxPoolAttrs)
    x, out = args[0], outs[0]
    if outs[1] not in b.temps:
        raise NotLowerable(node.op, "max pooling indices")
    b.temps.remove(outs[1])
    lead = len(x.shape) - 2

    def body(v: Index, r: Index) -> Expr:
        pos = [_window(v[lead + d], r[d], a.stride[d], a.padding[d], a.dilation[d])
               for d in range(2)]
        # ceil_mode windows may run past the end even without padding: always guard
        guard = all_of([c for d in range(2) for c in in_range(pos[d], x.shape[lead + d])])
        assert guard is not None
        return select(guard, cast(x.read((*v[:lead], *pos)), out.dtype), _lowest(out.dtype))
    b.reduce(node.name, out, tuple(a.kernel), BinOp.MAX, body)


def _lowest(dtype: DType) -> Expr:
    return identity_of(BinOp.MAX, dtype)


def lower_avg_pool(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.AvgPoolAttrs)
    x, out = args[0], outs[0]
    _float_only(node, out)
    lead = len(x.shape) - 2
    total = b.temp(f"{node.name}_sum", out.shape, out.dtype)

    def body(v: Index, r: Index) -> Expr:
        pos = [_window(v[lead + d], r[d], a.stride[d], a.padding[d], 1) for d in range(2)]
        guard = all_of([c for d in range(2) for c in in_range(pos[d], x.shape[lead + d])])
        assert guard is not None
        return select(guard, cast(x.read((*v[:lead], *pos)), out.dtype), 0.0)
    b.reduce(f"{node.name}_sum", total, tuple(a.kernel), BinOp.ADD, body)

    b.compute(node.name, out, lambda v: total[v] / avg_pool_divisor(
        a, v[lead:], x.shape[lead:], out.dtype))


def avg_pool_divisor(a: Any, out_pos: Sequence[Expr], extents: Sequence[int],
                     dtype: DType) -> Expr:
    """ATen's avg_pool2d divisor at output position ``out_pos`` (H, W) of an input
    ``extents`` (H, W) big: ``a.divisor_override``, else the window clipped to the padded
    input (``a.count_include_pad``), else clipped to the input. ``a``: anything with the
    pool's kernel, stride, padding, count_include_pad and divisor_override."""
    if a.divisor_override:
        return const(float(a.divisor_override), dtype)
    size: Expr = const(1, DType.I64)
    for d in range(2):
        start = out_pos[d] * a.stride[d] - a.padding[d]
        end = min_(start + a.kernel[d], extents[d] + a.padding[d])
        if a.count_include_pad:
            size = size * (end - start)
        else:
            size = size * (min_(end, extents[d]) - max_(start, 0))
    return cast(size, dtype)


def adaptive_bounds(o: Expr, in_size: int, out_size: int) -> tuple[Expr, Expr]:
    """ATen's adaptive window of output ``o``: [floor(o*I/O), ceil((o+1)*I/O))."""
    return (o * in_size) // out_size, ((o + 1) * in_size + out_size - 1) // out_size


def lower_adaptive_avg_pool(b: Builder, node: Node, args: list[TensorRef],
                            outs: list[Buffer]) -> None:
    x, out = args[0], outs[0]
    _float_only(node, out)
    lead = len(x.shape) - 2
    sizes = [(x.shape[lead + d], out.shape[lead + d]) for d in range(2)]
    widest = [max(((o + 1) * i + n - 1) // n - (o * i) // n for o in range(n)) if n else 0
              for i, n in sizes]
    total = b.temp(f"{node.name}_sum", out.shape, out.dtype)

    def body(v: Index, r: Index) -> Expr:
        conds, pos = [], []
        for d, (i, n) in enumerate(sizes):
            start, end = adaptive_bounds(v[lead + d], i, n)
            pos.append(start + r[d])
            if any(((o + 1) * i + n - 1) // n - (o * i) // n != widest[d] for o in range(n)):
                conds.append(_lt(start + r[d], end))
        value = cast(x.read((*v[:lead], *pos)), out.dtype)
        guard = all_of(conds)
        return value if guard is None else select(guard, value, 0.0)
    b.reduce(f"{node.name}_sum", total, tuple(widest), BinOp.ADD, body)

    def average(v: Index) -> Expr:
        size: Expr = const(1, DType.I64)
        for d, (i, n) in enumerate(sizes):
            start, end = adaptive_bounds(v[lead + d], i, n)
            size = size * (end - start)
        return total[v] / cast(size, out.dtype)
    b.compute(node.name, out, average)


def _lt(a: Expr, b: Expr) -> Expr:
    return Compare(CmpOp.LT, a, b)


CONTRACTIONS: dict[Op, LowerFn] = {
    Op.MM: lower_mm, Op.BMM: lower_mm, Op.ADDMM: lower_addmm, Op.CONVOLUTION: lower_conv,
    Op.MAX_POOL2D: lower_max_pool, Op.AVG_POOL2D: lower_avg_pool,
    Op.ADAPTIVE_AVG_POOL2D: lower_adaptive_avg_pool,
}
