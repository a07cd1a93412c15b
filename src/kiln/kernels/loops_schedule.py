"""Default schedules for lowered kernels, chosen from the loop nest by simple rules.

    func, trace = default_schedule(lowered.func)

The rules, applied with the schedule primitives (so the result is a replayable Trace, the
same space the autotuner searches), each one skipped where the primitive refuses it:

1. inline elementwise intermediates into their consumers (``compute_inline``);
2. per block, its loops in the order of the written buffer's strides, largest outside (a
   strided output: NHWC between convolutions), then vectorize the innermost loop when it
   is spatial and walks the buffer's unit-stride axis (the last one, if contiguous);
3. per block, parallelize the outermost spatial loop of two or more iterations (once per
   loop nest), splitting a single long loop into ``parallel x vectorized`` first.

Reductions keep their reduction loops serial (the renderer never vectorizes a loop that
feeds a REDUCE iter var). GEMMs take the packed kernel of ``kiln.kernels.gemm_schedule`` instead;
the memory-bound transformer kernels the row schedules of ``kiln.kernels.rows_schedule``.
"""

from __future__ import annotations

from kiln.tir.nodes import Block, For, ForKind, IterKind, PrimFunc, Var
from kiln.tir.primitives.common import ScheduleError, blocks_under, find_block
from kiln.tir.schedule import Schedule
from kiln.tir.trace import Trace

__all__ = ["VECTOR", "default_schedule"]

VECTOR = 16  # fp32 lanes of AVX-512
MIN_PARALLEL = 2


def default_schedule(func: PrimFunc, vector: int = VECTOR) -> tuple[PrimFunc, Trace]:
    """``func`` with the default schedule applied, and the trace that applies it;
    ``vector``: the lanes a single long loop is split into (rule 3)."""
    sch = Schedule(func)
    # (inlining a block leaves what the others write unchanged: found once, by one walk;
    # per block it was cubic in the blocks: 50 s of RWKV's compile)
    inlined = _intermediate_writers(sch)
    for name in [n for n in sch.blocks() if n in inlined]:
        _try(sch.compute_inline, name)
    parallel_done: set[str] = set()
    for name in sch.blocks():
        _schedule_block(sch, name, parallel_done, vector)
    return sch.func, sch.trace


def _intermediate_writers(sch: Schedule) -> set[str]:
    """Blocks that write an allocated (non-parameter) buffer."""
    params = {b.name for b in sch.func.params}
    return {block.name for block in blocks_under(sch.func.body)
            if (written := _written(block)) and written not in params}


def _written(block: Block) -> str | None:
    from kiln.tir.nodes import BufferStore
    body = block.body
    return body.buffer.name if isinstance(body, BufferStore) else None


def _schedule_block(sch: Schedule, name: str, parallel_done: set[str],
                    vector: int = VECTOR) -> None:
    try:
        loc = find_block(sch.func, name)
    except ScheduleError:
        return  # inlined away
    block = loc.stmt
    assert isinstance(block, Block)
    loops = loc.loops
    if not loops:
        return
    order = _memory_order(block, loops)
    if order is not None and _try(sch.reorder, *(lp.var.name for lp in order)) is not False:
        loc = find_block(sch.func, name)
        block, loops = loc.stmt, loc.loops
        assert isinstance(block, Block)
    reduce_vars = {v.name for iv, b in zip(block.iter_vars, block.bindings)
                   if iv.kind is IterKind.REDUCE for v in _vars(b)}
    spatial = [lp for lp in loops if lp.var.name not in reduce_vars]
    inner = loops[-1]
    if inner in spatial and inner.kind is ForKind.SERIAL and _walks_last_axis(block, inner):
        if len(loops) == 1 and inner.extent >= 4 * vector:
            outer, vec = _try(sch.split, inner.var.name, [None, vector]) or (None, None)
            if vec is not None:
                _try(sch.vectorize, vec)
                if outer is not None and outer.name not in parallel_done:
                    if _try(sch.parallel, outer) is not False:
                        parallel_done.add(outer.name)
                return
        elif inner.extent > 1:
            _try(sch.vectorize, inner.var.name)
    for lp in spatial:
        if lp is inner and len(loops) > 1:
            break
        if lp.var.name in parallel_done or lp.kind is not ForKind.SERIAL:
            continue
        if lp.extent < MIN_PARALLEL:  # (a batch of one: the threads share the next loop;
            continue  # stopping here left Llama's [1, 128, 1376] SiLU on one thread)
        if _try(sch.parallel, lp.var.name) is not False:
            parallel_done.add(lp.var.name)
        break


def _walks_last_axis(block: Block, loop: For) -> bool:
    """Whether ``loop`` binds the iter var that indexes the stored buffer's unit-stride
    axis: its last, unless it has strides of its own."""
    from kiln.tir.nodes import BufferStore
    store = block.body
    if not isinstance(store, BufferStore) or not store.indices:
        return False
    buffer = store.buffer
    axis = len(store.indices) - 1
    if buffer.strides is not None:  # the smallest stride of an axis longer than one
        axis = min((i for i in range(buffer.rank) if buffer.shape[i] > 1),
                   key=lambda i: buffer.strides[i], default=axis)  # type: ignore[index]
    return bool(_bound(block, loop) & {v.name for v in _vars(store.indices[axis])})


def _bound(block: Block, loop: For) -> set[str]:
    """The iter vars whose binding uses ``loop``'s variable."""
    return {iv.var.name for iv, b in zip(block.iter_vars, block.bindings)
            if loop.var.name in {v.name for v in _vars(b)}}


def _memory_order(block: Block, loops: list[For]) -> list[For] | None:
    """``loops`` sorted by the stride of the axis each indexes in the stored buffer, largest
    first, where the buffer has strides of its own, each loop indexes one axis and the order
    changes; else None."""
    from kiln.tir.nodes import BufferStore
    store = block.body
    if not isinstance(store, BufferStore) or store.buffer.strides is None:
        return None
    strides = store.buffer.strides
    axis_of = {}
    for lp in loops:
        bound = _bound(block, lp)
        axes = [i for i, index in enumerate(store.indices)
                if bound & {v.name for v in _vars(index)}]
        if len(axes) != 1:
            return None
        axis_of[lp.var.name] = axes[0]
    order = sorted(loops, key=lambda lp: -strides[axis_of[lp.var.name]])
    return None if order == list(loops) else order


def _vars(expr: object) -> list[Var]:
    from kiln.tir.visit import vars_of
    return list(vars_of(expr))  # type: ignore[arg-type]


def _try(verb, *args):  # noqa: ANN001, ANN202
    """Apply a primitive; False when it refuses (the schedule is left as it was)."""
    try:
        result = verb(*args)
    except ScheduleError:
        return False
    return result if result is not None else True
