"""Where a block computes: compute_at (producer into a consumer's loop), reverse_compute_at
(consumer into a producer's loop) and compute_inline (producer into its consumers' loads).

compute_at(add, i0_1) on add -> relu::

    for i0 in range(4):                        for i0_1 in range(4):
      for i1 in range(8):                        for ax0 in range(1):
        block add(vi0 = i0, vi1 = i1)              for ax1 in range(8):
    for i0_1 in range(4):              ->            block add(vi0 = i0_1 + ax0, vi1 = ax1)
      for i1_1 in range(8):                      for i1_1 in range(8):
        block relu(... add[vi0_1, vi1_1])          block relu(... add[vi0_1, vi1_1])
"""

from __future__ import annotations

from kiln.tir.arith import bounds, linear, simplify
from kiln.tir.nodes import (
    Allocate,
    Block,
    Buffer,
    BufferStore,
    CmpOp,
    Compare,
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
from kiln.tir.primitives.common import (
    Located,
    Region,
    ScheduleError,
    accesses,
    blocks_under,
    find_block,
    find_loop,
    loop_vars_of_kind,
    outer_points,
    region_under,
    taken_names,
    walk_with_path,
)
from kiln.tir.visit import (
    conjoin,
    fresh,
    loads_of,
    map_stmt,
    replace_node,
    stores_of,
    substitute,
)


def written_buffer(block: Block, verb: str) -> Buffer:
    bufs = {s.buffer for s in stores_of(block.body)}
    if len(bufs) != 1:
        raise ScheduleError(f"{verb} {block.name}: the block writes {len(bufs)} buffers, not one")
    return bufs.pop()


def remove_block(func: PrimFunc, name: str) -> PrimFunc:
    """``func`` without the block and the loops that held nothing else."""
    loc = find_block(func, name)
    target: Stmt = loc.stmt
    for parent in reversed(loc.path):
        if isinstance(parent, For):
            target = parent
        else:
            break
    return func.with_body(replace_node(func.body, target, SeqStmt(())))


def _comes_before(func: PrimFunc, first: Stmt, second: Stmt) -> bool:
    order = [loc.stmt for loc in walk_with_path(func.body)]
    return next(k for k, s in enumerate(order) if s is first) < \
        next(k for k, s in enumerate(order) if s is second)


def _spatial_identity(block: Block, indices: tuple[Expr, ...]) -> bool:
    spatial = tuple(iv.var for iv in block.iter_vars if iv.kind is IterKind.SPATIAL)
    return indices == spatial


def _nest_over_region(func: PrimFunc, block: Block, region: Region, outer: list[For]) -> Stmt:
    """A fresh loop nest running ``block`` over ``region`` of its spatial iter vars (and over
    the whole of its reduction iter vars), guarded where the region leaves the domain."""
    taken = taken_names(func)
    loops: list[For] = []
    bindings: list[Expr] = []
    guards: list[Expr] = []
    spatial_k = 0
    for iv in block.iter_vars:
        if iv.kind is IterKind.SPATIAL:
            start, extent = region.starts[spatial_k], region.extents[spatial_k]
            spatial_k += 1
            ax = Var(fresh(taken, f"ax{spatial_k - 1}"))
            loops.append(For(ax, extent, SeqStmt(())))
            value = simplify(start + ax)
            bindings.append(value)
            lo, hi = _range_over(start, outer)
            if lo < 0:
                guards.append(Compare(CmpOp.GE, value, const(0, value.dtype)))
            if hi + extent > iv.extent:
                guards.append(Compare(CmpOp.LT, value, const(iv.extent, value.dtype)))
        else:
            rv = Var(fresh(taken, f"r{len(loops)}"))
            loops.append(For(rv, iv.extent, SeqStmt(())))
            bindings.append(rv)
    predicate = conjoin(*guards)
    stmt: Stmt = Block(block.name, block.iter_vars, tuple(bindings), block.body, block.init,
                       predicate)
    for f in reversed(loops):
        stmt = For(f.var, f.extent, stmt)
    return stmt


def _range_over(start: Expr, outer: list[For]) -> tuple[int, int]:
    form = linear(start)
    extents = {f.var: f.extent for f in outer}
    if form is not None and all(v is None or v in extents for v in form):
        # affine: the extremes are at the ends of each loop's range, term by term
        lo = hi = form.get(None, 0)
        for v, k in form.items():
            if v is not None:
                ends = (0, k * (max(extents[v], 1) - 1))
                lo, hi = lo + min(ends), hi + max(ends)
        return lo, hi
    lows, highs = [], []
    for point in outer_points(outer):
        box = bounds(start, {v: (x, x) for v, x in point.items()})
        assert box is not None
        lows.append(box[0])
        highs.append(box[1])
    return min(lows), max(highs)


def _insert(func: PrimFunc, loop_name: str, nest: Stmt, at_end: bool) -> PrimFunc:
    loop = find_loop(func, loop_name).stmt
    assert isinstance(loop, For)
    parts = loop.body.stmts if isinstance(loop.body, SeqStmt) else (loop.body,)
    body = SeqStmt((*parts, nest) if at_end else (nest, *parts))
    return func.with_body(replace_node(func.body, loop, For(loop.var, loop.extent, body,
                                                            loop.kind)))


def _locate(func: PrimFunc, block: str, loop: str, verb: str) -> tuple[Located, Located]:
    bloc, lloc = find_block(func, block), find_loop(func, loop)
    if lloc.stmt in bloc.path:
        raise ScheduleError(f"{verb} {block} at {loop}: the block is already under that loop")
    return bloc, lloc


def compute_at(func: PrimFunc, block: str, loop: str) -> PrimFunc:
    """Compute the producer ``block`` inside ``loop``, just the region that the consumers
    under ``loop`` read in one iteration."""
    verb = "compute_at"
    bloc, lloc = _locate(func, block, loop, verb)
    producer, for_ = bloc.stmt, lloc.stmt
    assert isinstance(producer, Block) and isinstance(for_, For)
    buf = written_buffer(producer, verb)
    for s in stores_of(producer.body):
        if not _spatial_identity(producer, s.indices):
            raise ScheduleError(f"{verb} {block}: its store {buf.name}[...] is not indexed by "
                                f"its spatial iter vars in order")
    consumers = [b for b in blocks_under(func.body) if b is not producer
                 and any(not w for _, _, w in accesses(b, buf))]
    if not consumers:
        raise ScheduleError(f"{verb} {block}: no block reads {buf.name}")
    outside = [b.name for b in consumers if b not in blocks_under(for_)]
    if outside:
        raise ScheduleError(f"{verb} {block} at {loop}: block {outside[0]} reads {buf.name} "
                            f"outside the loop, so it must stay computed in full")
    if not _comes_before(func, producer, for_):
        raise ScheduleError(f"{verb} {block} at {loop}: the block runs after the loop; its "
                            f"readers would see values it has not yet written")
    _check_no_rerun_over_accumulation(func, producer, buf, lloc, f"{verb} {block} at {loop}")
    reads = [idx for _, idx, w in accesses(for_, buf) if not w]
    region = region_under(for_, lloc.loops + [for_], reads, f"{verb} {block}")
    nest = _nest_over_region(func, producer, region, lloc.loops + [for_])
    func = remove_block(func, block)
    return _insert(func, loop, nest, at_end=False)


def _check_no_rerun_over_accumulation(func: PrimFunc, producer: Block, buf: Buffer,
                                      lloc: Located, what: str) -> None:
    """Under ``loop`` the producer runs once per iteration of it and of the loops around it.
    Where one of those loops steps a reduction that another block accumulates into ``buf``
    (a decomposed init and its update), each rerun would overwrite the partial result.
    That is sound only when the producer reloads the partial result: it reads a buffer that
    some block under that loop writes back (cache_inplace's load at a register tile)."""
    for_ = lloc.stmt
    assert isinstance(for_, For)
    sources = {ld.buffer for ld in loads_of(producer.body)}
    for writer in blocks_under(func.body):
        if writer is producer or not any(s.buffer == buf for s in stores_of(writer.body)):
            continue
        steps = loop_vars_of_kind(writer, IterKind.REDUCE)
        for f in [*lloc.loops, for_]:
            if f.var not in steps or writer not in blocks_under(f):
                continue
            reloads = f is not for_ and any(s.buffer in sources for b in blocks_under(f)
                                            for s in stores_of(b.body))
            if not reloads:
                raise ScheduleError(f"{what}: block {writer.name} accumulates into {buf.name} "
                                    f"over loop {f.var.name}; {producer.name} would run again "
                                    f"at every step of it and overwrite the partial result")


def reverse_compute_at(func: PrimFunc, block: str, loop: str) -> PrimFunc:
    """Compute the consumer ``block`` inside ``loop``, right after the producer writes the
    region it reads (an epilogue or a cache write-back per tile)."""
    verb = "reverse_compute_at"
    bloc, lloc = _locate(func, block, loop, verb)
    consumer, for_ = bloc.stmt, lloc.stmt
    assert isinstance(consumer, Block) and isinstance(for_, For)
    if consumer.is_reduction:
        raise ScheduleError(f"{verb} {block}: the block is a reduction")
    written = {s.buffer for b in blocks_under(for_) for s in stores_of(b.body)}
    read = [ld for ld in _loads(consumer) if ld.buffer in written]
    if not read:
        raise ScheduleError(f"{verb} {block} at {loop}: it reads nothing written under the loop")
    buf = read[0].buffer
    if any(not _spatial_identity(consumer, ld.indices) for ld in read):
        raise ScheduleError(f"{verb} {block}: it reads {buf.name} at other positions than its "
                            f"own (not elementwise); use compute_at on the producer instead")
    writers = [b for b in blocks_under(func.body) if any(s.buffer == buf
                                                         for s in stores_of(b.body))]
    outside = [b for b in writers if b not in blocks_under(for_)]
    if outside:
        _check_written_before(func, outside, lloc, buf, f"{verb} {block} at {loop}")
    if not _comes_before(func, for_, consumer):
        raise ScheduleError(f"{verb} {block} at {loop}: the block runs before the loop")
    writes = [idx for _, idx, w in accesses(for_, buf) if w]
    region = region_under(for_, lloc.loops + [for_], writes, f"{verb} {block}")
    nest = _nest_over_region(func, consumer, region, lloc.loops + [for_])
    func = remove_block(func, block)
    return _insert(func, loop, nest, at_end=True)


def _check_written_before(func: PrimFunc, outside: list[Block], lloc: Located, buf: Buffer,
                          what: str) -> None:
    """Writers of ``buf`` outside the loop are allowed when they all run once before it (a
    cache_inplace load) and the loop itself writes every element of ``buf``: then the last
    write of each element happens inside the loop, and the consumer runs after it."""
    for_ = lloc.stmt
    assert isinstance(for_, For)
    for b in outside:
        bpath = find_block(func, b.name).path
        shared = [s for s in bpath if isinstance(s, For) and s in lloc.path]
        if shared or not _comes_before(func, b, for_):
            raise ScheduleError(f"{what}: {buf.name} is also written outside it, by block "
                                f"{b.name}, not once before it")
    ranges = {f.var: (0, f.extent - 1) for f in lloc.loops}
    ranges.update({s.var: (0, s.extent - 1) for s in walk_stmts(for_) if isinstance(s, For)})
    writes = [idx for _, idx, w in accesses(for_, buf) if w]
    for d, extent in enumerate(buf.shape):
        boxes = [bounds(idx[d], ranges) for idx in writes]
        known = [box for box in boxes if box is not None]
        if len(known) < len(boxes) or min(lo for lo, _ in known) > 0 \
                or max(hi for _, hi in known) < extent - 1:
            raise ScheduleError(f"{what}: {buf.name} is also written outside it and the loop "
                                f"does not write all of it along dimension {d}")


def walk_stmts(stmt: Stmt) -> list[Stmt]:
    return [loc.stmt for loc in walk_with_path(stmt)]


def _loads(block: Block) -> list[Load]:
    return loads_of(block.body)


def compute_inline(func: PrimFunc, block: str) -> PrimFunc:
    """Replace every read of the block's output by its defining expression; the block and
    its buffer disappear (how a chain of elementwise ops becomes one loop nest)."""
    verb = "compute_inline"
    producer = find_block(func, block).stmt
    assert isinstance(producer, Block)
    if producer.is_reduction or producer.init is not None:
        raise ScheduleError(f"{verb} {block}: the block is a reduction; only a spatial block "
                            f"can be inlined")
    if not isinstance(producer.body, BufferStore):
        raise ScheduleError(f"{verb} {block}: the body is not a single store")
    store = producer.body
    buf = store.buffer
    if buf in func.params:
        raise ScheduleError(f"{verb} {block}: it writes {buf.name}, a function parameter")
    if store.indices != tuple(iv.var for iv in producer.iter_vars):
        raise ScheduleError(f"{verb} {block}: the store {buf.name}[...] is not indexed by the "
                            f"iter vars in order")
    if any(ld.buffer == buf for ld in _loads(producer)):
        raise ScheduleError(f"{verb} {block}: the block reads its own output")
    others = [b for b in blocks_under(func.body) if b is not producer]
    if any(s.buffer == buf for b in others for s in stores_of(b.body)):
        raise ScheduleError(f"{verb} {block}: another block also writes {buf.name}")
    ivs = [iv.var for iv in producer.iter_vars]

    def inline(e: Expr) -> Expr:
        if isinstance(e, Load) and e.buffer == buf:
            return substitute(store.value, dict(zip(ivs, e.indices)))
        return e

    func = remove_block(func, block)
    body = map_stmt(func.body, efn=inline)
    # the buffer is gone: drop its allocation
    body = map_stmt(body, lambda s: s.body if isinstance(s, Allocate) and s.buffer == buf
                    else s)
    return func.with_body(body)

