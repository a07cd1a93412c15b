"""Scratch rows written over their padding: a row pass's last chunk stores its whole vector
into the row's scratch buffer, its guard moved into the stored value (`unmask_scratch_stores`,
after `kiln.tir.tails.version_tails` split the row's chunks into full ones and a guarded last
one)."""

from __future__ import annotations

from kiln.tir.arith import bounds, linear
from kiln.tir.nodes import (
    Allocate,
    Block,
    Buffer,
    BufferStore,
    Expr,
    For,
    IfThenElse,
    IterVar,
    PrimFunc,
    Select,
    SeqStmt,
    Stmt,
    Var,
    const,
)
from kiln.tir.visit import iter_stmts, loads_of, stores_of, substitute

__all__ = ["unmask_scratch_stores"]


def unmask_scratch_stores(func: PrimFunc) -> PrimFunc:
    """A guarded block whose one store goes to a scratch buffer the function allocates stores
    over the whole vector, its value behind the guard, where every position it can reach is
    inside the allocation::

        block exp(vi1 = c * 16 + l) where c * 16 + l < 197:       block exp(vi1 = c * 16 + l):
          row_exp[vi1] = exp(x[r, vi1] - m)                  ->     row_exp[vi1] = select(
                                                                       c * 16 + l < 197,
                                                                       exp(x[r, vi1] - m), 0.0)

    The guarded store is a masked vector store, which Zen 4 runs slowly: softmax over rows
    of 197 took 185 us where its last chunk's scratch was stored so, 167 us unmasked (12 x
    197 rows). The loads stay behind the guard (a select whose side reads past a buffer is
    rendered lazily: masked loads, no masked store). Positions outside the guard held
    whatever the allocation left there, which no correct reader uses; they now hold zeros.
    Only for a buffer with one writing block (its versioned copies included), so that no
    other block's values there are overwritten; never for parameters, reductions (an init)
    or a block that reads what it stores."""
    allocated = {a.buffer for a in iter_stmts(func.body) if isinstance(a, Allocate)}
    writers: dict[Buffer, set[str]] = {}
    for b in iter_stmts(func.body):
        if isinstance(b, Block):
            for st in stores_of(b.body):
                writers.setdefault(st.buffer, set()).add(b.name)

    def walk(s: Stmt, loops: list[For]) -> Stmt:
        if isinstance(s, For):
            return For(s.var, s.extent, walk(s.body, [*loops, s]), s.kind)
        if isinstance(s, Allocate):
            return Allocate(s.buffer, walk(s.body, loops))
        if isinstance(s, SeqStmt):
            return SeqStmt(tuple(walk(x, loops) for x in s.stmts))
        if isinstance(s, IfThenElse):
            return IfThenElse(s.cond, walk(s.then_body, loops),
                              None if s.else_body is None else walk(s.else_body, loops))
        if isinstance(s, Block):
            return _unmasked(s, loops, allocated, writers)
        return s

    return func.with_body(walk(func.body, []))


def _unmasked(block: Block, loops: list[For], allocated: set[Buffer],
              writers: dict[Buffer, set[str]]) -> Block:
    store = block.body
    if block.predicate is None or block.init is not None or not isinstance(store, BufferStore):
        return block
    if store.buffer not in allocated or len(writers.get(store.buffer, ())) != 1 \
            or any(ld.buffer == store.buffer for ld in loads_of(store)):
        return block
    ranges = {f.var: (0, max(f.extent - 1, 0)) for f in loops}
    bound = {iv.var: b for iv, b in zip(block.iter_vars, block.bindings)}
    for idx, extent in zip(store.indices, store.buffer.shape):
        # (affine only: a wrapped index, x % 8, could send a padded lane onto a valid one)
        box = _affine_bounds(substitute(idx, bound), ranges)
        if box is None or box[0] < 0 or box[1] >= extent:
            return block
    ivs = []
    for iv, b in zip(block.iter_vars, block.bindings):
        box = bounds(b, ranges)
        if box is None:
            return block
        ivs.append(IterVar(iv.var, max(iv.extent, box[1] + 1), iv.kind))
    value = Select(block.predicate, store.value, const(0, store.value.dtype))
    return Block(block.name, tuple(ivs), block.bindings,
                 BufferStore(store.buffer, store.indices, value), None, None)


def _affine_bounds(e: Expr, ranges: dict[Var, tuple[int, int]]) -> tuple[int, int] | None:
    """Inclusive bounds of affine ``e`` over ``ranges``, its terms collected first (a
    compacted row's index ``(i0 + a) - i0`` is ``a``, not ``[-i0, i0 + a]``); None where it
    is not affine."""
    form = linear(e)
    if form is None:
        return None
    lo = hi = form.get(None, 0)
    for var, c in form.items():
        if var is None or c == 0:
            continue
        box = ranges.get(var)
        if box is None:
            return None
        lo, hi = lo + min(c * box[0], c * box[1]), hi + max(c * box[0], c * box[1])
    return lo, hi
