"""Features of a scheduled loop program, for the tuner's learned cost model.

One fixed-length vector per kernel, computed from the lowered program alone (not from the
space's decisions), so a model trained on one model's kernels can rank another's. As in
Ansor and MetaSchedule the features describe the work, the loop structure and the memory
traffic of each buffer store; kiln sums them over the program's stores and takes the hottest
store (the one executed most) for the loop-shape features:

* work: float ops, stores and loads executed; parameter bytes; arithmetic intensity;
* loops: the threads' share (parallel extent, iterations per parallel iteration), vector lanes
  and the share of float ops in vector loops, unrolled body size, nest depth, the innermost
  extent, bounds checks executed;
* memory: for each cache level (32 KiB, 1 MiB, 32 MiB), the bytes each access brings in from
  beyond it: the footprint of the largest loop level whose data fits, times how often that
  level is entered (a reuse estimate from the loop nest, exact for affine indices); local
  buffers (register tiles, packed panels).

Every count is log2(1 + x), so features of kernels of different sizes share a scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from kiln.tir.arith import bounds
from kiln.tir.nodes import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferStore,
    Expr,
    For,
    ForKind,
    IfThenElse,
    Load,
    PrimFunc,
    Scope,
    Select,
    SeqStmt,
    Stmt,
    Tensorized,
    Unary,
    Var,
)
from kiln.tir.primitives.common import binding_map
from kiln.tir.visit import iter_exprs, substitute

__all__ = ["CACHE_BYTES", "FEATURE_NAMES", "features"]

CACHE_BYTES = (32 * 1024, 1024 * 1024, 32 * 1024 * 1024)  # L1, L2, L3 (last level) per core

FEATURE_NAMES = (
    "float_ops", "stores", "loads", "param_bytes", "intensity",
    "parallel_extent", "per_thread_iterations", "vector_lanes", "vector_op_share",
    "unrolled_body", "depth", "innermost_extent", "checks",
    "traffic_l1", "traffic_l2", "traffic_l3", "local_bytes", "largest_local", "blocks",
)


@dataclass(frozen=True)
class _Loop:
    var: Var
    extent: int
    kind: ForKind


@dataclass(frozen=True)
class _Store:
    store: BufferStore
    loops: tuple[_Loop, ...]  # enclosing loops, outermost first
    bindings: dict[Var, Expr]  # block iter vars -> loop-var expressions

    @property
    def executions(self) -> int:
        return math.prod(loop.extent for loop in self.loops)


def features(func: PrimFunc) -> list[float]:
    """The feature vector of ``func`` (scheduled and lowered), in `FEATURE_NAMES` order."""
    stores = list(_stores(func.body, (), {}))
    locals_ = [b for b in _allocations(func.body) if b.scope is Scope.LOCAL]
    param_bytes = sum(_nbytes(b) for b in (*func.inputs, *func.outputs))
    flops = vector_flops = loads = 0
    traffic = [0.0] * len(CACHE_BYTES)
    for s in stores:
        ops = _float_ops(s.store.value)
        flops += ops * s.executions
        if any(loop.kind is ForKind.VECTORIZED for loop in s.loops):
            vector_flops += ops * s.executions
        accesses = [*_loads(s.store.value), (s.store.buffer, s.store.indices)]
        loads += (len(accesses) - 1) * s.executions
        for buffer, indices in accesses:
            for level, size in enumerate(CACHE_BYTES):
                traffic[level] += _traffic(buffer, indices, s, size)
    hot = max(stores, key=lambda s: s.executions, default=None)
    hot_loops = hot.loops if hot else ()
    parallel = math.prod(x.extent for x in hot_loops if x.kind.is_parallel)
    lanes = max((x.extent for x in hot_loops if x.kind is ForKind.VECTORIZED), default=1)
    unrolled = math.prod(x.extent for x in hot_loops if x.kind is ForKind.UNROLLED)
    values = [
        flops, sum(s.executions for s in stores), loads, param_bytes,
        flops / max(param_bytes, 1), parallel, (hot.executions if hot else 0) / parallel,
        lanes, vector_flops / max(flops, 1), unrolled, len(hot_loops),
        hot_loops[-1].extent if hot_loops else 1, _checks(func.body, 1),
        *traffic, sum(map(_nbytes, locals_)), max(map(_nbytes, locals_), default=0),
        _count_blocks(func.body),
    ]
    shares = {FEATURE_NAMES.index("vector_op_share")}
    return [v if i in shares else math.log2(1 + v) for i, v in enumerate(values)]


def _stores(stmt: Stmt, loops: tuple[_Loop, ...], bindings: dict[Var, Expr]
            ) -> Iterator[_Store]:
    if isinstance(stmt, For):
        yield from _stores(stmt.body, (*loops, _Loop(stmt.var, stmt.extent, stmt.kind)),
                           bindings)
    elif isinstance(stmt, Block):
        inner = {**bindings, **{v: substitute(e, bindings) for v, e in
                                binding_map(stmt).items()}}
        if stmt.init is not None:
            yield from _stores(stmt.init, loops, inner)
        yield from _stores(stmt.body, loops, inner)
    elif isinstance(stmt, BufferStore):
        yield _Store(stmt, loops, bindings)
    elif isinstance(stmt, SeqStmt):
        for s in stmt.stmts:
            yield from _stores(s, loops, bindings)
    elif isinstance(stmt, Allocate):
        yield from _stores(stmt.body, loops, bindings)
    elif isinstance(stmt, Tensorized):
        if stmt.init is not None:
            yield from _stores(stmt.init, loops, bindings)
        yield from _stores(stmt.loop, loops, bindings)
        if stmt.write_back is not None:
            yield from _stores(stmt.write_back, loops, bindings)
    elif isinstance(stmt, IfThenElse):
        yield from _stores(stmt.then_body, loops, bindings)
        if stmt.else_body is not None:
            yield from _stores(stmt.else_body, loops, bindings)


def _allocations(stmt: Stmt) -> Iterator[Buffer]:
    if isinstance(stmt, Allocate):
        yield stmt.buffer
    for child in _children(stmt):
        yield from _allocations(child)


def _children(stmt: Stmt) -> tuple[Stmt, ...]:
    if isinstance(stmt, (For, Allocate)):
        return (stmt.body,)
    if isinstance(stmt, Tensorized):
        return tuple(s for s in (stmt.init, stmt.loop, stmt.write_back) if s is not None)
    if isinstance(stmt, Block):
        return (stmt.body,) if stmt.init is None else (stmt.init, stmt.body)
    if isinstance(stmt, SeqStmt):
        return stmt.stmts
    if isinstance(stmt, IfThenElse):
        return (stmt.then_body,) + ((stmt.else_body,) if stmt.else_body is not None else ())
    return ()


def _checks(stmt: Stmt, times: int) -> int:
    """Conditions evaluated: IfThenElse and block predicates, times their loops' trips."""
    if isinstance(stmt, For):
        return _checks(stmt.body, times * stmt.extent)
    here = times if isinstance(stmt, IfThenElse) or (
        isinstance(stmt, Block) and stmt.predicate is not None) else 0
    return here + sum(_checks(c, times) for c in _children(stmt))


def _count_blocks(stmt: Stmt) -> int:
    return int(isinstance(stmt, Block)) + sum(_count_blocks(c) for c in _children(stmt))


def _float_ops(expr: Expr) -> int:
    return sum(1 for e in iter_exprs(expr)
               if isinstance(e, (Binary, Unary, Select)) and e.dtype.is_floating)


def _loads(expr: Expr) -> list[tuple[Buffer, tuple[Expr, ...]]]:
    return [(e.buffer, e.indices) for e in iter_exprs(expr) if isinstance(e, Load)]


def _nbytes(buffer: Buffer) -> int:
    return math.prod(buffer.shape) * buffer.dtype.itemsize


def _traffic(buffer: Buffer, indices: tuple[Expr, ...], store: _Store, cache: int) -> float:
    """Bytes of ``buffer`` that one access brings in from beyond a cache of ``cache`` bytes:
    the footprint of the outermost loop level whose footprint fits, times the trips of the
    loops around it (each such trip starts with cold data). A local buffer lives in
    registers or L1: no traffic."""
    if buffer.scope is Scope.LOCAL:
        return 0.0
    loops = store.loops
    index = tuple(substitute(i, store.bindings) for i in indices)
    fits_from = len(loops)  # the body alone: one element
    footprint = buffer.dtype.itemsize
    for level in range(len(loops) - 1, -1, -1):
        size = _footprint(buffer, index, loops[level:])
        if size > cache:
            break
        fits_from, footprint = level, size
    trips = math.prod(loop.extent for loop in loops[:fits_from])
    return float(footprint * trips)


def _footprint(buffer: Buffer, index: tuple[Expr, ...], inner: tuple[_Loop, ...]) -> int:
    """Bytes of ``buffer`` touched while ``inner`` loops run (outer vars fixed at 0)."""
    ranges = {loop.var: (0, loop.extent - 1) for loop in inner}
    elements = 1
    for dim, expr in zip(buffer.shape, index):
        free = {v: (0, 0) for v in _vars(expr) if v not in ranges}
        span = bounds(expr, {**ranges, **free})
        elements *= dim if span is None else min(span[1] - span[0] + 1, dim)
    return elements * buffer.dtype.itemsize


def _vars(expr: Expr) -> set[Var]:
    return {e for e in iter_exprs(expr) if isinstance(e, Var)}
