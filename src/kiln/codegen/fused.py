"""Scheduled loop programs for the memory-bound fused kernels of a transformer layer.

Each builder returns a PrimFunc already in the form the default schedule gives such a
kernel: rows in parallel, every pass over a row vectorized, and reductions over a row split
into ``LANES`` lane-wise partial results (rfactor) that the vector loop keeps in a local array,
combined at the end of the row. A row is read from memory once; later passes hit L1.
Softmax is three passes: max; exp stored and summed in one loop; scale by 1/sum.

    softmax_rows(R, N)       out[r, :] = softmax(x[r, :])
    layernorm_rows(R, N)     out[r, :] = (x - mean) * rsqrt(var + eps) * w + b
    bias_gelu(R, N)          out = gelu(x + bias[None, :])  (erf form)
    add_relu(R, N)           out = relu(x + y)

Softmax over the last axis of, say, f32[12, 128, 128] is ``softmax_rows(12 * 128, 128)`` on
the same memory. NaN propagates as in torch (max keeps NaN; relu(NaN) is NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kiln.ir.types import DType
from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    CmpOp,
    Compare,
    Expr,
    For,
    ForKind,
    IterKind,
    IterVar,
    PrimFunc,
    Scope,
    Select,
    Stmt,
    Unary,
    UnOp,
    Var,
    const,
    seq,
)

__all__ = ["LANES", "add_relu", "bias_gelu", "layernorm_rows", "softmax_rows"]

F32 = DType.F32
LANES = 16  # fp32 lanes of an AVX-512 vector: the width of the partial reductions

Loop = tuple[Var, int, ForKind]


class _Names:
    """Fresh, unique loop/iter var names within one PrimFunc."""

    def __init__(self) -> None:
        self.count = 0

    def var(self, base: str) -> Var:
        self.count += 1
        return Var(f"{base}{self.count}")


def _nest(names: _Names, name: str, outer: Sequence[tuple[Var, int]], loops: Sequence[Loop],
          body: Callable[..., Stmt], reduce: Sequence[int] = (),
          predicate: Callable[..., Expr] | None = None) -> Stmt:
    """``loops`` (outermost first) around one block whose iter vars are bound one to one to
    the enclosing loop vars ``outer`` + ``loops``; ``body``/``predicate`` take the iter vars
    (the predicate is evaluated on the loop vars). Positions in ``reduce`` are REDUCE."""
    bound = [*outer, *((v, e) for v, e, _ in loops)]
    ivs = tuple(IterVar(names.var(f"v_{v.name}_"), e,
                        IterKind.REDUCE if k in reduce else IterKind.SPATIAL)
                for k, (v, e) in enumerate(bound))
    pred = predicate(*(v for v, _ in bound)) if predicate is not None else None
    stmt: Stmt = Block(name, ivs, tuple(v for v, _ in bound), body(*(iv.var for iv in ivs)),
                       predicate=pred)
    for var, extent, kind in reversed(loops):
        stmt = For(var, extent, stmt, kind)
    return stmt


def _c(value: float) -> Expr:
    return const(value, F32)


def _max(a: Expr, b: Expr) -> Expr:
    return Binary(BinOp.MAX, a, b)


def _lt(a: Expr, bound: int) -> Expr:
    return Compare(CmpOp.LT, a, const(bound, DType.I64))


class _Row:
    """Helpers for one row of length n inside ``parallel r in range(rows)``."""

    def __init__(self, names: _Names, r: Var, rows: int, n: int) -> None:
        self.names, self.r, self.rows, self.n = names, r, rows, n
        self.chunks = -(-n // LANES)
        self.tail = n % LANES != 0

    def elementwise(self, name: str, body: Callable[[Var, Var], Stmt]) -> Stmt:
        """``for j in vectorized(n): body(r, j)``."""
        j = self.names.var("j")
        return _nest(self.names, name, [(self.r, self.rows)], [(j, self.n, ForKind.VECTORIZED)],
                     body)

    def lanes(self, name: str, body: Callable[[Var], Stmt]) -> Stmt:
        lane = self.names.var("l")
        return _nest(self.names, name, [], [(lane, LANES, ForKind.VECTORIZED)], body)

    def partial(self, name: str, part: Buffer, op: BinOp, identity: float,
                term: Callable[[Var, Expr], Expr],
                side: Callable[[Var, Expr], Stmt] | None = None) -> Stmt:
        """part[l] = identity; part[l] = part[l] op term(r, col) over the row's chunks.

        ``side(r, col)``, if given, is a store that runs first in the same loop (so a pass
        that writes the row can also reduce it); the tail is then a block predicate."""
        init = self.lanes(f"{name}_init", lambda v: BufferStore(part, (v,), _c(identity)))
        jo, lane = self.names.var("jo"), self.names.var("l")

        def update(vr: Var, vjo: Var, vl: Var) -> Stmt:
            col = vjo * LANES + vl
            value = term(vr, col)
            if self.tail and side is None:
                value = Select(_lt(col, self.n), value, _c(identity))
            store = BufferStore(part, (vl,), Binary(op, part[vl], value))
            return store if side is None else seq(side(vr, col), store)

        def in_row(r: Var, vjo: Var, vl: Var) -> Expr:
            return _lt(vjo * LANES + vl, self.n)
        loop = _nest(self.names, name, [(self.r, self.rows)],
                     [(jo, self.chunks, ForKind.SERIAL), (lane, LANES, ForKind.VECTORIZED)],
                     update, reduce=(1,),
                     predicate=in_row if self.tail and side is not None else None)
        return seq(init, loop)

    def combine(self, name: str, part: Buffer, stat: Buffer, slot: int, op: BinOp,
                identity: float, finish: Callable[[Expr], Expr] | None = None) -> Stmt:
        """stat[slot] = finish(op-reduction of part[0..LANES))."""
        k = const(slot, DType.I64)
        lane = self.names.var("l")
        init = BufferStore(stat, (k,), _c(identity))
        iv = IterVar(self.names.var("v_l"), LANES, IterKind.REDUCE)
        block = Block(name, (iv,), (lane,),
                      BufferStore(stat, (k,), Binary(op, stat[k], part[iv.var])))
        loop = For(lane, LANES, block)
        if finish is None:
            return seq(init, loop)
        return seq(init, loop, BufferStore(stat, (k,), finish(stat[k])))


def _rows_kernel(name: str, rows: int, n: int, inputs: tuple[Buffer, ...], out: Buffer,
                 body: Callable[[_Row, Buffer, Buffer], Stmt]) -> PrimFunc:
    names = _Names()
    r = Var("r")
    part = Buffer("part", (LANES,), F32, scope=Scope.LOCAL)
    stat = Buffer("stat", (2,), F32, scope=Scope.LOCAL)
    row = _Row(names, r, rows, n)
    per_row = Allocate(part, Allocate(stat, body(row, part, stat)))
    return PrimFunc(name, inputs, (out,), For(r, rows, per_row, ForKind.PARALLEL))


def softmax_rows(rows: int, n: int, name: str = "softmax") -> PrimFunc:
    """Softmax over the last axis of x: f32[rows, n], in three passes over each row."""
    x = Buffer("x", (rows, n), F32)
    out = Buffer("out", (rows, n), F32)

    def body(row: _Row, part: Buffer, stat: Buffer) -> Stmt:
        zero = const(0, DType.I64)
        one = const(1, DType.I64)

        def exp_store(vr: Var, col: Expr) -> Stmt:
            return BufferStore(out, (vr, col), Unary(UnOp.EXP, x[vr, col] - stat[zero]))
        return seq(
            row.partial("max_part", part, BinOp.MAX, -math.inf, lambda vr, c: x[vr, c]),
            row.combine("max", part, stat, 0, BinOp.MAX, -math.inf),
            row.partial("exp_sum_part", part, BinOp.ADD, 0.0, lambda vr, c: out[vr, c],
                        side=exp_store),
            row.combine("sum", part, stat, 1, BinOp.ADD, 0.0, lambda s: _c(1.0) / s),
            row.elementwise("scale", lambda vr, vj: BufferStore(
                out, (vr, vj), out[vr, vj] * stat[one])),
        )
    return _rows_kernel(name, rows, n, (x,), out, body)


def layernorm_rows(rows: int, n: int, eps: float = 1e-5, name: str = "layernorm") -> PrimFunc:
    """LayerNorm over the last axis with weight and bias (two-pass mean and variance)."""
    x = Buffer("x", (rows, n), F32)
    w = Buffer("w", (n,), F32)
    b = Buffer("b", (n,), F32)
    out = Buffer("out", (rows, n), F32)
    inv_n = 1.0 / n if n else 0.0

    def body(row: _Row, part: Buffer, stat: Buffer) -> Stmt:
        mean, rstd = stat[const(0, DType.I64)], stat[const(1, DType.I64)]

        def dev2(vr: Var, c: Expr) -> Expr:
            d = x[vr, c] - mean
            return d * d
        return seq(
            row.partial("sum_part", part, BinOp.ADD, 0.0, lambda vr, c: x[vr, c]),
            row.combine("mean", part, stat, 0, BinOp.ADD, 0.0, lambda s: s * _c(inv_n)),
            row.partial("var_part", part, BinOp.ADD, 0.0, dev2),
            row.combine("rstd", part, stat, 1, BinOp.ADD, 0.0,
                        lambda s: Unary(UnOp.RSQRT, s * _c(inv_n) + _c(eps))),
            row.elementwise("normalize", lambda vr, vj: BufferStore(
                out, (vr, vj), (x[vr, vj] - mean) * rstd * w[vj] + b[vj])),
        )
    return _rows_kernel(name, rows, n, (x, w, b), out, body)


def bias_gelu(rows: int, n: int, name: str = "bias_gelu") -> PrimFunc:
    """out = gelu(x + bias), gelu(v) = v/2 * (1 + erf(v / sqrt(2)))."""
    x = Buffer("x", (rows, n), F32)
    bias = Buffer("bias", (n,), F32)
    out = Buffer("out", (rows, n), F32)

    def store(vr: Var, vj: Var) -> Stmt:
        v = x[vr, vj] + bias[vj]
        gelu = v * _c(0.5) * (Unary(UnOp.ERF, v * _c(1.0 / math.sqrt(2.0))) + _c(1.0))
        return BufferStore(out, (vr, vj), gelu)
    return _elementwise_rows(name, rows, n, (x, bias), out, store)


def add_relu(rows: int, n: int, name: str = "add_relu") -> PrimFunc:
    """out = relu(x + y) = max(x + y, 0), NaN-propagating like torch.relu."""
    x = Buffer("x", (rows, n), F32)
    y = Buffer("y", (rows, n), F32)
    out = Buffer("out", (rows, n), F32)

    def store(vr: Var, vj: Var) -> Stmt:
        return BufferStore(out, (vr, vj), _max(x[vr, vj] + y[vr, vj], _c(0.0)))
    return _elementwise_rows(name, rows, n, (x, y), out, store)


def _elementwise_rows(name: str, rows: int, n: int, inputs: tuple[Buffer, ...], out: Buffer,
                      store: Callable[[Var, Var], Stmt]) -> PrimFunc:
    names = _Names()
    r = Var("r")
    row = _Row(names, r, rows, n)
    return PrimFunc(name, inputs, (out,),
                    For(r, rows, row.elementwise(name, store), ForKind.PARALLEL))
