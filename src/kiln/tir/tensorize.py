"""Tensorize: a loop nest that matches an intrinsic's description becomes a `Tensorized`
statement, which the renderer emits as that intrinsic's micro-kernel.

One intrinsic so far, `Intrinsic.FMA_TILE`, the register tile of a GEMM or convolution: at
each step of a loop ``p``, every row ``i`` of the tile adds a broadcast ``a`` times a vector
row ``b`` to its accumulators. Written as loops, the compiler must keep ``C_local`` in
registers across ``p`` by itself; gcc 12 does for some tiles and spills every accumulator
to the stack on each step for others (on AVX2: 4x16 and 3x32 spill, 6x16 and 5x16 do not;
128x768 @ 768x3072 ran at 0.43x the speed of the tile that does not spill). The intrinsic
holds them in named vector variables, which no compiler spills while they fit::

    for p in range(384):                               tensorized fma_tile(lanes=8):
      prefetch B[jr + 1, p, 0]                           for p in range(384):
      for i in unrolled(4):                    ->          prefetch B[jr + 1, p, 0]
        for j in vectorized(16):                           for i in unrolled(4):
          C_local[i, j] = C_local[i, j]                      for j in vectorized(16):
              + A_local[t, p, i] * B[jr, p, j]                 C_local[i, j] = ...

What matches: a serial loop (or serial loops nested, each the whole body of the one above:
a convolution's taps and input channels) whose body is optional prefetches, then an unrolled
loop ``i`` (or nested ones, a convolution's rows and pixels) around a vectorized loop ``j``
around one store ``acc[..] = acc[..] + a * b``
(in a block without predicate or init, or bare), where ``acc`` is a LOCAL buffer whose
element moves by exactly 1 with ``j`` and not at all with ``p``, ``b`` moves by exactly 1
with ``j`` and not with ``i``, ``a`` does not move with ``j`` (a broadcast) or moves by
exactly 1 with it (a vector: a depthwise convolution's input pixel), all float32, and the
columns are a whole number of vectors. Anything else keeps its loops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from kiln.ir.types import DType
from kiln.tir.arith import linear, simplify
from kiln.tir.nodes import (
    INDEX,
    Binary,
    BinOp,
    Block,
    BufferStore,
    Const,
    Expr,
    For,
    ForKind,
    Intrinsic,
    Load,
    Prefetch,
    PrimFunc,
    Scope,
    SeqStmt,
    Stmt,
    Tensorized,
    Var,
    const,
)
from kiln.tir.primitives.common import binding_map
from kiln.tir.visit import iter_stmts, map_stmt, substitute, vars_of

__all__ = ["AccInit", "FmaTile", "WriteBack", "acc_init", "fma_tile", "fuse_inits",
           "fuse_write_backs", "group_masks", "load_at", "loop_points", "moves_by",
           "tensorize_fma_tiles", "vector_sum", "write_back"]


@dataclass(frozen=True)
class FmaTile:
    """The parts of a loop that matches `Intrinsic.FMA_TILE`; the loads are in loop vars."""

    k: tuple[For, ...]  # p: the accumulation loop, or serial nested ones (a convolution's
    # tap rows, tap columns and input channels), outermost first
    hints: tuple[Prefetch, ...]  # run at the start of each innermost step
    rows: tuple[For, ...]  # i: one loop, or nested ones (a convolution's rows and pixels)
    cols: For  # j (vectorized)
    acc: Load  # the accumulator element at (i, j)
    a: Load  # the row operand at (p, i): broadcast, or a vector too where it moves with j
    b: Load  # the vector operand at (p, j)
    a_is_vector: bool = False  # a depthwise convolution's input: a[p, i, j]
    # a grouped convolution's input where a vector spans several narrow groups: lane l of
    # ``a`` reads element (l // a_group) * a_group + its input channel, one shuffle of the
    # vector each step of the innermost loop (`group_masks`); 0: a broadcast or a vector
    a_group: int = 0


def fma_tile(loop: For, lanes: int) -> FmaTile | None:
    """The FMA_TILE parts of ``loop`` on ``lanes``-wide vectors, or None where it does not
    match (see the module docstring)."""
    if loop.kind is not ForKind.SERIAL or lanes < 1:
        return None
    k_loops = [loop]
    while isinstance(k_loops[-1].body, For) and k_loops[-1].body.kind is ForKind.SERIAL:
        k_loops.append(k_loops[-1].body)
    inner = k_loops[-1]
    stmts = inner.body.stmts if isinstance(inner.body, SeqStmt) else (inner.body,)
    hints = stmts[:-1]
    rows = stmts[-1]
    if not all(isinstance(h, Prefetch) for h in hints):
        return None
    row_loops: list[For] = []
    while isinstance(rows, For) and rows.kind is ForKind.UNROLLED:
        if rows.extent == 0:
            return None
        row_loops.append(rows)
        rows = rows.body
    cols = rows
    if not row_loops or not isinstance(cols, For) or cols.kind is not ForKind.VECTORIZED:
        return None
    if cols.extent % lanes or cols.extent == 0:
        return None
    store = _store(cols.body)
    if store is None:
        return None
    parts = _operands(store)
    if parts is None:
        return None
    acc, a, b = parts
    j = cols.var
    moves = {name: _moves(load) for name, load in (("acc", acc), ("a", a), ("b", b))}
    if any(m is None for m in moves.values()) or moves["acc"].opaque:  # type: ignore[union-attr]
        return None
    tile_vars = {p.var for p in (*k_loops, *row_loops, cols)}
    if j in moves["b"].opaque and j not in moves["a"].opaque:  # type: ignore[union-attr]
        a, b = b, a  # (a group broadcast is a)
        moves["a"], moves["b"] = moves["b"], moves["a"]
    group = 0
    if j in moves["a"].opaque:  # type: ignore[union-attr]
        group = _group_broadcast(a, j, cols.extent, lanes, inner)
        if not group:
            return None
        # (lane 0's address: a vector shuffled, not a vector read in order, see a_group)
        moves["a"] = _moves(_lane_zero(a, j))
        if moves["a"] is None:
            return None
    if any(m.opaque & tile_vars for m in moves.values()):  # type: ignore[union-attr]
        return None
    if moves["b"][j] != 1 and moves["a"][j] == 1:  # a * b written b * a
        a, b = b, a
        moves["a"], moves["b"] = moves["b"], moves["a"]
    if any(moves["b"][r.var] != 0 for r in row_loops) and moves["a"][j] == 1:
        a, b = b, a  # (both vectors: b is the one the rows share)
        moves["a"], moves["b"] = moves["b"], moves["a"]
    ok = (moves["acc"][j] == 1 and all(moves["acc"][p.var] == 0 for p in k_loops)
          and moves["b"][j] == 1
          and all(moves["b"][r.var] == 0 for r in row_loops) and moves["a"][j] in (0, 1))
    if not ok or not _disjoint(moves["acc"], row_loops, cols.extent // lanes, lanes):
        return None
    return FmaTile(tuple(k_loops), tuple(hints), tuple(row_loops), cols,  # type: ignore[arg-type]
                   acc, a, b, moves["a"][j] == 1 and not group, group)


def _group_broadcast(a: Load, j: Var, width: int, lanes: int, inner: For) -> int:
    """G where ``a``'s address moves with ``j`` (the vectorized var, ``width`` wide) as
    ``(j // G) * G`` within one index of unit stride, plus an affine rest without ``j``,
    and the innermost reduction loop ``inner`` (of a constant extent, unrolled by the
    renderer) moves it within the group: then each vector of ``a`` at lane 0 is one vector
    load, shuffled per step of ``inner`` (`group_masks`); else 0."""
    at = [d for d, index in enumerate(a.indices) if j in vars_of(index)]
    if len(at) != 1 or a.buffer.elem_strides[at[0]] != 1 or inner.stop is not None:
        return 0
    group, rest = 0, []
    for term in _terms(a.indices[at[0]]):
        if j not in vars_of(term):
            rest.append(term)
            continue
        found = _group_term(term, j)
        if found is None or group:
            return 0
        group = found
    if not group or lanes % group or width % lanes:
        return 0
    rest_terms = linear(simplify(_sum(rest))) if rest else {}
    if rest_terms is None:
        return 0
    step = rest_terms.get(inner.var, 0)
    others = [d for d, index in enumerate(a.indices) if d != at[0] and inner.var in vars_of(index)]
    if others or step < 0 or step * (inner.extent - 1) >= group:
        return 0  # (each step stays within its lane's group)
    return group


def _lane_zero(a: Load, j: Var) -> Load:
    """``a`` with the ``(j // G) * G`` term of its group broadcast dropped: the address of
    each vector's lane 0 (j moves on by whole vectors)."""
    indices = tuple(_sum([t for t in _terms(index) if j not in vars_of(t)] or [const(0, INDEX)])
                    if j in vars_of(index) else index for index in a.indices)
    return Load(a.buffer, indices)


def _terms(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op is BinOp.ADD:
        return _terms(e.a) + _terms(e.b)
    return [e]


def _sum(terms: list[Expr]) -> Expr:
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _group_term(term: Expr, j: Var) -> int | None:
    """G where ``term`` is ``(j // G) * G`` (either order of the product), G >= 2."""
    if not (isinstance(term, Binary) and term.op is BinOp.MUL):
        return None
    for div, scale in ((term.a, term.b), (term.b, term.a)):
        if isinstance(div, Binary) and div.op is BinOp.FLOORDIV and div.a == j \
                and isinstance(div.b, Const) and isinstance(scale, Const) \
                and div.b.value == scale.value and int(scale.value) >= 2:
            return int(scale.value)
    return None


def group_masks(tile: FmaTile, lanes: int) -> tuple[tuple[int, ...], ...]:
    """For each step ``c`` of a group-broadcast tile's innermost loop, the lane each lane of
    ``a`` takes from the vector loaded at lane 0 with that loop at 0: ``(l // G) * G`` plus
    how far step ``c`` moves the address (`_group_broadcast` checked it stays in the
    group)."""
    inner, group = tile.k[-1], tile.a_group
    index = next(i for i in tile.a.indices if tile.cols.var in vars_of(i))
    start = linear(simplify(substitute(index, {tile.cols.var: const(0, INDEX)})))
    step = start.get(inner.var, 0) if start is not None else 0
    return tuple(tuple((lane // group) * group + c * step for lane in range(lanes))
                 for c in range(inner.extent))


def _disjoint(acc: _Moves, rows: list[For], vectors: int, lanes: int) -> bool:
    """Whether every row's every vector of accumulators is its own ``lanes`` elements of the
    accumulator buffer (two rows that add into the same elements are no register tile)."""
    starts = [0]
    for loop in rows:
        starts = [x + acc[loop.var] * i for x in starts for i in range(loop.extent)]
    starts = sorted(x + v * lanes for x in starts for v in range(vectors))
    return all(b - a >= lanes for a, b in zip(starts, starts[1:]))


@dataclass(frozen=True)
class WriteBack:
    """The loop nest after a tile that stores its accumulators, as the tile emits it from
    the registers: ``targets[r][v]``, the output element that lane 0 of row ``r``'s vector
    ``v`` goes to (each vector's lanes to consecutive elements), and ``value``, the stored
    value as an expression of ``acc`` (the accumulator element): the accumulator itself, or
    MIN/MAX against constants that are not NaN (an activation's bounds: relu, clamp)."""

    targets: tuple[tuple[Load, ...], ...]
    value: Expr
    acc: Load


MAX_WRITE_BACK_ROWS = 64  # (the points of a store nest a match enumerates)


def write_back(tile: FmaTile, nest: Stmt, lanes: int) -> WriteBack | None:
    """``nest`` as a `WriteBack` of ``tile`` (on ``lanes``-wide vectors), or None: unrolled
    loops (or serial ones of one iteration) around a vectorized one as wide as the tile,
    one store (in a block without predicate or init, or bare) of ``value`` into a buffer
    that moves by 1 with the vectorized loop, and every vector of the tile's accumulators
    stored exactly once."""
    found = _store_nest(tile, nest)
    if found is None:
        return None
    row_loops, j, store = found
    if store.buffer == tile.acc.buffer:
        return None
    acc = _bounded_activation_of(store.value, tile.acc)
    if acc is None:
        return None
    target = Load(store.buffer, store.indices)
    moves = _moves(target), _moves(acc)
    if any(m is None or m[j] != 1 for m in moves):
        return None
    points = _vector_points(tile, row_loops, j, acc, lanes)
    if points is None:
        return None
    return WriteBack(tuple(tuple(load_at(target, pt) for pt in row) for row in points),
                     store.value, acc)


def _store_nest(tile: FmaTile, nest: Stmt) -> tuple[list[For], Var, BufferStore] | None:
    """A nest's unrolled loops (or serial ones of one iteration), the var of the vectorized
    loop inside them, as wide as the tile, and its one store (in a block without predicate
    or init, or bare); None where the nest is not that."""
    row_loops: list[For] = []
    while isinstance(nest, For) and (nest.kind is ForKind.UNROLLED or (
            nest.kind is ForKind.SERIAL and nest.extent == 1)):
        row_loops.append(nest)
        nest = nest.body
    if not isinstance(nest, For) or nest.kind is not ForKind.VECTORIZED \
            or nest.extent != tile.cols.extent:
        return None
    store = _store(nest.body)
    return None if store is None else (row_loops, nest.var, store)


def _vector_points(tile: FmaTile, row_loops: list[For], j: Var, element: Load, lanes: int
                   ) -> tuple[tuple[dict[Var, int], ...], ...] | None:
    """For each row ``r`` and vector ``v`` of the tile's accumulators, the point of the
    nest's loops (``j`` at the vector's first lane) where ``element``, an accumulator
    element in the nest's vars, is that vector; None unless every vector is met exactly
    once and nothing else is."""
    vectors = tile.cols.extent // lanes
    # the tile's accumulator vectors by their element offset in the accumulator buffer
    by_offset: dict[int, tuple[int, int]] = {}
    for r, point in enumerate(loop_points(tile.rows)):
        start = _offset(load_at(tile.acc, {**point, tile.cols.var: 0}))
        if start is None:
            return None
        for v in range(vectors):
            by_offset[start + v * lanes] = (r, v)
    points = loop_points(row_loops)
    if len(points) > MAX_WRITE_BACK_ROWS:
        return None
    found: dict[tuple[int, int], dict[Var, int]] = {}
    for point in points:
        start = _offset(load_at(element, {**point, j: 0}))
        if start is None:
            return None
        for v in range(vectors):
            rv = by_offset.get(start + v * lanes)
            if rv is None or rv in found:
                return None
            found[rv] = {**point, j: v * lanes}
    if len(found) != len(by_offset):
        return None
    rows = len(by_offset) // vectors
    return tuple(tuple(found[r, v] for v in range(vectors)) for r in range(rows))


@dataclass(frozen=True)
class AccInit:
    """The loop nest before a tile that sets its accumulators, as the tile emits it into
    the registers: ``points[r][v]``, the values of the nest's loop vars (its vectorized one
    at the vector's first lane) where it sets row ``r``'s vector ``v``, and ``value``, the
    stored expression: float32 loads that move by 1 with the vectorized var (a vector) or not
    at all (a broadcast), float32 constants, and sums of them (a bias, a residual plus a
    bias row, C from the last K block). ``j`` is the vectorized var."""

    points: tuple[tuple[dict[Var, int], ...], ...]
    value: Expr
    j: Var


def acc_init(tile: FmaTile, nest: Stmt, lanes: int) -> AccInit | None:
    """``nest`` as an `AccInit` of ``tile`` (on ``lanes``-wide vectors), or None: unrolled
    loops (or serial ones of one iteration) around a vectorized one as wide as the tile, one
    store (in a block without predicate or init, or bare) of a `vector_sum` into the tile's
    accumulator buffer, moving by 1 with the vectorized loop, and every vector of the tile's
    accumulators set exactly once, nothing else."""
    found = _store_nest(tile, nest)
    if found is None:
        return None
    row_loops, j, store = found
    if store.buffer != tile.acc.buffer:
        return None
    target = Load(store.buffer, store.indices)
    moves = _moves(target)
    if moves is None or moves[j] != 1 or not vector_sum(store.value, j, tile.acc.buffer):
        return None
    points = _vector_points(tile, row_loops, j, target, lanes)
    return None if points is None else AccInit(points, store.value, j)


def vector_sum(value: Expr, j: Var, acc: object) -> bool:
    """Whether ``value`` is float32 loads of buffers other than ``acc``, each a vector
    (moving by 1 with ``j``) or a broadcast (not moving with it), float32 constants, and
    sums of them (a product might be contracted into an FMA by the C compiler in one form
    and not in the other)."""
    if isinstance(value, Const):
        return value.dtype is DType.F32
    if isinstance(value, Load):
        return value.dtype is DType.F32 and value.buffer != acc and moves_by(value, j) in (0, 1)
    return isinstance(value, Binary) and value.op is BinOp.ADD \
        and vector_sum(value.a, j, acc) and vector_sum(value.b, j, acc)


def moves_by(load: Load, var: Var) -> int | None:
    """How many elements ``load``'s address moves per unit of ``var``; None where the
    address is not affine."""
    moves = _moves(load)
    return None if moves is None else moves[var]


def fuse_inits(func: PrimFunc) -> PrimFunc:
    """Every FMA_TILE preceded, in the same sequence, by a loop nest that is its `AccInit`
    takes that nest in (`Tensorized.init`): the renderer then loads the accumulators'
    first values straight into the registers, instead of through the accumulator buffer on
    the stack (a GEMM's residual or bias copied into it, then read back: 392x256x64 with a
    residual, one thread, 70-71% -> 75% of the FMA peak)."""

    def pair(last: Stmt, stmt: Stmt) -> Stmt | None:
        tile = _tile_of(stmt)
        if tile is None or stmt.init is not None or acc_init(tile, last, stmt.lanes) is None:
            return None
        return dataclasses.replace(stmt, init=last)
    return _fuse_pairs(func, pair)


def _tile_of(stmt: Stmt) -> FmaTile | None:
    """The FMA_TILE parts of a tensorized statement that still matches its description."""
    if not (isinstance(stmt, Tensorized) and stmt.intrinsic is Intrinsic.FMA_TILE):
        return None
    return fma_tile(stmt.loop, stmt.lanes)


def _fuse_pairs(func: PrimFunc, pair: Callable[[Stmt, Stmt], Stmt | None]) -> PrimFunc:
    """Each two statements next to each other in a sequence that ``pair`` joins (it gives
    the one statement for both, or None) replaced by that statement, left to right."""

    def fn(s: Stmt) -> Stmt:
        if not isinstance(s, SeqStmt):
            return s
        out: list[Stmt] = []
        for stmt in s.stmts:
            joined = pair(out[-1], stmt) if out else None
            if joined is not None:
                out[-1] = joined
            else:
                out.append(stmt)
        return SeqStmt(tuple(out)) if len(out) > 1 else out[0]
    return func.with_body(map_stmt(func.body, fn))


def loop_points(loops: list[For] | tuple[For, ...]) -> list[dict[Var, int]]:
    """Every combination of the loops' values, in loop order (a tile's rows)."""
    points: list[dict[Var, int]] = [{}]
    for loop in loops:
        points = [{**pt, loop.var: x} for pt in points for x in range(loop.extent)]
    return points


def _offset(load: Load) -> int | None:
    """The flat element offset of a load whose indices are all constants, else None."""
    if not all(isinstance(i, Const) for i in load.indices):
        return None
    return sum(int(i.value) * stride  # type: ignore[attr-defined]
               for i, stride in zip(load.indices, load.buffer.elem_strides))


def _bounded_activation_of(value: Expr, acc: Load) -> Load | None:
    """The one load of ``acc``'s buffer in ``value`` where ``value`` is that load, or MIN/MAX
    of a constant (f32, not NaN) and such a value; else None."""
    if isinstance(value, Load):
        return value if value.buffer == acc.buffer and value.dtype is DType.F32 else None
    if not (isinstance(value, Binary) and value.op in (BinOp.MIN, BinOp.MAX)):
        return None
    bound, rest = (value.a, value.b) if isinstance(value.a, Const) else (value.b, value.a)
    if not (isinstance(bound, Const) and bound.dtype is DType.F32) \
            or bound.value != bound.value:  # (NaN)
        return None
    return _bounded_activation_of(rest, acc)


def fuse_write_backs(func: PrimFunc) -> PrimFunc:
    """Every FMA_TILE followed, in the same sequence, by a loop nest that is its `WriteBack`
    takes that nest in (`Tensorized.write_back`): the renderer then stores the accumulators
    from the registers, the activation on the vectors, instead of through the accumulator
    buffer and a scalar loop that the compiler vectorizes (a clamp there became 9 vector
    instructions on AVX2, 4 on the registers: MobileNetV2's 12544x16 @ 16x96 GEMM with its
    relu6, 380 -> 351 us)."""

    def pair(last: Stmt, stmt: Stmt) -> Stmt | None:
        tile = _tile_of(last)
        if tile is None or last.write_back is not None \
                or write_back(tile, stmt, last.lanes) is None:
            return None
        return dataclasses.replace(last, write_back=stmt)
    return _fuse_pairs(func, pair)


def tensorize_fma_tiles(func: PrimFunc, loop_names: tuple[str, ...], lanes: int) -> PrimFunc:
    """Every loop named in ``loop_names`` that matches FMA_TILE on ``lanes``-wide vectors
    becomes `Tensorized`, the names tried in order, outermost loop first: a convolution's
    interior tiles take the whole reduction over their taps, the border tiles (whose taps
    keep guards) the loop over channels inside each tap. A nest that matches no name keeps
    its loops."""
    body = func.body
    for name in loop_names:
        inside = {id(s) for t in iter_stmts(body) if isinstance(t, Tensorized)
                  for s in iter_stmts(t.loop)}

        def fn(s: Stmt, name: str = name, inside: set[int] = inside) -> Stmt:
            if (isinstance(s, For) and s.var.name == name and id(s) not in inside
                    and fma_tile(s, lanes) is not None):
                return Tensorized(Intrinsic.FMA_TILE, lanes, s)
            return s
        body = map_stmt(body, fn)
    return func.with_body(body)


def _store(body: Stmt) -> BufferStore | None:
    """The one store of the tile's body, its block's iter vars replaced by their bindings."""
    if isinstance(body, BufferStore):
        return body
    if not isinstance(body, Block) or body.init is not None or body.predicate is not None:
        return None
    if not isinstance(body.body, BufferStore):
        return None
    mapping = binding_map(body)
    store = body.body
    return BufferStore(store.buffer, tuple(substitute(x, mapping) for x in store.indices),
                       substitute(store.value, mapping))


def _operands(store: BufferStore) -> tuple[Load, Load, Load] | None:
    """(acc, a, b) of ``acc = acc + a * b`` (or ``a * b + acc``), all float32 loads."""
    value = store.value
    if store.buffer.scope is not Scope.LOCAL or store.buffer.dtype is not DType.F32:
        return None
    if not (isinstance(value, Binary) and value.op is BinOp.ADD):
        return None
    acc = Load(store.buffer, store.indices)
    product = value.b if value.a == acc else value.a if value.b == acc else None
    if not (isinstance(product, Binary) and product.op is BinOp.MUL):
        return None
    a, b = product.a, product.b
    if not (isinstance(a, Load) and isinstance(b, Load)):
        return None
    if store.buffer in (a.buffer, b.buffer):  # (the tile would read what it is adding to)
        return None
    if a.dtype is not DType.F32 or b.dtype is not DType.F32:
        return None
    return acc, a, b


class _Moves(dict[Var, int]):
    """How far (in elements) a load's address moves per unit of each var (0 if absent;
    None for a var in an index that is not affine: unknown)."""

    def __init__(self) -> None:
        super().__init__()
        self.opaque: set[Var] = set()  # the vars of indices that are not affine

    def __missing__(self, key: Var) -> int | None:  # type: ignore[override]
        return None if key in self.opaque else 0


def _moves(load: Load) -> _Moves | None:
    """The load's flat element offset as affine coefficients per var. An index that is not
    affine (a division, a min, a select) leaves its vars' movement unknown (None), which is
    no matter where they are loops outside the tile (grouped-query attention's key head,
    h // group)."""
    total = _Moves()
    for index, stride in zip(load.indices, load.buffer.elem_strides):
        if isinstance(index, Const):
            continue
        terms = linear(index)
        if terms is None:
            total.opaque |= vars_of(index)
            continue
        for var, coef in terms.items():
            if var is not None:
                total[var] = total.get(var, 0) + coef * stride
    for var in total.opaque:
        total.pop(var, None)
    return total


def load_at(load: Load, values: dict[Var, int]) -> Load:
    """``load`` with some vars fixed (a renderer's row and first column of a vector)."""
    mapping: dict[Var, Expr] = {v: const(x, INDEX) for v, x in values.items()}
    return Load(load.buffer, tuple(simplify(substitute(x, mapping)) for x in load.indices))
