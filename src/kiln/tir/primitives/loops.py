"""Loop transformations: split, fuse, reorder, annotate (parallel / vectorize / unroll),
fission and fusion. Each takes a PrimFunc and loop names and returns a new PrimFunc.

split(i, [None, 4]) on ``for i in range(10): block(vi = i)``::

    for i_0 in range(3):
      for i_1 in range(4):
        block(vi = i_0 * 4 + i_1) where i_0 * 4 + i_1 < 10
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kiln.tir.arith import bounds, simplify
from kiln.tir.nodes import (
    Allocate,
    Block,
    CmpOp,
    Compare,
    Expr,
    For,
    ForKind,
    IterKind,
    PrimFunc,
    SeqStmt,
    Stmt,
    Var,
    const,
)
from kiln.tir.primitives.common import (
    ScheduleError,
    accesses,
    accesses_of,
    blocks_under,
    find_loop,
    loop_ranges,
    loop_vars_of_kind,
    region_under,
    taken_names,
    walk_with_path,
)
from kiln.tir.visit import (
    conjoin,
    fresh,
    map_stmt,
    replace_node,
    stores_of,
    substitute_stmt,
    vars_of,
)


def _loop(func: PrimFunc, name: str) -> tuple[For, list[For]]:
    loc = find_loop(func, name)
    assert isinstance(loc.stmt, For)
    return loc.stmt, loc.loops



def _with_predicate(stmt: Stmt, cond: Expr) -> Stmt:
    return map_stmt(stmt, lambda s: Block(s.name, s.iter_vars, s.bindings, s.body, s.init,
                                          conjoin(s.predicate, cond))
                    if isinstance(s, Block) else s)


def split(func: PrimFunc, loop: str, factors: Sequence[int | None]) -> tuple[PrimFunc, list[str]]:
    for_, _ = _loop(func, loop)
    if for_.kind is not ForKind.SERIAL:
        raise ScheduleError(f"split {loop}: the loop is {for_.kind.value}; split it before "
                            f"annotating it")
    if len(factors) < 2 or sum(f is None for f in factors) > 1:
        raise ScheduleError(f"split {loop}: give at least two factors, at most one None")
    if any(f is not None and (not isinstance(f, int) or f < 1) for f in factors):
        raise ScheduleError(f"split {loop}: factors must be positive ints, got {list(factors)}")
    known = math.prod(f for f in factors if f is not None)
    sizes = [f if f is not None else max(1, -(-for_.extent // known)) for f in factors]
    if math.prod(sizes) < for_.extent:
        raise ScheduleError(f"split {loop}: factors {sizes} cover {math.prod(sizes)} of "
                            f"{for_.extent} iterations")
    taken = taken_names(func)
    new_vars = [Var(fresh(taken, f"{loop}_{k}")) for k in range(len(sizes))]
    fused: Expr = const(0, for_.var.dtype)
    for v, size in zip(new_vars, sizes):
        fused = simplify(fused * size + v)
    body = substitute_stmt(for_.body, {for_.var: fused})
    if math.prod(sizes) != for_.extent:  # the last tile runs past the end: guard the blocks
        body = _with_predicate(body, Compare(CmpOp.LT, fused, const(for_.extent,
                                                                    for_.var.dtype)))
    for v, size in reversed(list(zip(new_vars, sizes))):
        body = For(v, size, body)
    return func.with_body(replace_node(func.body, for_, body)), [v.name for v in new_vars]


def _perfect_chain(top: For, names: Sequence[str]) -> list[For]:
    """Loops from ``top`` down to the deepest of ``names``, each the only child of the last."""
    chain, cur = [top], top
    wanted = set(names)
    while not wanted <= {f.var.name for f in chain}:
        if not isinstance(cur.body, For):
            missing = wanted - {f.var.name for f in chain}
            raise ScheduleError(f"loops {sorted(missing)} are not perfectly nested under "
                                f"{top.var.name}")
        cur = cur.body
        chain.append(cur)
    return chain


def fuse(func: PrimFunc, loops: Sequence[str]) -> tuple[PrimFunc, str]:
    if len(loops) < 2:
        raise ScheduleError("fuse: give at least two loops")
    top, _ = _loop(func, loops[0])
    chain = _perfect_chain(top, loops)
    if [f.var.name for f in chain] != list(loops):
        raise ScheduleError(f"fuse {list(loops)}: the loops must be directly nested, in order")
    if any(f.kind is not ForKind.SERIAL for f in chain):
        raise ScheduleError(f"fuse {list(loops)}: only serial loops can be fused")
    extent = math.prod(f.extent for f in chain)
    fused = Var(fresh(taken_names(func), "_".join(loops) + "_fused"))
    mapping: dict[Var, Expr] = {}
    stride = 1
    for f in reversed(chain):
        mapping[f.var] = simplify((fused // stride) % f.extent) if f is not chain[0] else \
            simplify(fused // stride)
        stride *= f.extent
    body = substitute_stmt(chain[-1].body, mapping)
    return func.with_body(replace_node(func.body, top, For(fused, extent, body))), fused.name


def reorder(func: PrimFunc, order: Sequence[str]) -> PrimFunc:
    if len(set(order)) != len(order):
        raise ScheduleError(f"reorder {list(order)}: a loop appears twice")
    locs = [find_loop(func, n) for n in order]
    # the outermost of the given loops is the one every other one lies under
    top = min(locs, key=lambda loc: len(loc.path)).stmt
    assert isinstance(top, For)
    for loc in locs:
        if loc.stmt is not top and top not in loc.path:
            raise ScheduleError(f"reorder {list(order)}: loop {loc.stmt.var.name} is not "  # type: ignore
                                f"nested with {top.var.name}")
    chain = _perfect_chain(top, order)
    _check_no_dependence(chain[-1].body, "reorder", chain)
    slots = [k for k, f in enumerate(chain) if f.var.name in set(order)]
    by_name = {f.var.name: f for f in chain}
    new_chain = list(chain)
    for slot, name in zip(slots, order):
        new_chain[slot] = by_name[name]
    body = chain[-1].body
    for f in reversed(new_chain):
        body = For(f.var, f.extent, body, f.kind)
    return func.with_body(replace_node(func.body, top, body))


def _check_no_dependence(body: Stmt, verb: str, chain: Sequence[For]) -> None:
    """Refuse when one block under the loops reads what another writes: the loop order
    decides which values it sees."""
    blocks = blocks_under(body)
    written = {s.buffer: b.name for b in blocks for s in stores_of(b.body)}
    for b in blocks:
        for buf, writer in written.items():
            if writer != b.name and any(not w for _, _, w in accesses(b, buf)):
                names = ", ".join(f.var.name for f in chain)
                raise ScheduleError(f"{verb} {names}: block {b.name} reads {buf.name} written "
                                    f"by block {writer} under these loops; changing the loop "
                                    f"order would change which values it reads")


def annotate(func: PrimFunc, loop: str, kind: ForKind) -> PrimFunc:
    for_, outer = _loop(func, loop)
    verb = {ForKind.PARALLEL: "parallel", ForKind.PARALLEL_DYNAMIC: "parallel",
            ForKind.VECTORIZED: "vectorize", ForKind.UNROLLED: "unroll",
            ForKind.SERIAL: "serial"}[kind]
    if for_.kind is not ForKind.SERIAL and kind is not ForKind.SERIAL:
        raise ScheduleError(f"{verb} {loop}: the loop is already {for_.kind.value}")
    if kind.is_parallel or kind is ForKind.VECTORIZED:
        _check_independent(func, for_, outer, verb)
    if kind is ForKind.VECTORIZED:
        if any(isinstance(s, For) for s in _stmts_below(for_)):
            raise ScheduleError(f"vectorize {loop}: only an innermost loop can be vectorized")
    if kind.is_parallel:
        nested = [f.var.name for f in outer if f.kind.is_parallel]
        nested += [s.var.name for s in _stmts_below(for_)
                   if isinstance(s, For) and s.kind.is_parallel]
        if nested:
            raise ScheduleError(f"parallel {loop}: loop {nested[0]} is parallel already; "
                                f"nested parallel loops are not supported")
    return func.with_body(replace_node(func.body, for_, For(for_.var, for_.extent, for_.body,
                                                            kind)))


def _stmts_below(for_: For) -> list[Stmt]:
    return [loc.stmt for loc in walk_with_path(for_.body)]


def _check_independent(func: PrimFunc, for_: For, outer: list[For], verb: str) -> None:
    """Iterations run at once: none may be a reduction step, and no two may write the same
    element of a buffer that lives outside the loop."""
    private = {s.buffer for s in _stmts_below(for_) if _is_alloc(s)}
    private |= _private_temps(func, for_, outer)
    for block in blocks_under(for_.body):
        if for_.var in loop_vars_of_kind(block, IterKind.REDUCE):
            raise ScheduleError(f"{verb} {for_.var.name}: it is a reduction axis of block "
                                f"{block.name}; iterations would race on the accumulator")
        for store in stores_of(block.body):
            if store.buffer in private:
                continue
            for _, idx, is_write in accesses(block, store.buffer):
                if is_write and not any(for_.var in vars_of(i) for i in idx):
                    raise ScheduleError(f"{verb} {for_.var.name}: every iteration writes the "
                                        f"same {store.buffer.name} elements in block "
                                        f"{block.name}")


def _private_temps(func: PrimFunc, for_: For, outer: list[For]) -> set:
    """Temporaries that each iteration writes before reading and touches only under the loop:
    buffer compaction allocates them per iteration, so iterations do not share them."""
    found = set()
    temps = [s.buffer for s in _stmts_below_func(func) if isinstance(s, Allocate)]
    if not temps:
        return found
    under_loop, anywhere = accesses_of(for_, set(temps)), accesses_of(func.body, set(temps))
    for temp in temps:
        under = under_loop.get(temp, [])
        if not under or len(under) != len(anywhere.get(temp, [])):
            continue
        reads = [idx for _, idx, w in under if not w]
        writes = [idx for _, idx, w in under if w]
        if not writes:
            continue
        try:
            w = region_under(for_, outer + [for_], writes, "private")
            r = region_under(for_, outer + [for_], reads, "private") if reads else w
        except ScheduleError:
            continue
        if w.starts == r.starts and all(a >= b for a, b in zip(w.extents, r.extents)):
            found.add(temp)
    return found


def _stmts_below_func(func: PrimFunc) -> list[Stmt]:
    return [loc.stmt for loc in walk_with_path(func.body)]


def _is_alloc(s: Stmt) -> bool:
    return isinstance(s, Allocate)


def _siblings(func: PrimFunc, name: str) -> tuple[SeqStmt, int]:
    loc = find_loop(func, name)
    parent = loc.path[-1] if loc.path else None
    if not isinstance(parent, SeqStmt):
        raise ScheduleError(f"loop {name} has no sibling statements")
    index = next(k for k, s in enumerate(parent.stmts) if s is loc.stmt)
    return parent, index


def _order_conflict(first: Stmt, second: Stmt, var_a: Var, var_b: Var, extent: int,
                    outer: Sequence[For]) -> str | None:
    """Is there a buffer element that ``first`` at iteration t1 and ``second`` at an earlier
    iteration t2 < t1 both touch, one of them writing? Then running all of ``first`` before
    all of ``second`` (fission), or interleaving them (fusion), changes the result."""
    ranges = {f.var: (0, f.extent - 1) for f in outer}
    ranges.update(loop_ranges(first))
    ranges.update(loop_ranges(second))
    buffers = {s.buffer for part in (first, second) for s in stores_of(part)}
    for buf in buffers:
        acc_a = [(idx, w) for blk in blocks_under(first) for _, idx, w in accesses(blk, buf)]
        acc_b = [(idx, w) for blk in blocks_under(second) for _, idx, w in accesses(blk, buf)]
        for idx_a, w_a in acc_a:
            for idx_b, w_b in acc_b:
                if not (w_a or w_b):
                    continue
                for t1 in range(1, extent):
                    at_t1 = {**ranges, var_a: (t1, t1)}
                    # every earlier iteration at once first (the bounds over t2 < t1 hold
                    # each one's: no overlap there is none at any), one by one only where
                    # that cannot tell: quadratic in the extent made fusing two passes over
                    # 1500 keys take 10 s
                    if not _overlap(idx_a, at_t1, idx_b, {**ranges, var_b: (0, t1 - 1)}):
                        continue
                    for t2 in range(t1):
                        if _overlap(idx_a, at_t1, idx_b, {**ranges, var_b: (t2, t2)}):
                            return (f"{buf.name} is touched by the first part at iteration {t1} "
                                    f"and by the second at iteration {t2}")
    return None


def _overlap(idx_a: Sequence[Expr], ra: dict[Var, tuple[int, int]], idx_b: Sequence[Expr],
             rb: dict[Var, tuple[int, int]]) -> bool:
    for a, b in zip(idx_a, idx_b):
        box_a, box_b = bounds(a, ra), bounds(b, rb)
        if box_a is None or box_b is None:
            return True  # unknown: assume they may meet
        if box_a[1] < box_b[0] or box_b[1] < box_a[0]:
            return False
    return True


def fission(func: PrimFunc, loop: str, at: int) -> tuple[PrimFunc, list[str]]:
    """``for i: S0..S(at-1); S(at)..`` -> ``for i: S0..; for i_1: S(at)..``."""
    for_, outer = _loop(func, loop)
    if not isinstance(for_.body, SeqStmt) or not 0 < at < len(for_.body.stmts):
        raise ScheduleError(f"fission {loop}: its body needs more than {at} statements")
    first = _seq(for_.body.stmts[:at])
    second = _seq(for_.body.stmts[at:])
    conflict = _order_conflict(first, second, for_.var, for_.var, for_.extent, outer)
    if conflict is not None:
        raise ScheduleError(f"fission {loop}: a dependence crosses iterations: {conflict}")
    new_var = Var(fresh(taken_names(func), f"{loop}_1"))
    loops = SeqStmt((For(for_.var, for_.extent, first, for_.kind),
                     For(new_var, for_.extent, substitute_stmt(second, {for_.var: new_var}),
                         for_.kind)))
    return func.with_body(replace_node(func.body, for_, loops)), [loop, new_var.name]


def _seq(stmts: Sequence[Stmt]) -> Stmt:
    return stmts[0] if len(stmts) == 1 else SeqStmt(tuple(stmts))


def fusion(func: PrimFunc, first: str, second: str) -> tuple[PrimFunc, str]:
    """``for i: A; for j: B`` (adjacent, same extent) -> ``for i: A; B[j := i]``."""
    a, outer = _loop(func, first)
    b, _ = _loop(func, second)
    parent, index = _siblings(func, first)
    if index + 1 >= len(parent.stmts) or parent.stmts[index + 1] is not b:
        raise ScheduleError(f"fusion {first}, {second}: {second} must directly follow {first}")
    if a.extent != b.extent or a.kind is not b.kind:
        raise ScheduleError(f"fusion {first}, {second}: extents {a.extent} and {b.extent} "
                            f"(or kinds) differ")
    conflict = _order_conflict(a.body, b.body, a.var, b.var, a.extent, outer)
    if conflict is not None:
        raise ScheduleError(f"fusion {first}, {second}: a dependence crosses iterations: "
                            f"{conflict}")
    body = SeqStmt((*_parts(a.body), *_parts(substitute_stmt(b.body, {b.var: a.var}))))
    stmts = list(parent.stmts)
    stmts[index:index + 2] = [For(a.var, a.extent, body, a.kind)]
    new_parent: Stmt = stmts[0] if len(stmts) == 1 else SeqStmt(tuple(stmts))
    return func.with_body(replace_node(func.body, parent, new_parent)), first


def _parts(s: Stmt) -> tuple[Stmt, ...]:
    return s.stmts if isinstance(s, SeqStmt) else (s,)

