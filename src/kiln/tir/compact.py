"""Buffer compaction, run after scheduling and before rendering (TVM's
CompactBufferAllocation): each allocated buffer moves into the innermost loop that holds all
its accesses and shrinks to the region one iteration of that loop touches.

A buffer whose accesses all lie in one iteration of a parallel loop moves inside it even
where that iteration touches all of it, so that each thread packs into its own copy: left
outside, the threads of a GEMM split by N (one block of rows, one K block: ResNet-50's
49x2048 @ 2048x512) packed A into one shared buffer at once.

This is how ``cache_read`` + ``compute_at`` becomes a packed panel and ``cache_write`` +
``reverse_compute_at`` a register tile::

    alloc B_local: f32[64, 64] local:            for j_0 in range(4):
      for j_0 in range(4):                 ->      alloc B_local: f32[64, 16] local:
        ... B_local[vk, vj] ...                      ... B_local[vk, vj - j_0 * 16] ...

Afterwards block bodies may refer to enclosing loop vars (in the shifted indices), so no
schedule primitive runs on a compacted function: compaction is the last step.
"""

from __future__ import annotations

from kiln.tir.arith import simplify
from kiln.tir.nodes import Allocate, Block, Buffer, Expr, For, PrimFunc, Stmt
from kiln.tir.primitives.common import (
    ScheduleError,
    accesses,
    find_loop,
    region_under,
    touches,
    walk_with_path,
)
from kiln.tir.visit import iter_stmts, map_stmt, replace_buffer, replace_node


def compact_buffers(func: PrimFunc) -> PrimFunc:
    allocs = [s.buffer for s in iter_stmts(func.body) if isinstance(s, Allocate)]
    for buf in allocs:
        func = _compact_one(func, buf)
    return func


def _innermost_common_loop(func: PrimFunc, buf: Buffer) -> tuple[For, list[For]] | None:
    users = [loc for loc in walk_with_path(func.body)
             if isinstance(loc.stmt, Block) and touches(loc.stmt, buf)]
    if not users:
        return None
    common: list[Stmt] = []
    for parts in zip(*[loc.path for loc in users]):
        if any(p is not parts[0] for p in parts):
            break
        common.append(parts[0])
    # only loops inside the buffer's own allocation may take it
    inside = False
    loops: list[For] = []
    for s in common:
        if isinstance(s, Allocate) and s.buffer == buf:
            inside = True
        elif isinstance(s, For) and inside:
            loops.append(s)
    all_loops = [s for s in common if isinstance(s, For)]
    if not loops:
        return None
    loop = loops[-1]
    return loop, all_loops[:all_loops.index(loop) + 1]


def _compact_one(func: PrimFunc, buf: Buffer) -> PrimFunc:
    found = _innermost_common_loop(func, buf)
    if found is None:
        return func
    loop, outer = found
    index_lists = [idx for _, idx, _ in accesses(loop, buf)]
    try:
        region = region_under(loop, outer, index_lists, f"compact {buf.name}")
    except ScheduleError:
        return func  # accesses too irregular to box: keep the full buffer
    if region.extents == buf.shape and not any(o.kind.is_parallel for o in outer):
        return func  # (moved all the same under a parallel loop: each thread's own copy)
    small = Buffer(buf.name, region.extents, buf.dtype, None, buf.scope)

    def shift(idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(simplify(i - s) for i, s in zip(idx, region.starts))

    # unwrap the old allocation, shift every access, then allocate inside the loop
    body = map_stmt(func.body, lambda s: s.body if isinstance(s, Allocate) and s.buffer == buf
                    else s)
    body = replace_buffer(body, buf, small, shift)
    loop = find_loop(func.with_body(body), loop.var.name).stmt  # type: ignore[assignment]
    moved = For(loop.var, loop.extent, Allocate(small, loop.body), loop.kind)
    return func.with_body(replace_node(body, loop, moved))
