"""Index simplification for allocated buffers, a lowering step after compaction: each access
of a buffer the program allocates is rewritten in the enclosing loop vars (the block's
bindings substituted) and simplified with their ranges, so packed panels and register tiles
index as plain sums::

    A_local[vi0 // 14 - ic * 14 // 14, ...]    with vi0 = ic * 14 + i, i in [0, 14)
      ->  A_local[0, ...]
    C_local[vi0 - (ic * 14 + ir * 14), ...]   ->  C_local[i, ...]

Accesses of a parameter are rewritten too where they divide (a prepacked operand).

Rules (exact for the non-negative indices kiln builds): affine sums are collected;
``(d*q + r) // d = q + r // d`` and ``(d*q + r) % d = r % d`` for terms ``d*q`` whose
coefficients ``d`` divides; ``r // d`` is a constant and ``r % d`` is ``r`` when the range of
``r`` allows. Anything else is left as it was.
"""

from __future__ import annotations

from kiln.tir.arith import Interval, bounds, simplify
from kiln.tir.nodes import (
    INDEX,
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Const,
    Expr,
    For,
    IfThenElse,
    Load,
    PrimFunc,
    SeqStmt,
    Stmt,
    Var,
    const,
)
from kiln.tir.primitives.common import binding_map
from kiln.tir.visit import iter_exprs, map_stmt, substitute

__all__ = ["simplify_indices", "simplify_index"]

Terms = dict[Expr, int]  # atom -> coefficient; const(1) -> the constant


_ONE = const(1, INDEX)


def _terms(e: Expr, ranges: dict[Var, Interval]) -> Terms:
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return {_ONE: e.value}
    if isinstance(e, Binary) and e.op in (BinOp.ADD, BinOp.SUB):
        a, b = _terms(e.a, ranges), _terms(e.b, ranges)
        sign = 1 if e.op is BinOp.ADD else -1
        for k, v in b.items():
            a[k] = a.get(k, 0) + sign * v
        return {k: v for k, v in a.items() if v}
    if isinstance(e, Binary) and e.op is BinOp.MUL:
        a, b = _terms(e.a, ranges), _terms(e.b, ranges)
        if set(a) <= {_ONE}:
            a, b = b, a
        if set(b) <= {_ONE}:
            c = b.get(_ONE, 0)
            return {k: v * c for k, v in a.items() if v * c}
    if isinstance(e, Binary) and e.op in (BinOp.FLOORDIV, BinOp.FLOORMOD):
        d = e.b
        if isinstance(d, Const) and isinstance(d.value, int) and d.value > 0:
            return _divmod(_terms(e.a, ranges), d.value, e.op, ranges)
    return {e: 1}


def _divmod(t: Terms, d: int, op: BinOp, ranges: dict[Var, Interval]) -> Terms:
    quotient: Terms = {}
    rest: Terms = {}
    for atom, coef in t.items():
        if atom == _ONE:
            q, r = divmod(coef, d)
            if q:
                quotient[_ONE] = quotient.get(_ONE, 0) + q
            if r:
                rest[_ONE] = r
        elif coef % d == 0:
            quotient[atom] = coef // d
        else:
            rest[atom] = coef
    r_expr = _build(rest)
    box = bounds(r_expr, ranges)
    if op is BinOp.FLOORMOD:
        if box is not None and 0 <= box[0] and box[1] < d:
            return dict(rest) if rest else {}
        return {Binary(BinOp.FLOORMOD, r_expr, const(d, INDEX)): 1} if rest else {}
    if box is not None and box[0] // d == box[1] // d:
        if box[0] // d:
            quotient[_ONE] = quotient.get(_ONE, 0) + box[0] // d
    else:
        quotient[Binary(BinOp.FLOORDIV, r_expr, const(d, INDEX))] = 1
    return {k: v for k, v in quotient.items() if v}


def _build(t: Terms) -> Expr:
    out: Expr | None = None
    constant = 0
    for atom, coef in t.items():
        if atom == _ONE:
            constant += coef
            continue
        term = atom if coef == 1 else Binary(BinOp.MUL, atom, const(coef, INDEX))
        out = term if out is None else Binary(BinOp.ADD, out, term)
    if out is None:
        return const(constant, INDEX)
    return Binary(BinOp.ADD, out, const(constant, INDEX)) if constant else out


def simplify_index(e: Expr, ranges: dict[Var, Interval]) -> Expr:
    """``e`` as a simplified sum (see the module docstring); ``ranges`` of its loop vars."""
    if e.dtype is not INDEX:
        return e
    return simplify(_build(_terms(e, ranges)))


def simplify_indices(func: PrimFunc) -> PrimFunc:
    """Every access of an allocated buffer in loop vars, simplified (see the module doc)."""
    return func.with_body(_walk(func.body, {}, set(func.params)))


def _walk(s: Stmt, ranges: dict[Var, Interval], params: set[Buffer]) -> Stmt:
    if isinstance(s, For):
        inner = {**ranges, s.var: (0, max(s.extent - 1, 0))}
        return For(s.var, s.extent, _walk(s.body, inner, params), s.kind)
    if isinstance(s, SeqStmt):
        return SeqStmt(tuple(_walk(x, ranges, params) for x in s.stmts))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _walk(s.body, ranges, params))
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _walk(s.then_body, ranges, params),
                          None if s.else_body is None else _walk(s.else_body, ranges, params))
    if isinstance(s, Block):
        return _block(s, ranges, params)
    return s


def _divides(indices: tuple[Expr, ...]) -> bool:
    """Whether a parameter's access divides (a prepacked GEMM operand, ``B[n // 32, k,
    n % 32]``): those are simplified too; plain parameter accesses keep their bindings."""
    return any(isinstance(e, Binary) and e.op in (BinOp.FLOORDIV, BinOp.FLOORMOD)
               for i in indices for e in iter_exprs(i))


def _block(block: Block, ranges: dict[Var, Interval], params: set[Buffer]) -> Block:
    mapping = binding_map(block)

    def fix(idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(simplify_index(substitute(i, mapping), ranges) for i in idx)

    def efn(e: Expr) -> Expr:
        if isinstance(e, Load) and (e.buffer not in params or _divides(e.indices)):
            return Load(e.buffer, fix(e.indices))
        return e

    def sfn(s: Stmt) -> Stmt:
        if isinstance(s, BufferStore) and (s.buffer not in params or _divides(s.indices)):
            return BufferStore(s.buffer, fix(s.indices), s.value)
        return s

    def part(p: Stmt | None) -> Stmt | None:
        return None if p is None else map_stmt(p, sfn, efn)

    body = part(block.body)
    assert body is not None
    return Block(block.name, block.iter_vars, block.bindings, body, part(block.init),
                 block.predicate)

