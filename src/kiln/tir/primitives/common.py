"""What every schedule primitive needs: finding loops and blocks by name with their ancestors,
fresh names, the regions a subtree reads and writes, and buffer compaction."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kiln.tir.arith import Interval, bounds, linear, simplify
from kiln.tir.nodes import (
    Allocate,
    Block,
    Buffer,
    Expr,
    For,
    IterKind,
    Load,
    PrimFunc,
    SeqStmt,
    Stmt,
    Var,
    const,
)
from kiln.tir.visit import (
    all_exprs,
    iter_stmts,
    stores_of,
    substitute,
    vars_of,
)


class ScheduleError(Exception):
    """A primitive refused: the message says what was asked and why it is not legal."""


@dataclass(frozen=True)
class Located:
    """A statement and its ancestors, outermost first."""

    stmt: Stmt
    path: tuple[Stmt, ...]

    @property
    def loops(self) -> list[For]:
        return [s for s in self.path if isinstance(s, For)]


def walk_with_path(stmt: Stmt, path: tuple[Stmt, ...] = ()) -> Iterator[Located]:
    yield Located(stmt, path)
    inner = path + (stmt,)
    if isinstance(stmt, (For, Allocate)):
        yield from walk_with_path(stmt.body, inner)
    elif isinstance(stmt, SeqStmt):
        for s in stmt.stmts:
            yield from walk_with_path(s, inner)
    elif isinstance(stmt, Block):
        yield from walk_with_path(stmt.body, inner)


def find_loop(func: PrimFunc, name: str) -> Located:
    for loc in walk_with_path(func.body):
        if isinstance(loc.stmt, For) and loc.stmt.var.name == name:
            return loc
    raise ScheduleError(f"no loop named {name!r} in {func.name}")


def find_block(func: PrimFunc, name: str) -> Located:
    for loc in walk_with_path(func.body):
        if isinstance(loc.stmt, Block) and loc.stmt.name == name:
            return loc
    raise ScheduleError(f"no block named {name!r} in {func.name}")


def blocks_under(stmt: Stmt) -> list[Block]:
    return [s for s in iter_stmts(stmt) if isinstance(s, Block)]


def taken_names(func: PrimFunc) -> set[str]:
    names = {b.name for b in func.params}
    for s in iter_stmts(func.body):
        if isinstance(s, For):
            names.add(s.var.name)
        elif isinstance(s, Block):
            names.update(iv.var.name for iv in s.iter_vars)
            names.add(s.name)
        elif isinstance(s, Allocate):
            names.add(s.buffer.name)
    return names


def binding_map(block: Block) -> dict[Var, Expr]:
    return {iv.var: b for iv, b in zip(block.iter_vars, block.bindings)}


def loop_vars_of_kind(block: Block, kind: IterKind) -> set[Var]:
    """Loop vars that feed the block's iter vars of ``kind``."""
    found: set[Var] = set()
    for iv, b in zip(block.iter_vars, block.bindings):
        if iv.kind is kind:
            found |= vars_of(b)
    return found


Access = tuple[Block, tuple[Expr, ...], bool]


def accesses(stmt: Stmt, buffer: Buffer) -> list[Access]:
    """Every access of ``buffer`` under ``stmt`` as (block, indices in loop vars, is_write)."""
    return accesses_of(stmt, {buffer}).get(buffer, [])


def accesses_of(stmt: Stmt, buffers: set[Buffer]) -> dict[Buffer, list[Access]]:
    """`accesses` of each of ``buffers`` (those accessed), in one walk of ``stmt``: a loop's
    check for private temporaries walked the kernel twice per temporary."""
    found: dict[Buffer, list[Access]] = {}
    for block in blocks_under(stmt):
        mapping = binding_map(block)
        for part in (block.init, block.body):
            if part is None:
                continue
            for s in stores_of(part):
                if s.buffer in buffers:
                    found.setdefault(s.buffer, []).append(
                        (block, tuple(substitute(i, mapping) for i in s.indices), True))
            for e in all_exprs(part):
                if isinstance(e, Load) and e.buffer in buffers:
                    found.setdefault(e.buffer, []).append(
                        (block, tuple(substitute(i, mapping) for i in e.indices), False))
    return found


def touches(block: Block, buffer: Buffer) -> bool:
    """Whether ``block`` reads or writes ``buffer``."""
    for part in (block.init, block.body):
        if part is None:
            continue
        if any(s.buffer == buffer for s in stores_of(part)):
            return True
        if any(isinstance(e, Load) and e.buffer == buffer for e in all_exprs(part)):
            return True
    return False


def loop_ranges(stmt: Stmt) -> dict[Var, Interval]:
    """The range of every loop var under (and including) ``stmt``."""
    return {s.var: (0, s.extent - 1) for s in iter_stmts(stmt) if isinstance(s, For)}


MAX_ENUMERATION = 4096


def outer_points(outer: Sequence[For]) -> list[dict[Var, int]]:
    """Values of the outer loop vars to evaluate regions at: all of them when few, else the
    corners (regions of the affine accesses kiln builds are extreme at corners)."""
    extents = [max(f.extent, 1) for f in outer]
    total = 1
    for e in extents:
        total *= e
    if total <= MAX_ENUMERATION:
        axes = [range(e) for e in extents]
    else:
        axes = [sorted({0, e - 1}) for e in extents]
    return [dict(zip([f.var for f in outer], p)) for p in itertools.product(*axes)]


def _points_for(outer: Sequence[For], exprs: Sequence[Expr]) -> list[dict[Var, int]]:
    """The outer points at which a dimension's box must be evaluated. Only loops whose vars
    occur in ``exprs`` matter; when every expr is affine with the same coefficient for each
    outer var, moving an outer var shifts all of them alike, so one point gives the extent
    and the ordering of every point (rows in parallel: one evaluation, not one per row)."""
    used = set().union(*(vars_of(e) for e in exprs))
    relevant = [f for f in outer if f.var in used]
    forms = [linear(e) for e in exprs]
    if all(f is not None for f in forms) and all(
            len({form.get(f.var, 0) for form in forms}) == 1  # type: ignore[union-attr]
            for f in relevant):
        return [{f.var: 0 for f in relevant}]
    return outer_points(relevant)


@dataclass(frozen=True)
class Region:
    """Per dimension: a start expression in the outer loop vars and a static extent."""

    starts: tuple[Expr, ...]
    extents: tuple[int, ...]


def region_under(loop: For, outer: Sequence[For], index_lists: Sequence[tuple[Expr, ...]],
                 what: str) -> Region:
    """The box covering ``index_lists`` for one iteration of the ``outer`` loops (which
    include ``loop``), inner loops ranging fully."""
    inner = loop_ranges(loop.body)
    lowest = {v: _zero(v) for v in inner}
    rank = len(index_lists[0])
    starts, extents = [], []
    for d in range(rank):
        exprs = [simplify(idx[d]) for idx in index_lists]
        # the start: each index with inner loop vars at their lowest value
        candidates = [simplify(substitute(e, lowest)) for e in exprs]
        start = candidates[0]
        if any(c != start for c in candidates[1:]):
            raise ScheduleError(f"{what}: the accesses along dimension {d} do not start at the "
                                f"same place ({', '.join(map(str, candidates))})")
        extent = 1
        for point in _points_for(outer, [*exprs, start]):
            ranges = dict(inner)
            ranges.update({v: (x, x) for v, x in point.items()})
            lows, highs = [], []
            for e in exprs:
                box = bounds(e, ranges)
                if box is None:
                    raise ScheduleError(f"{what}: cannot bound index {e} along dimension {d}")
                lows.append(box[0])
                highs.append(box[1])
            at_start = bounds(start, ranges)
            assert at_start is not None
            if min(lows) != at_start[0]:
                raise ScheduleError(f"{what}: accesses along dimension {d} are not increasing "
                                    f"in the inner loops")
            extent = max(extent, max(highs) - min(lows) + 1)
        starts.append(start)
        extents.append(extent)
    return Region(tuple(starts), tuple(extents))


def _zero(v: Var) -> Expr:
    return const(0, v.dtype)
