"""Movement ops as copies: out[v] = x[index map of v] (guarded where the map leaves x)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.ir import attrs as A
from kiln.ir.graph import Node
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.tir.nodes import Buffer, CmpOp, Expr, Var, const, contiguous_strides
from kiln.tir.te import Builder, NotLowerable, TensorRef, all_of, cast, cmp, in_range, select

Index = tuple[Var, ...]
LowerFn = Callable[[Builder, Node, list[TensorRef], list[Buffer]], None]


def _zero() -> Expr:
    return const(0, DType.I64)


def reshape_index(in_shape: Sequence[int], out_shape: Sequence[int],
                  v: Sequence[Expr]) -> list[Expr]:
    """Input position of output position ``v`` for a row-major reshape."""
    in_big = [d for d in in_shape if d != 1]
    out_big = [(k, d) for k, d in enumerate(out_shape) if d != 1]
    if in_big == [d for _, d in out_big]:  # only unit dims differ: map the others in order
        it = iter(k for k, _ in out_big)
        return [_zero() if d == 1 else v[next(it)] for d in in_shape]
    flat: Expr = _zero()
    for k, stride in enumerate(contiguous_strides(out_shape)):
        if out_shape[k] != 1:
            flat = flat + v[k] * stride
    idx: list[Expr] = []
    for extent, stride in zip(in_shape, contiguous_strides(in_shape)):
        idx.append(_zero() if extent == 1 else (flat // stride) % extent)
    return idx


def lower_copy(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    x, out = args[0], outs[0]
    op, a = node.op, node.attrs
    rank = len(x.shape)
    index: Callable[[Index], Sequence[Expr]]
    if op in (Op.VIEW, Op.SQUEEZE, Op.UNSQUEEZE):
        index = lambda v: reshape_index(x.shape, out.shape, v)  # noqa: E731
    elif op is Op.PERMUTE:
        assert isinstance(a, A.PermuteAttrs)
        inverse = {d % rank: k for k, d in enumerate(a.dims)}
        index = lambda v: [v[inverse[d]] for d in range(rank)]  # noqa: E731
    elif op is Op.SLICE:
        assert isinstance(a, A.SliceAttrs)
        dim, start = a.dim % rank, a.start
        size = x.shape[dim]
        start = min(max(start + size if start < 0 else start, 0), size)
        index = lambda v: [v[d] * a.step + start if d == dim else v[d]  # noqa: E731
                           for d in range(rank)]
    elif op is Op.SELECT:
        assert isinstance(a, A.SelectAttrs)
        dim = a.dim % rank
        at = a.index + x.shape[dim] if a.index < 0 else a.index
        index = lambda v: [*v[:dim], const(at, DType.I64), *v[dim:]]  # noqa: E731
    elif op in (Op.EXPAND, Op.CLONE):
        b.compute(node.name, out, lambda v: x.at(out.shape, v))
        return
    else:
        raise NotLowerable(op, "no copy definition")
    b.compute(node.name, out, lambda v: cast(x.read(index(v)), out.dtype))


def lower_cat(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    out = outs[0]
    dim = node.attrs.dim % len(out.shape)  # type: ignore[attr-defined]
    pieces, offset = [], 0
    for x in args:
        if len(x.shape) != len(out.shape):  # legacy empty 1-d operand: contributes nothing
            continue
        if x.shape[dim]:
            pieces.append((offset, x))
        offset += x.shape[dim]

    def value(v: Index) -> Expr:
        result: Expr | None = None
        for start, x in reversed(pieces):
            idx = [v[d] - start if d == dim else v[d] for d in range(len(v))]
            e = cast(x.read(idx), out.dtype)
            result = e if result is None else select(cmp(CmpOp.LT, v[dim], start + x.shape[dim]),
                                                     e, result)
        assert result is not None or out.numel == 0
        return result if result is not None else const(0, out.dtype)
    b.compute(node.name, out, value)


def lower_split(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.SplitAttrs)
    x = args[0]
    dim, start = a.dim % len(x.shape), 0
    for k, out in enumerate(outs):
        def piece(v: Index, s: int = start) -> Expr:
            return x.read([v[d] + s if d == dim else v[d] for d in range(len(v))])
        b.compute(f"{node.name}_{k}", out, piece)
        start += out.shape[dim]


def lower_pad(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    a = node.attrs
    assert isinstance(a, A.PadAttrs)
    x, out = args[0], outs[0]
    rank = len(x.shape)
    before = [0] * rank
    after = [0] * rank
    for k in range(len(a.pad) // 2):
        before[rank - 1 - k], after[rank - 1 - k] = a.pad[2 * k], a.pad[2 * k + 1]

    def value(v: Index) -> Expr:
        idx = [v[d] - before[d] for d in range(rank)]
        guard = all_of([c for d in range(rank) if before[d] > 0 or after[d] > 0
                        for c in in_range(idx[d], x.shape[d])])
        e = cast(x.read(idx), out.dtype)
        return e if guard is None else select(guard, e, const(a.value, out.dtype))
    b.compute(node.name, out, value)


def lower_embedding(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    weight, indices = args
    out = outs[0]
    if len(weight.shape) != 2:
        raise NotLowerable(node.op, "embedding table of rank other than 2")
    b.compute(node.name, out, lambda v: weight.read(
        (cast(indices.read(v[:-1]), DType.I64), v[-1])))


MOVEMENT: dict[Op, LowerFn] = {op: lower_copy for op in (
    Op.VIEW, Op.SQUEEZE, Op.UNSQUEEZE, Op.PERMUTE, Op.SLICE, Op.SELECT, Op.EXPAND, Op.CLONE)}
MOVEMENT.update({Op.CAT: lower_cat, Op.SPLIT: lower_split, Op.PAD: lower_pad,
                 Op.EMBEDDING: lower_embedding})
