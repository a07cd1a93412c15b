"""Staging buffers and reduction init: cache_read, cache_write, cache_inplace,
decompose_reduction.

cache_write(C) on a matmul block gives a local accumulator and a write-back block::

    alloc C_local: f32[M, N] local:
      for i, j, k: block C(...): init: C_local[vi, vj] = 0.0
                                 C_local[vi, vj] = C_local[vi, vj] + A[vi, vk] * B[vk, vj]
      for ax0, ax1: block C_local(...): C[v0, v1] = C_local[v0, v1]

then ``reverse_compute_at(C_local_wb, tile_loop)`` and `kiln.tir.compact.compact_buffers`
shrink it to one register tile.
"""

from __future__ import annotations

from kiln.tir.nodes import (
    Allocate,
    Block,
    Buffer,
    BufferStore,
    For,
    IterKind,
    IterVar,
    PrimFunc,
    Scope,
    SeqStmt,
    Stmt,
    Var,
)
from kiln.tir.primitives.common import (
    ScheduleError,
    blocks_under,
    find_block,
    find_loop,
    loop_vars_of_kind,
    taken_names,
)
from kiln.tir.primitives.compute_location import written_buffer
from kiln.tir.visit import (
    conjoin,
    conjuncts,
    fresh,
    loads_of,
    replace_buffer,
    replace_node,
    stores_of,
    substitute,
    substitute_stmt,
    vars_of,
)


def _copy_nest(taken: set[str], name: str, src: Buffer, dst: Buffer) -> Stmt:
    loops = [Var(fresh(taken, f"ax{d}")) for d in range(src.rank)]
    ivs = tuple(IterVar(Var(fresh(taken, f"v_{v.name}")), n) for v, n in zip(loops, src.shape))
    v = tuple(iv.var for iv in ivs)
    stmt: Stmt = Block(name, ivs, tuple(loops), BufferStore(dst, v, src[v]))
    for loop, n in reversed(list(zip(loops, src.shape))):
        stmt = For(loop, n, stmt)
    return stmt


def _nest_top(func: PrimFunc, block: Block) -> Stmt:
    """The outermost loop of the nest that holds only ``block``'s ancestry."""
    loc = find_block(func, block.name)
    top: Stmt = block
    for parent in reversed(loc.path):
        if not isinstance(parent, For):
            break
        top = parent
    return top


def _fresh_buffer(func: PrimFunc, buf: Buffer, scope: Scope) -> tuple[Buffer, set[str]]:
    taken = taken_names(func)
    name = fresh(taken, f"{buf.name}_{scope.value}")
    return Buffer(name, buf.shape, buf.dtype, None, scope), taken


def cache_read(func: PrimFunc, block: str, buffer: str,
               scope: Scope = Scope.LOCAL) -> tuple[PrimFunc, str]:
    """Copy ``buffer`` into a new buffer that ``block`` reads instead; returns the copy
    block (place it with compute_at to copy only one tile: packing)."""
    consumer = find_block(func, block).stmt
    assert isinstance(consumer, Block)
    reads = [ld.buffer for ld in loads_of(consumer.body) if ld.buffer.name == buffer]
    if not reads:
        raise ScheduleError(f"cache_read {block}: the block does not read {buffer}")
    src = reads[0]
    dst, taken = _fresh_buffer(func, src, scope)
    copy = _copy_nest(taken, dst.name, src, dst)
    new_consumer = Block(consumer.name, consumer.iter_vars, consumer.bindings,
                         replace_buffer(consumer.body, src, dst), consumer.init,
                         consumer.predicate)
    body = replace_node(func.body, consumer, new_consumer)
    func = func.with_body(body)
    loc = find_block(func, new_consumer.name)
    top = loc.loops[0] if loc.loops else loc.stmt  # before the consumer's whole loop nest
    body = replace_node(func.body, top, SeqStmt((copy, top)))
    return func.with_body(Allocate(dst, body)), dst.name


def cache_write(func: PrimFunc, block: str, scope: Scope = Scope.LOCAL) -> tuple[PrimFunc, str]:
    """``block`` computes into a new buffer; a write-back block copies it to the original.
    Returns the write-back block."""
    producer = find_block(func, block).stmt
    assert isinstance(producer, Block)
    buf = written_buffer(producer, "cache_write")
    others = [b.name for b in blocks_under(func.body) if b is not producer
              and any(s.buffer == buf for s in stores_of(b.body))]
    if others:
        raise ScheduleError(f"cache_write {block}: block {others[0]} also writes {buf.name}; "
                            f"cache_write before decompose_reduction")
    dst, taken = _fresh_buffer(func, buf, scope)
    writeback = _copy_nest(taken, dst.name, dst, buf)
    new_producer = Block(producer.name, producer.iter_vars, producer.bindings,
                         replace_buffer(producer.body, buf, dst),
                         None if producer.init is None else replace_buffer(producer.init, buf,
                                                                           dst),
                         producer.predicate)
    func = func.with_body(replace_node(func.body, producer, new_producer))
    top = _nest_top(func, new_producer)
    body = replace_node(func.body, top, SeqStmt((top, writeback)))
    return func.with_body(Allocate(dst, body)), dst.name



def decompose_reduction(func: PrimFunc, block: str, loop: str) -> tuple[PrimFunc, str]:
    """Move the block's init into its own block just before ``loop`` (over the spatial loops
    at or under it), leaving a pure update::

        for i, j, k:                          for i: for j: block C_init: C[vi, vj] = 0
          block C: init: C[vi, vj] = 0   ->   for i, j, k:
                   C[vi, vj] += ...              block C: C[vi, vj] += ...
    (with loop = i; with loop = k the init block sits inside j, before k)."""
    verb = "decompose_reduction"
    loc = find_block(func, block)
    red = loc.stmt
    assert isinstance(red, Block)
    if red.init is None:
        raise ScheduleError(f"{verb} {block}: the block has no init")
    for_loc = find_loop(func, loop)
    for_ = for_loc.stmt
    assert isinstance(for_, For)
    if for_ not in loc.path:
        raise ScheduleError(f"{verb} {block} at {loop}: the block is not under that loop")
    loops = loc.loops
    at = loops.index(for_)
    reduce_vars = loop_vars_of_kind(red, IterKind.REDUCE)
    spatial_vars = loop_vars_of_kind(red, IterKind.SPATIAL)
    above = [f.var.name for f in loops[:at] if f.var in reduce_vars]
    if above:
        raise ScheduleError(f"{verb} {block} at {loop}: reduction loop {above[0]} is outside "
                            f"it, so the init would run on every step of it")
    both = [f.var.name for f in loops[at:] if f.var in reduce_vars and f.var in spatial_vars]
    if both:
        raise ScheduleError(f"{verb} {block}: loop {both[0]} feeds spatial and reduction "
                            f"iter vars")
    taken = taken_names(func)
    kept = [f for f in loops[at:] if f.var in spatial_vars]
    new_loops = {f.var: Var(fresh(taken, f"{f.var.name}_init")) for f in kept}
    spatial = [(iv, b) for iv, b in zip(red.iter_vars, red.bindings)
               if iv.kind is IterKind.SPATIAL]
    new_ivs = {iv.var: Var(fresh(taken, f"{iv.var.name}_init")) for iv, _ in spatial}
    allowed = {f.var for f in loops[:at]} | set(new_loops.values())
    pred = None
    for c in conjuncts(red.predicate):
        c = substitute(c, new_loops)
        if vars_of(c) <= allowed:
            pred = conjoin(pred, c)
    init_block: Stmt = Block(fresh(set(b.name for b in blocks_under(func.body)),
                                   f"{block}_init"),
                             tuple(IterVar(new_ivs[iv.var], iv.extent) for iv, _ in spatial),
                             tuple(substitute(b, new_loops) for _, b in spatial),
                             substitute_stmt(red.init, dict(new_ivs)), None, pred)
    init_name = init_block.name  # type: ignore[attr-defined]
    for f in reversed(kept):
        init_block = For(new_loops[f.var], f.extent, init_block)
    body = replace_node(func.body, red, Block(red.name, red.iter_vars, red.bindings, red.body,
                                              None, red.predicate))
    func = func.with_body(body)
    for_ = find_loop(func, loop).stmt
    body = replace_node(func.body, for_, SeqStmt((init_block, for_)))
    return func.with_body(body), init_name



def cache_inplace(func: PrimFunc, block: str, buffer: str,
                  scope: Scope = Scope.LOCAL) -> tuple[PrimFunc, list[str]]:
    """``block`` reads and writes ``buffer`` (an update ``C[v] = C[v] + ...``): it works on a
    new copy instead, loaded before its loop nest and written back after it. Returns the load
    and the write-back blocks; place them with compute_at / reverse_compute_at (write-back
    first) to keep one tile of C in a local accumulator::

        for i, k:                              alloc C_local: f32[M, N] local:
          block C: C[vi, vj] += A * B     ->     for ax0, ax1: block C_local: C_local[..] = C[..]
                                                 for i, k: block C: C_local[vi, vj] += A * B
                                                 for ax0, ax1: block C_local_1: C[..] = C_local[..]
    """
    verb = "cache_inplace"
    target = find_block(func, block).stmt
    assert isinstance(target, Block)
    written = [s.buffer for s in stores_of(target.body) if s.buffer.name == buffer]
    read = [ld.buffer for ld in loads_of(target.body) if ld.buffer.name == buffer]
    if not written or not read:
        raise ScheduleError(f"{verb} {block}: the block does not both read and write {buffer}")
    if target.init is not None:
        raise ScheduleError(f"{verb} {block}: the block has an init; decompose_reduction first, "
                            f"so the block only updates {buffer}")
    buf = written[0]
    # the copies go right around the block's own loop nest (the loops that hold nothing
    # else), so no other block runs between the load and the write-back
    dst, taken = _fresh_buffer(func, buf, scope)
    load = _copy_nest(taken, dst.name, buf, dst)
    names = {b.name for b in blocks_under(func.body)} | {dst.name}
    writeback = _copy_nest(taken, fresh(names, dst.name), dst, buf)
    new_target = Block(target.name, target.iter_vars, target.bindings,
                       replace_buffer(target.body, buf, dst), None, target.predicate)
    func = func.with_body(replace_node(func.body, target, new_target))
    top = _nest_top(func, new_target)
    body = replace_node(func.body, top, SeqStmt((load, top, writeback)))
    return func.with_body(Allocate(dst, body)), [_first_block(load), _first_block(writeback)]


def _first_block(stmt: Stmt) -> str:
    return blocks_under(stmt)[0].name
