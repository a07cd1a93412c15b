"""Compute definitions in the spirit of TVM's tensor expressions: say what each output
element is, get a loop nest with one block.

    b.compute("relu", out, lambda v: max_(x.at(out.shape, v), 0.0))
    b.reduce("sum", out, (K,), BinOp.ADD, 0.0, lambda v, r: x.read((v[0], r[0])))

gives spatial loops ``i0, i1, ...`` over the output and reduction loops ``k0, ...`` inside
them, around a block whose iter vars are ``vi0, ..., vk0, ...``. Names are unique within the
function being built (suffixes ``_1``, ``_2``, ...), so traces can name loops and blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Cast,
    CmpOp,
    Compare,
    Const,
    Expr,
    ExprLike,
    For,
    IterKind,
    IterVar,
    Scope,
    Select,
    Stmt,
    Unary,
    UnOp,
    Var,
    const,
    seq,
)
from kiln.tir.visit import conjoin, fresh

Number = bool | int | float


class NotLowerable(Exception):
    """kiln cannot lower this op to loops (it stays a library call); ``reason`` says why."""

    def __init__(self, op: Op, reason: str) -> None:
        super().__init__(f"cannot lower {op.text}: {reason}")
        self.op = op
        self.reason = reason


@dataclass(frozen=True)
class TensorRef:
    """A tensor as a compute definition sees it: a buffer, or a Python number (SCALAR)."""

    shape: tuple[int, ...]
    dtype: DType
    buffer: Buffer | None = None
    number: Number | None = None

    def read(self, indices: Sequence[Expr]) -> Expr:
        if self.buffer is None:
            assert self.number is not None
            return const(self.number, self.dtype)
        return self.buffer[tuple(indices)]

    def at(self, out_shape: Sequence[int], v: Sequence[Expr]) -> Expr:
        """The element broadcast to output position ``v`` (numpy rules, right-aligned)."""
        if self.buffer is None:
            return self.read(())
        offset = len(out_shape) - len(self.shape)
        idx = [const(0, DType.I64) if d == 1 else v[offset + k]
               for k, d in enumerate(self.shape)]
        return self.read(idx)

    def as_dtype(self, dtype: DType, out_shape: Sequence[int], v: Sequence[Expr]) -> Expr:
        """Broadcast read converted to ``dtype``; numbers become constants of it directly."""
        if self.buffer is None:
            assert self.number is not None
            return const(self.number, dtype)
        return cast(self.at(out_shape, v), dtype)


def cast(e: Expr, dtype: DType) -> Expr:
    if e.dtype is dtype:
        return e
    if isinstance(e, Const) and not (dtype is DType.BOOL or e.dtype is DType.BOOL):
        if dtype.is_floating or not isinstance(e.value, float):
            return const(e.value, dtype)
    return Cast(dtype, e)


def min_(a: Expr, b: ExprLike) -> Expr:
    return Binary(BinOp.MIN, a, b if isinstance(b, Expr) else const(b, a.dtype))


def max_(a: Expr, b: ExprLike) -> Expr:
    return Binary(BinOp.MAX, a, b if isinstance(b, Expr) else const(b, a.dtype))


def unary(op: UnOp, a: Expr) -> Expr:
    return Unary(op, a)


def cmp(op: CmpOp, a: Expr, b: ExprLike) -> Expr:
    return Compare(op, a, b if isinstance(b, Expr) else const(b, a.dtype))


def select(c: Expr, t: Expr, f: ExprLike) -> Expr:
    return Select(c, t, f if isinstance(f, Expr) else const(f, t.dtype))


def softmax_exp(shifted: Expr) -> Expr:
    """exp of a softmax's score less its row's maximum (at most 0: the row's largest term is
    exp(0) = 1, and the row's sum at least 1), float32 terms below `EXP_FLUSH_BELOW` given as
    0 (`UnOp.EXP_FLUSHED`). exp's results there are subnormal floats, and on Intel cores each
    operation on one is a microcode assist: scores spread over more than 87 (LeViT's
    attention biases, sharp attention heads) made a softmax 12x128x128 7x slower (828
    against 118 us) and LeViT's subsampling attention 15x. A flushed term is below 1.7e-38:
    it changes the row's sum by nothing and each output by less than that. NaN stays NaN and
    -inf (a masked score) gives 0, as exp does. Other types: exp as it is."""
    return unary(UnOp.EXP_FLUSHED if shifted.dtype is DType.F32 else UnOp.EXP, shifted)


def all_of(conds: Sequence[Expr]) -> Expr | None:
    return conjoin(*conds)


def in_range(e: Expr, extent: int) -> list[Expr]:
    """Conditions for ``0 <= e < extent``."""
    return [cmp(CmpOp.GE, e, 0), cmp(CmpOp.LT, e, extent)]


def identity_of(op: BinOp, dtype: DType) -> Const:
    """The neutral element of a reduction combiner."""
    if op is BinOp.ADD:
        return const(0, dtype)
    if op is BinOp.MUL:
        return const(1, dtype)
    if dtype.is_floating:
        return const(-np.inf if op is BinOp.MAX else np.inf, dtype)
    if dtype is DType.BOOL:
        return const(op is BinOp.MIN, dtype)
    info = np.iinfo(_int_np(dtype))
    return const(int(info.min if op is BinOp.MAX else info.max), dtype)


def _int_np(dtype: DType) -> type:
    return {DType.I64: np.int64, DType.I32: np.int32, DType.I16: np.int16, DType.I8: np.int8,
            DType.U8: np.uint8}[dtype]


class Builder:
    """Collects the blocks of one PrimFunc, hands out unique names, tracks temporaries."""

    def __init__(self) -> None:
        self.names: set[str] = set()  # buffers and vars: one namespace (they meet in C)
        self.block_names: set[str] = set()
        self.stmts: list[Stmt] = []
        self.temps: list[Buffer] = []

    def fresh(self, base: str, taken: set[str] | None = None) -> str:
        taken = self.names if taken is None else taken
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "t"
        if base[0].isdigit():
            base = "t" + base
        return fresh(taken, base)

    def buffer(self, base: str, shape: Sequence[int], dtype: DType) -> Buffer:
        return Buffer(self.fresh(base), tuple(shape), dtype)

    def temp(self, base: str, shape: Sequence[int], dtype: DType,
             scope: Scope = Scope.GLOBAL) -> Buffer:
        """An intermediate buffer, allocated around the whole function body (LOCAL: one a
        schedule will shrink to per-thread scratch, e.g. a row of a row kernel)."""
        buf = Buffer(self.fresh(base), tuple(shape), dtype, scope=scope)
        self.temps.append(buf)
        return buf

    def _loops(self, extents: Sequence[int], prefix: str) -> tuple[list[Var], list[IterVar]]:
        loop_vars, iter_vars = [], []
        for d, extent in enumerate(extents):
            loop = Var(self.fresh(f"{prefix}{d}"))
            loop_vars.append(loop)
            kind = IterKind.SPATIAL if prefix == "i" else IterKind.REDUCE
            iter_vars.append(IterVar(Var(self.fresh("v" + loop.name)), extent, kind))
        return loop_vars, iter_vars

    def compute(self, name: str, out: Buffer,
                fcompute: Callable[[tuple[Var, ...]], Expr]) -> None:
        """``out[v] = fcompute(v)`` for every output position ``v``."""
        loops, ivs = self._loops(out.shape, "i")
        v = tuple(iv.var for iv in ivs)
        body = BufferStore(out, v, cast(fcompute(v), out.dtype))
        self._emit(name, loops, ivs, body, None)

    def reduce(self, name: str, out: Buffer, extents: Sequence[int], op: BinOp,
               fbody: Callable[[tuple[Var, ...], tuple[Var, ...]], Expr],
               finit: Callable[[tuple[Var, ...]], Expr] | None = None) -> None:
        """``out[v] = finit(v) (op) fbody(v, r)`` folded over every reduction position ``r``;
        ``finit`` defaults to the identity of ``op``."""
        def init_value(v: tuple[Var, ...]) -> Expr:
            return cast(finit(v), out.dtype) if finit else identity_of(op, out.dtype)

        if any(e == 0 for e in extents):  # nothing to fold: a block that runs no init
            self.compute(name, out, init_value)
            return
        loops, ivs = self._loops(out.shape, "i")
        rloops, rivs = self._loops(extents, "k")
        v = tuple(iv.var for iv in ivs)
        r = tuple(iv.var for iv in rivs)
        acc = out[v]
        body = BufferStore(out, v, Binary(op, acc, cast(fbody(v, r), out.dtype)))
        init = BufferStore(out, v, init_value(v))
        self._emit(name, loops + rloops, ivs + rivs, body, init)

    def _emit(self, name: str, loops: list[Var], ivs: list[IterVar], body: Stmt,
              init: Stmt | None) -> None:
        stmt: Stmt = Block(self.fresh(name, self.block_names), tuple(ivs), tuple(loops), body,
                           init)
        for loop, iv in zip(reversed(loops), reversed(ivs)):
            stmt = For(loop, iv.extent, stmt)
        self.stmts.append(stmt)

    def body(self) -> Stmt:
        stmt = seq(*self.stmts)
        for buf in reversed(self.temps):
            stmt = Allocate(buf, stmt)
        return stmt
