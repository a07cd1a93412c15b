"""rfactor: split a reduction into independent partial reductions along one of its loops
(TVM's ``rfactor``), so that loop can run in vector lanes or threads.

For a reduction block whose update is ``C[s] = C[s] op e`` (``op`` one of add, mul, max,
min, on either side) with the identity of ``op`` as its init, ``rfactor(block, loop)`` where
``loop`` feeds only reduction iter vars gives

* an **rf block** ``C_rf`` in the original loops that folds into ``C_rf[s, l]``, a new local
  buffer with one more (last) axis indexed by ``loop``: the loop now feeds a *spatial* iter
  var, so vectorizing it is legal;
* a **write-back block** (the original name) that folds ``C_rf[s, 0..L)`` into ``C[s]``,
  right after the block's own nest (the loops below its innermost non-loop ancestor), in
  copies of that nest's spatial loops, then the reduction over ``L``. So a block already
  moved into a row loop (compute_at) is factored per row, and the write-back can itself be
  factored again (a tree of halving steps).

``C_rf`` is allocated around the whole body (as lowering allocates temporaries), so later
compute_at moves keep it in scope; `kiln.tir.compact.compact_buffers` then shrinks it.

rfactor(max, k0_1) after split(k0, [None, 16]) on a row max of f32[4, 37]::

    for i0 in range(4):                              alloc max_rf: f32[4, 16] local:
      for k0_0 in range(3):                            for i0 in range(4):
        for k0_1 in range(16):                           for k0_0 in range(3):
          block max(vi0: spatial[4] = i0,                  for k0_1 in range(16):
                    vk0: reduce[37] = k0_0 * 16 + k0_1)      block max_rf(vi0: spatial[4] = i0,
                where k0_0 * 16 + k0_1 < 37:                   vk0_0: reduce[3] = k0_0,
            init: m[vi0] = -inf                 ->             vk0_1: spatial[16] = k0_1):
            m[vi0] = max(m[vi0], x[vi0, vk0])                  init: max_rf[vi0, vk0_1] = -inf
                                                               max_rf[vi0, vk0_1] = max(
                                                                 max_rf[vi0, vk0_1],
                                                                 select(k0_0 * 16 + k0_1 < 37,
                                                                   x[...], -inf))
                                                       for ax0 in range(4):
                                                         for l in range(16):
                                                           block max(v0: spatial[4] = ax0,
                                                                     vl: reduce[16] = l):
                                                             init: m[v0] = -inf
                                                             m[v0] = max(m[v0], max_rf[v0, vl])

A predicate that depends on the reduction loops (a split's tail) becomes a lazy select of the
identity in the rf block's update: every partial is then initialized, also the lanes a short
row never reaches. Reassociating float add/mul changes rounding (as every vectorized sum
does); max/min keep NaN (kiln's MAX/MIN propagate it), so the result is torch's.
"""

from __future__ import annotations

from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Const,
    Expr,
    For,
    IterKind,
    IterVar,
    Load,
    PrimFunc,
    Scope,
    Select,
    SeqStmt,
    Stmt,
    Var,
)
from kiln.tir.primitives.common import (
    ScheduleError,
    blocks_under,
    find_block,
    find_loop,
    taken_names,
)
from kiln.tir.te import identity_of
from kiln.tir.visit import conjoin, conjuncts, fresh, loads_of, replace_node, substitute, vars_of

COMBINERS = (BinOp.ADD, BinOp.MUL, BinOp.MAX, BinOp.MIN)  # commutative and associative


def rfactor(func: PrimFunc, block: str, loop: str) -> tuple[PrimFunc, str]:
    """Factor ``block``'s reduction over ``loop``; returns the function and the rf block."""
    verb = f"rfactor {block} at {loop}"
    loc = find_block(func, block)
    red = loc.stmt
    assert isinstance(red, Block)
    store, op, term = _combiner(red, verb)
    for_ = find_loop(func, loop).stmt
    assert isinstance(for_, For)
    if for_ not in loc.path:
        raise ScheduleError(f"{verb}: the block is not under that loop")
    nest = loc.loops
    reduce_loops = [f for f in nest if any(f.var in vars_of(b) for iv, b in
                                           zip(red.iter_vars, red.bindings)
                                           if iv.kind is IterKind.REDUCE)]
    spatial_vars = {v for iv, b in zip(red.iter_vars, red.bindings)
                    if iv.kind is IterKind.SPATIAL for v in vars_of(b)}
    if for_.var in spatial_vars:
        raise ScheduleError(f"{verb}: the loop feeds a spatial iter var; only a loop that "
                            f"feeds reduction iter vars alone can be factored")
    if for_ not in reduce_loops:
        raise ScheduleError(f"{verb}: the loop feeds no reduction iter var of the block")
    mixed = [f.var.name for f in reduce_loops if f.var in spatial_vars]
    if mixed:
        raise ScheduleError(f"{verb}: loop {mixed[0]} feeds spatial and reduction iter vars")
    # the block's own nest: the loops below its innermost non-loop ancestor
    start = max((k + 1 for k, s in enumerate(loc.path) if not isinstance(s, For)), default=0)
    chain = [s for s in loc.path[start:] if isinstance(s, For)]
    outside = [f.var.name for f in reduce_loops if f not in chain]
    if outside:
        raise ScheduleError(f"{verb}: reduction loop {outside[0]} also holds other "
                            f"statements; factor the block before moving others into it")
    taken = taken_names(func)
    dtype = store.buffer.dtype
    identity = identity_of(op, dtype)
    spatial = [(iv, b) for iv, b in zip(red.iter_vars, red.bindings)
               if iv.kind is IterKind.SPATIAL]
    lanes = for_.extent

    # the rf block: the spatial iter vars, then one iter var per reduction loop, in loop order
    rf_buf = Buffer(fresh(taken, f"{store.buffer.name}_rf"), store.buffer.shape + (lanes,),
                    dtype, scope=Scope.LOCAL)
    loop_iv = {f.var: IterVar(Var(fresh(taken, f"v{f.var.name}")), f.extent,
                              IterKind.SPATIAL if f is for_ else IterKind.REDUCE)
               for f in reduce_loops}
    as_iv = {v: iv.var for v, iv in loop_iv.items()}
    old_reduce = {iv.var: substitute(b, as_iv) for iv, b in zip(red.iter_vars, red.bindings)
                  if iv.kind is IterKind.REDUCE}
    lane = loop_iv[for_.var].var
    rf_idx = store.indices + (lane,)
    value = substitute(term, old_reduce)
    predicate: Expr | None = None
    guard: Expr | None = None
    for c in conjuncts(red.predicate):
        if vars_of(c) & set(as_iv):
            if not vars_of(c) <= set(as_iv):
                raise ScheduleError(f"{verb}: the predicate {c} mixes reduction and spatial "
                                    f"loops")
            guard = conjoin(guard, substitute(c, as_iv))
        else:
            predicate = conjoin(predicate, c)
    if guard is not None:
        value = Select(guard, value, identity)
    rf_block = Block(fresh({b.name for b in blocks_under(func.body)} | {block}, f"{block}_rf"),
                     tuple(iv for iv, _ in spatial) + tuple(loop_iv.values()),
                     tuple(b for _, b in spatial) + tuple(f.var for f in reduce_loops),
                     BufferStore(rf_buf, rf_idx, Binary(op, Load(rf_buf, rf_idx), value)),
                     BufferStore(rf_buf, rf_idx, identity), predicate)

    # the write-back block: copies of the nest's spatial loops, then the factored axis
    copied = [f for f in chain if f.var in spatial_vars]
    ax = {f.var: Var(fresh(taken, f"ax{k}")) for k, f in enumerate(copied)}
    new_sp = {iv.var: Var(fresh(taken, f"{iv.var.name}_wb")) for iv, _ in spatial}
    red_loop = Var(fresh(taken, f"{for_.var.name}_wb"))
    red_iv = IterVar(Var(fresh(taken, f"v{red_loop.name}")), lanes, IterKind.REDUCE)
    idx = tuple(substitute(i, new_sp) for i in store.indices)
    wb_pred = None if predicate is None else substitute(predicate, ax)
    wb: Stmt = Block(block, tuple(IterVar(new_sp[iv.var], iv.extent) for iv, _ in spatial)
                     + (red_iv,), (*(substitute(b, ax) for _, b in spatial), red_loop),
                     BufferStore(store.buffer, idx, Binary(op, Load(store.buffer, idx),
                                                           Load(rf_buf, idx + (red_iv.var,)))),
                     BufferStore(store.buffer, idx, identity), wb_pred)
    wb = For(red_loop, lanes, wb)
    for f in reversed(copied):
        wb = For(ax[f.var], f.extent, wb)

    top = chain[0]
    factored = replace_node(top, red, rf_block)
    body = replace_node(func.body, top, SeqStmt((factored, wb)))
    # allocated around everything, as lowering allocates its temporaries: blocks moved later
    # (compute_at) stay inside; compaction shrinks it into the innermost loop that uses it
    return func.with_body(Allocate(rf_buf, body)), rf_block.name




def _combiner(red: Block, verb: str) -> tuple[BufferStore, BinOp, Expr]:
    """The block's store, combiner and the term it folds in (``C[s] = C[s] op term``)."""
    if not red.is_reduction:
        raise ScheduleError(f"{verb}: the block is not a reduction (no reduce iter var)")
    store = red.body
    if not isinstance(store, BufferStore):
        raise ScheduleError(f"{verb}: the block body is not a single store")
    acc = Load(store.buffer, store.indices)
    value = store.value
    if not (isinstance(value, Binary) and value.op in COMBINERS and acc in (value.a, value.b)):
        raise ScheduleError(f"{verb}: the update is not C = C op e with op one of "
                            f"{', '.join(o.name.lower() for o in COMBINERS)}")
    term = value.b if value.a == acc else value.a
    if any(ld.buffer == store.buffer for ld in loads_of(BufferStore(store.buffer,
                                                                    store.indices, term))):
        raise ScheduleError(f"{verb}: the folded term reads {store.buffer.name} itself")
    reduce_ivs = {iv.var for iv in red.iter_vars if iv.kind is IterKind.REDUCE}
    if any(vars_of(i) & reduce_ivs for i in store.indices):
        raise ScheduleError(f"{verb}: the accumulator index depends on a reduce iter var")
    init = red.init
    want = identity_of(value.op, store.buffer.dtype)
    if not (isinstance(init, BufferStore) and init.buffer == store.buffer
            and init.indices == store.indices and isinstance(init.value, Const)):
        raise ScheduleError(f"{verb}: the init is not a constant store to the accumulator")
    if init.value != want:
        raise ScheduleError(f"{verb}: the init {init.value.value!r} is not the identity "
                            f"{want.value!r} of {value.op.name.lower()}")
    return store, value.op, term
