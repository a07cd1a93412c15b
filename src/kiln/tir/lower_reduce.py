"""Compute definitions of reductions and normalizations (each a few blocks: reduce, then map)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kiln.ir import attrs as A
from kiln.ir.graph import Node
from kiln.ir.ops import Op
from kiln.tir.nodes import BinOp, Buffer, CmpOp, Expr, UnOp, Var, const
from kiln.tir.te import (
    Builder,
    NotLowerable,
    TensorRef,
    cast,
    cmp,
    select,
    softmax_exp,
    unary,
)

Index = tuple[Var, ...]
LowerFn = Callable[[Builder, Node, list[TensorRef], list[Buffer]], None]


def normalize_dims(dims: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    if dims is None or len(dims) == 0:
        return tuple(range(rank))
    return tuple(sorted({d % rank if rank else 0 for d in dims}))


def kept_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in dims)


def source_index(rank: int, dims: Sequence[int], keepdim: bool, v: Index,
                 r: Index) -> list[Expr]:
    """The input position of output position ``v`` and reduction position ``r``."""
    idx: list[Expr] = []
    vi, ri = 0, 0
    for d in range(rank):
        if d in dims:
            idx.append(r[ri])
            ri += 1
            vi += 1 if keepdim else 0
        else:
            idx.append(v[vi])
            vi += 1
    return idx


def kept_index(rank: int, dims: Sequence[int], v: Sequence[Expr]) -> list[Expr]:
    """Index into a keepdim-shaped tensor from a full-rank position ``v``."""
    return [const(0, v[0].dtype) if d in dims else v[d] for d in range(rank)]


def reduce_into(b: Builder, name: str, out: Buffer, x: TensorRef, dims: Sequence[int],
                keepdim: bool, op: BinOp, fn: Callable[[Expr, Index], Expr] = lambda e, v: e,
                ) -> None:
    """``out = reduce_op(fn(x))`` over ``dims``; ``fn`` also sees the full-rank position."""
    rank = len(x.shape)
    extents = tuple(x.shape[d] for d in dims)

    def body(v: Index, r: Index) -> Expr:
        idx = source_index(rank, dims, keepdim, v, r)
        return fn(cast(x.read(idx), out.dtype), tuple(idx))  # type: ignore[arg-type]
    b.reduce(name, out, extents, op, body)


def lower_reduce(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.ReduceAttrs)
    x, out = args[0], outs[0]
    dims = normalize_dims(a.dims, len(x.shape))
    op = {Op.SUM: BinOp.ADD, Op.MEAN: BinOp.ADD, Op.AMAX: BinOp.MAX, Op.AMIN: BinOp.MIN}[node.op]
    if node.op is not Op.MEAN:
        reduce_into(b, node.name, out, x, dims, a.keepdim, op)
        return
    if not out.dtype.is_floating:
        raise NotLowerable(node.op, "mean of an integer tensor")
    count = math.prod(x.shape[d] for d in dims)
    total = b.temp(f"{node.name}_sum", out.shape, out.dtype)
    reduce_into(b, f"{node.name}_sum", total, x, dims, a.keepdim, BinOp.ADD)
    b.compute(node.name, out, lambda v: total[v] / float(count))


def lower_var(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.VarAttrs)
    x, out = args[0], outs[0]
    if not out.dtype.is_floating:
        raise NotLowerable(node.op, "variance of an integer tensor")
    rank = len(x.shape)
    dims = normalize_dims(a.dims, rank)
    count = math.prod(x.shape[d] for d in dims)
    mean_shape = kept_shape(x.shape, dims, True)
    total = b.temp(f"{node.name}_sum", mean_shape, out.dtype)
    reduce_into(b, f"{node.name}_sum", total, x, dims, True, BinOp.ADD)
    sq = b.temp(f"{node.name}_sq", out.shape, out.dtype)

    def dev2(e: Expr, idx: Index) -> Expr:
        d = e - total[tuple(kept_index(rank, dims, idx))] / float(count)
        return d * d
    reduce_into(b, f"{node.name}_sq", sq, x, dims, a.keepdim, BinOp.ADD, dev2)
    b.compute(node.name, out, lambda v: sq[v] / float(max(count - a.correction, 0)))


def lower_softmax(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.SoftmaxAttrs)
    x, out = args[0], outs[0]
    rank = len(x.shape)
    if not out.dtype.is_floating or out.dtype is not x.dtype:
        raise NotLowerable(node.op, "softmax changing or on a non-float dtype")
    dims = normalize_dims((a.dim,), rank)
    red_shape = kept_shape(x.shape, dims, True)
    mx = b.temp(f"{node.name}_max", red_shape, out.dtype)
    reduce_into(b, f"{node.name}_max", mx, x, dims, True, BinOp.MAX)

    def at_max(v: Sequence[Expr]) -> Expr:
        return mx[tuple(kept_index(rank, dims, v))]

    total = b.temp(f"{node.name}_sum", red_shape, out.dtype)
    if node.op is Op.SOFTMAX:
        e = b.temp(f"{node.name}_exp", x.shape, out.dtype)
        b.compute(f"{node.name}_exp", e, lambda v: softmax_exp(x.read(v) - at_max(v)))
        reduce_into(b, f"{node.name}_sum", total, TensorRef(x.shape, x.dtype, e), dims, True,
                    BinOp.ADD)
        b.compute(node.name, out, lambda v: e[v] / total[tuple(kept_index(rank, dims, v))])
        return
    reduce_into(b, f"{node.name}_sum", total, x, dims, True, BinOp.ADD,
                lambda e, idx: softmax_exp(e - at_max(idx)))
    b.compute(node.name, out, lambda v: x.read(v) - at_max(v) - unary(
        UnOp.LOG, total[tuple(kept_index(rank, dims, v))]))


def lower_layer_norm(b: Builder, node: Node, args: list[TensorRef],
                     outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.LayerNormAttrs)
    x = args[0]
    y, mean, rstd = outs
    if not y.dtype.is_floating or mean.dtype is not y.dtype:
        raise NotLowerable(node.op, "mixed-precision layer norm")
    rank, m = len(x.shape), len(a.normalized_shape)
    dims = tuple(range(rank - m, rank))
    count = math.prod(x.shape[d] for d in dims)
    # mean = x0 + sum((x - x0)/n), x0 the row's first element: exact for a constant row (as
    # ATen's Welford mean is: with eps = 0 its result is then 0*inf = NaN), and the sum of
    # the (x - x0)/n cannot overflow where the sum of x could (2e38 and 3e38 in one row)
    def first(idx: Sequence[Expr]) -> Expr:
        at = list(idx)
        for d in dims:
            at[d] = const(0, at[d].dtype)
        return cast(x.read(at), y.dtype)

    total = b.temp(f"{node.name}_sum", mean.shape, y.dtype)
    if count:
        reduce_into(b, f"{node.name}_sum", total, x, dims, True, BinOp.ADD,
                    lambda e, idx: (e - first(idx)) * (1.0 / count))
        b.compute(f"{node.name}_mean", mean, lambda v: first(v) + total[v])
    else:
        reduce_into(b, f"{node.name}_sum", total, x, dims, True, BinOp.ADD)
        b.compute(f"{node.name}_mean", mean, lambda v: total[v])

    def at(buf: Buffer, v: Sequence[Expr]) -> Expr:
        return buf[tuple(kept_index(rank, dims, v))]

    sq = b.temp(f"{node.name}_sq", mean.shape, y.dtype)

    def dev2(e: Expr, idx: Index) -> Expr:
        d = e - at(mean, idx)
        return d * d
    reduce_into(b, f"{node.name}_sq", sq, x, dims, True, BinOp.ADD, dev2)
    b.compute(f"{node.name}_rstd", rstd,
              lambda v: unary(UnOp.RSQRT, sq[v] / float(count) + a.eps))

    def normalize(v: Index) -> Expr:
        # 0 where the variance overflowed (rstd = 0), as ATen's x*rstd - mean*rstd gives,
        # where (x - mean)*rstd may be inf*0 = NaN
        r = at(rstd, v)
        e = select(cmp(CmpOp.EQ, r, 0.0), const(0.0, y.dtype),
                   (cast(x.read(v), y.dtype) - at(mean, v)) * r)
        tail = v[rank - m:]
        if len(args) > 1 and args[1].buffer is not None:
            e = e * cast(args[1].read(tail), y.dtype)
        if len(args) > 2 and args[2].buffer is not None:
            e = e + cast(args[2].read(tail), y.dtype)
        return e
    b.compute(node.name, y, normalize)


def lower_batch_norm(b: Builder, node: Node, args: list[TensorRef],
                     outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.BatchNormAttrs)
    if len(args) != 5 or any(t.buffer is None for t in args):
        raise NotLowerable(node.op, "batch norm without weight, bias and running stats")
    x, w, bias, mean, var = args
    out = outs[0]
    if not out.dtype.is_floating:
        raise NotLowerable(node.op, "non-float batch norm")

    def norm(v: Index) -> Expr:
        c = (v[1],)
        inv = unary(UnOp.SQRT, cast(var.read(c), out.dtype) + a.eps)
        e = (cast(x.read(v), out.dtype) - cast(mean.read(c), out.dtype)) / inv
        return e * cast(w.read(c), out.dtype) + cast(bias.read(c), out.dtype)
    b.compute(node.name, out, norm)


REDUCTIONS: dict[Op, LowerFn] = {
    Op.SUM: lower_reduce, Op.MEAN: lower_reduce, Op.AMAX: lower_reduce, Op.AMIN: lower_reduce,
    Op.VAR: lower_var, Op.SOFTMAX: lower_softmax, Op.LOG_SOFTMAX: lower_softmax,
    Op.LAYER_NORM: lower_layer_norm, Op.BATCH_NORM: lower_batch_norm,
}
