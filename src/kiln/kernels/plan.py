"""A KernelPlan is a kernel as data: the lowered program, the Trace of its schedule, and the
named post-passes that run after the trace. ``plan.build()`` replays all of it and gives the
exact program that is compiled and shipped, so a saved plan rebuilds the kernel, and the
autotuner can search plans by changing their decisions.

    plan = KernelPlan(Recipe.GEMM, program, trace, (Compact(), SimplifyIndices(),
                      VersionTails(("k0_0", ...)), ShrinkTails(), DropDeadGuards()))
    func = plan.build()            # trace.apply(program), then each post-pass in order
    print(plan.as_python())        # the schedule as Python, then one line per post-pass

A post-pass is a frozen dataclass with ``apply(func) -> func`` and ``as_python()``: the steps
that are not schedule decisions but lowering (buffer compaction, tail versioning, parallel
loops made serial for a small kernel, bool inputs read as bytes, the row prologue inlined
into a row kernel's loads, renaming).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass
from typing import Any, Protocol

from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.tir.arith import bounds
from kiln.tir.compact import compact_buffers
from kiln.tir.indices import simplify_indices
from kiln.tir.lower_elementwise import activation
from kiln.tir.nodes import (
    INDEX,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    CmpOp,
    Compare,
    Expr,
    For,
    ForKind,
    IfThenElse,
    IterVar,
    Load,
    Prefetch,
    PrimFunc,
    Scope,
    Stmt,
    Var,
    const,
    seq,
)
from kiln.tir.primitives.common import walk_with_path
from kiln.tir.scratch import unmask_scratch_stores
from kiln.tir.tails import drop_dead_guards, shrink_tail_tiles, version_tails
from kiln.tir.tensorize import fuse_inits, fuse_write_backs, tensorize_fma_tiles
from kiln.tir.trace import Trace
from kiln.tir.visit import all_exprs, iter_stmts, map_stmt, replace_buffer, substitute

__all__ = ["DYNAMIC_MIN_INTENSITY", "GRAIN", "BoolsAsBytes", "Compact", "DropDeadGuards",
           "Epilogue", "InlineRowPrologue", "KernelPlan", "PostPass", "PrefetchPanels", "Recipe",
           "RenameParams", "Serial", "ShrinkTails", "SimplifyIndices", "Tensorize",
           "UnmaskScratchStores", "VersionTails", "shares_dynamically"]


# below this many output elements a kernel runs on one thread, as ATen's parallel_for does
# (at::internal::GRAIN_SIZE): waking the OpenMP team costs more than it saves, and on a busy
# machine a descheduled team member stalls the call for a whole scheduler time slice
GRAIN = 32768

# a kernel's parallel loop hands its iterations out one at a time (ForKind.PARALLEL_DYNAMIC)
# from this arithmetic intensity on, in FLOPs per compulsory byte (operands read and results
# written once): there the cores' speed decides, and a core slowed by other work (its
# sibling hardware thread busy, a preemption) is made up for by the other; below it memory
# decides, and a static split keeps each thread on the part of the data that it, or the
# kernel before it split alike, left in its own core's cache. Zen 4, 2 threads, paired
# blocks in one process, every kernel static against dynamic: MobileNetV2 0.93x the time
# (its 1x1 convolutions have intensity 7-29, depthwise ones about 2), HF GPT-2 1.05x (its
# GEMMs 48-53), ResNet-50, BERT, ViT, Inception within 1%
DYNAMIC_MIN_INTENSITY = 40.0


def shares_dynamically(flops: float, nbytes: float) -> bool:
    """Should a kernel of ``flops`` over ``nbytes`` of operands and results split its work
    dynamically (`DYNAMIC_MIN_INTENSITY`)?"""
    return nbytes > 0 and flops >= DYNAMIC_MIN_INTENSITY * nbytes


class Recipe(enum.Enum):
    """How a group of graph nodes becomes a loop program."""

    ROWS = "rows"  # a row kernel (softmax / layer norm) with its elementwise prologue inlined
    LOOPS = "loops"  # an elementwise chain, default schedule
    GEMM = "gemm"  # mm / addmm / linear: packed panels and a register-tiled micro-kernel
    DEPTHWISE = "depthwise"  # depthwise convolution, channels-last: a pixels x channels tile
    CONV = "conv"  # dense direct convolution, channels-last: pixels x a panel of out channels
    POOL = "pool"  # max / average pooling, channels-last: the depthwise tile without weights
    ATTENTION = "attention"  # softmax(Q Kᵀ · c) V: two register-tiled products, scores in cache
    LIBRARY = "library"  # not generated: a library entry point on weights prepared once


class PostPass(Protocol):
    def apply(self, func: PrimFunc) -> PrimFunc: ...

    def as_python(self) -> str: ...


@dataclass(frozen=True)
class KernelPlan:
    """A kernel as data: replay ``trace`` on ``program``, then ``post`` in order."""

    recipe: Recipe
    program: PrimFunc  # the lowered program the trace replays onto
    trace: Trace
    post: tuple[PostPass, ...] = ()
    notes: str = ""  # how ``program`` was made, as comments (the template, the prologue)
    # what the trace gives on the program, where the recipe that recorded the trace has it
    # already: build() then skips the replay (tests check that replays give the same)
    scheduled: PrimFunc | None = dataclasses.field(default=None, compare=False, repr=False)
    # what build() gives, where a stored plan brought it (`kiln.kernels.plan_store`): kept
    # with the ``scheduled`` and ``post`` it was built from, and used only while this plan
    # still has both (a copy with more post-passes builds again)
    prebuilt: tuple[PrimFunc, tuple[PostPass, ...], PrimFunc] | None = dataclasses.field(
        default=None, compare=False, repr=False)

    def build(self) -> PrimFunc:
        if self.prebuilt is not None and self.prebuilt[0] is self.scheduled \
                and self.prebuilt[1] == self.post:
            return self.prebuilt[2]
        if self.scheduled is not None:
            return _post(self.scheduled, self.post)
        return _build(self.program, self.trace.to_json(), self.post)

    def with_build(self) -> KernelPlan:
        """This plan carrying its built program, for storing (a plan without ``scheduled``
        is returned as it is: its build replays the trace, which a stored plan skips only
        with the schedule kept)."""
        if self.scheduled is None:
            return self
        return dataclasses.replace(self, prebuilt=(self.scheduled, self.post, self.build()))

    def replayed(self) -> PrimFunc:
        """The program built by replaying the trace, whatever ``scheduled`` holds."""
        return _build(self.program, self.trace.to_json(), self.post)

    def with_post(self, *steps: PostPass) -> KernelPlan:
        return dataclasses.replace(self, post=(*self.post, *steps))

    def as_python(self) -> str:
        lines = [self.notes.rstrip("\n")] if self.notes else []
        lines.append(self.trace.as_python().rstrip("\n"))
        lines += [f"post.{step.as_python()}" for step in self.post]
        return "\n".join(line for line in lines if line)


@functools.lru_cache(maxsize=256)
def _build(program: PrimFunc, trace: str, post: tuple[PostPass, ...]) -> PrimFunc:
    """Replay, once per distinct plan: a transformer's layers repeat the same few plans."""
    return _post(Trace.from_json(trace).apply(program).func, post)


@functools.lru_cache(maxsize=256)
def _post(func: PrimFunc, post: tuple[PostPass, ...]) -> PrimFunc:
    for step in post:
        func = step.apply(func)
    return func


# -- post-passes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compact:
    """Buffers allocated inside loops shrink to the region one iteration touches."""

    def apply(self, func: PrimFunc) -> PrimFunc:
        return compact_buffers(func)

    def as_python(self) -> str:
        return "compact_buffers()"


@dataclass(frozen=True)
class SimplifyIndices:
    """Indices rewritten in loop variables (iter var bindings substituted and folded)."""

    def apply(self, func: PrimFunc) -> PrimFunc:
        return simplify_indices(func)

    def as_python(self) -> str:
        return "simplify_indices()"


@dataclass(frozen=True)
class VersionTails:
    """The bodies of ``loops`` versioned: full blocks run without bounds checks."""

    loops: tuple[str, ...]

    def apply(self, func: PrimFunc) -> PrimFunc:
        return version_tails(func, list(self.loops))

    def as_python(self) -> str:
        return f"version_tails({list(self.loops)!r})"


@dataclass(frozen=True)
class ShrinkTails:
    """A tail copy's loops run only the iterations that hold anything (the last tile of rows
    is M % MR rows tall, not MR)."""

    def apply(self, func: PrimFunc) -> PrimFunc:
        return shrink_tail_tiles(func)

    def as_python(self) -> str:
        return "shrink_tail_tiles()"


@dataclass(frozen=True)
class DropDeadGuards:
    """Guards that only protect values never stored are dropped (padded register tiles)."""

    def apply(self, func: PrimFunc) -> PrimFunc:
        return drop_dead_guards(func)

    def as_python(self) -> str:
        return "drop_dead_guards()"


@dataclass(frozen=True)
class UnmaskScratchStores:
    """A guarded store into a scratch row stores the whole vector (its padding gets zeros):
    no masked vector stores in a row kernel's last chunk."""

    def apply(self, func: PrimFunc) -> PrimFunc:
        return unmask_scratch_stores(func)

    def as_python(self) -> str:
        return "unmask_scratch_stores()"


@dataclass(frozen=True)
class ZeroPadding:
    """The block that packs ``buffer`` writes zeros where its predicate fails (a panel's lanes
    past N) instead of leaving them as the allocator returned them: the micro-kernel computes
    those lanes too and drops them, and garbage there can be subnormal floats, each FMA on
    one a slow microcode assist (HF ViT's 12x197x197x64 scores: 5.4 ms a call in the model,
    where the pack buffer's memory had held other data, against 0.28 ms timed on fresh
    memory). Only where that block is the buffer's one writer, a single store, and each of
    its indices stays within the buffer for every value of the loops around it; else the
    program is left as it is."""

    buffer: str

    def apply(self, func: PrimFunc) -> PrimFunc:
        found = [loc for loc in walk_with_path(func.body) if isinstance(loc.stmt, Block)
                 and any(st.buffer.name == self.buffer for st in iter_stmts(loc.stmt.body)
                         if isinstance(st, BufferStore))]
        if len(found) != 1:
            return func
        loc = found[0]
        block = loc.stmt
        assert isinstance(block, Block)
        store = block.body
        if block.predicate is None or not isinstance(store, BufferStore) \
                or store.buffer.name != self.buffer:
            return func
        ranges = {f.var: (0, f.extent - 1) for f in loc.loops}
        bound = dict(zip((iv.var for iv in block.iter_vars), block.bindings))
        indices = tuple(substitute(i, bound) for i in store.indices)  # (in the loops' vars)
        for index, extent in zip(indices, store.buffer.shape):
            span = bounds(index, ranges)
            if not isinstance(extent, int) or span is None or span[0] < 0 or span[1] >= extent:
                return func
        # the block as it was where its predicate holds (its iter vars are in range only
        # there), a plain store of 0 where it fails
        zero = BufferStore(store.buffer, indices, const(0.0, store.buffer.dtype))
        padded = IfThenElse(block.predicate, block, zero)
        return func.with_body(map_stmt(func.body, lambda st: padded if isinstance(st, Block)
                                       and st.name == block.name else st))

    def as_python(self) -> str:
        return f"zero_padding({self.buffer!r})"


@dataclass(frozen=True)
class Serial:
    """Parallel loops run serially: a small kernel costs less than waking the thread team."""

    reason: str = ""

    def apply(self, func: PrimFunc) -> PrimFunc:
        def fn(s: Stmt) -> Stmt:
            if isinstance(s, For) and s.kind.is_parallel:
                return For(s.var, s.extent, s.body, ForKind.SERIAL)
            return s
        return func.with_body(map_stmt(func.body, fn))

    def as_python(self) -> str:
        return f"serial()  # {self.reason}" if self.reason else "serial()"


@dataclass(frozen=True)
class BoolsAsBytes:
    """Bool inputs read as bytes (``m[i] != 0``, the same memory): gcc 12 does not vectorize
    a loop that selects floats on a C ``bool`` load, and does on a ``uint8_t`` one."""

    def apply(self, func: PrimFunc) -> PrimFunc:
        body = func.body
        params = []
        for buf in func.inputs:
            if buf.dtype is DType.BOOL:
                byte = dataclasses.replace(buf, dtype=DType.U8)
                zero = const(0, DType.U8)

                def as_byte(e: Expr, b: Buffer = buf, u: Buffer = byte, z: Expr = zero) -> Expr:
                    if isinstance(e, Load) and e.buffer == b:
                        return Compare(CmpOp.NE, Load(u, e.indices), z)
                    return e
                body = map_stmt(body, efn=as_byte)
                buf = byte
            params.append(buf)
        return PrimFunc(func.name, tuple(params), func.outputs, body)

    def as_python(self) -> str:
        return "bools_as_bytes()"


@dataclass(frozen=True)
class Epilogue:
    """The activation applied where the register tile is written back to the output: each
    store of a LOCAL accumulator into ``func``'s first output ``C`` stores ``act(value)``.
    Valid when every output element is written back once, after its whole reduction (a
    GEMM with one K block); `kiln.kernels.gemm_schedule.gemm_plan` guarantees it.

        C[i, j] = C_local[i, j]    ->    C[i, j] = max(C_local[i, j], 0)      (relu)
    """

    activation: Op
    args: tuple[Any, ...] = ()

    def apply(self, func: PrimFunc) -> PrimFunc:
        out = func.outputs[0]
        act = activation(self.activation, self.args)

        def fn(s: Stmt) -> Stmt:
            if (isinstance(s, BufferStore) and s.buffer == out and isinstance(s.value, Load)
                    and s.value.buffer.scope is Scope.LOCAL):
                return BufferStore(s.buffer, s.indices, act(s.value))
            return s
        return func.with_body(map_stmt(func.body, fn))

    def as_python(self) -> str:
        return f"epilogue({self.activation.text!r}, {list(self.args)!r})"


@dataclass(frozen=True)
class PrefetchPanels:
    """Each step of the micro-kernel's K loop ``k_loop`` prefetches the same K row of the
    next packed panel of ``buffer`` (packed panel first, NR last: a GEMM's B as [panels, K,
    NR], a convolution's weight as [panels, KH, KW, CI, NR]), so that the next tile's
    weights are on their way from DRAM while this tile computes.

    A model call finds a GEMM's weights in DRAM, not in the caches the compile-time timing
    left them in: 128x768 @ 768x3072 ran 185-196 GFLOP/s on a fresh copy of B against 204
    hot, and 209 with this prefetch (197x768 @ 768x2304: 178 -> 188; hot: unchanged).
    The hardware prefetcher stops at 4 KiB pages, and a panel's K rows span many of them.

        for k0 in range(K):                         for k0 in range(K):
            C[i, j] += A[i, k0] * B[jr, k0, j]  ->      prefetch B[min(jr + 1, P - 1), k0, 0]
                                                        C[i, j] += A[i, k0] * B[jr, k0, j]

    With ``tiles`` > 1 (the register tiles of ``tile_loop`` that pass over one panel) tile
    t prefetches rows ``(t K + k0) // tiles``: the next panel arrives over the whole pass
    at the rate DRAM gives, not in one burst during the first tile, whose prefetches then
    outran what the memory system takes (B cold, 2 threads, an AVX-512 Xeon: 128x768 @
    768x3072 ~2070 -> ~1850 us, 49x2048 @ 2048x512 437 -> 382; hot, within noise; HF BERT
    0.949 and GPT-2 0.952 of the time, interleaved A/B in one process).
    """

    k_loop: str
    buffer: str = "B"
    # the loop over the register tiles that pass over one panel, and how many there are:
    # each tile prefetches its share of the next panel's rows, not all of them
    tile_loop: str = ""
    tiles: int = 1
    # a second loop over the tiles, outside ``tile_loop`` (a convolution's rows of tiles, its
    # pixel tiles within a row): tile t = outer x ``inner_tiles`` + inner
    outer_loop: str = ""
    inner_tiles: int = 1
    # __builtin_prefetch's locality: 3 brings the next panel into L1 too, 2 into L2 and
    # beyond only (the next micro-kernel reads it, not this one), which measured slower
    # (Zen 4, 2 threads, weights cold: 128x768 @ 768x3072 2897 -> 2747 us, 128x3072 @
    # 3072x768 3004 -> 2901, 49x2048 @ 2048x512 552 -> 520, hot within 1.5%; models in one
    # process, interleaved: hf_llama 0.964, mobilenet_v2 0.964, hf_t5_encoder 0.978, hf_gpt2
    # 0.983, hf_bert 0.988-0.990, hf_vit 0.994, resnet50 0.97-1.01)
    locality: int = 3

    def apply(self, func: PrimFunc) -> PrimFunc:
        buf = next(b for b in func.inputs if b.name == self.buffer)
        if buf.rank < 3:
            raise ValueError(f"prefetch_panels: {buf.name} is not packed as [panels, ..., NR]")
        lines = -(-buf.shape[-1] * buf.dtype.itemsize // 64)
        last = const(buf.shape[0] - 1, DType.I64)

        def fn(s: Stmt) -> Stmt:
            if not (isinstance(s, For) and s.var.name == self.k_loop):
                return s
            load = next((e for e in all_exprs(s.body) if isinstance(e, Load) and e.buffer == buf),
                        None)
            if load is None:
                return s
            inner = {st.var: const(0, DType.I64) for st in iter_stmts(s.body)
                     if isinstance(st, For)}
            if self.tiles > 1:  # k -> (tile * K + k) // tiles
                k, tile = s.var, Var(self.tile_loop, s.var.dtype)
                if self.outer_loop:
                    tile = Binary(BinOp.ADD, Binary(BinOp.MUL, Var(self.outer_loop, k.dtype),
                                                    const(self.inner_tiles, k.dtype)), tile)
                inner[k] = Binary(BinOp.FLOORDIV, Binary(
                    BinOp.ADD, Binary(BinOp.MUL, tile, const(s.extent, k.dtype)), k),
                    const(self.tiles, k.dtype))
            panel, *rows, _ = (substitute(i, inner) for i in load.indices)
            nxt = Binary(BinOp.MIN, Binary(BinOp.ADD, panel, const(1, DType.I64)), last)
            hint = Prefetch(buf, (nxt, *rows, const(0, DType.I64)), lines, self.locality)
            return For(s.var, s.extent, seq(hint, s.body), s.kind)
        return func.with_body(map_stmt(func.body, fn))

    def as_python(self) -> str:
        spread = f", {self.tile_loop!r}, {self.tiles}" if self.tiles > 1 else ""
        if self.tiles > 1 and self.outer_loop:
            spread += f", outer_loop={self.outer_loop!r}, inner_tiles={self.inner_tiles}"
        locality = f", locality={self.locality}" if self.locality != 3 else ""
        return f"prefetch_panels({self.k_loop!r}, {self.buffer!r}{spread}{locality})"


@dataclass(frozen=True)
class Tensorize:
    """The register tile's reduction loop (each version of it that matches, the names in
    ``k_loops`` tried outermost first) computed by the FMA_TILE intrinsic on ``lanes``-wide
    vectors (`kiln.tir.tensorize`): its accumulators held in vector registers for the whole
    loop, whatever the C compiler's register allocation would have made of the loop nest."""

    k_loops: tuple[str, ...]
    lanes: int

    def apply(self, func: PrimFunc) -> PrimFunc:
        # (and each tile's write-back, where the nest after it is one: `fuse_write_backs`)
        return fuse_inits(fuse_write_backs(tensorize_fma_tiles(func, self.k_loops, self.lanes)))

    def as_python(self) -> str:
        return f"tensorize({list(self.k_loops)!r}, 'fma_tile', lanes={self.lanes})"


@dataclass(frozen=True)
class StopAtDiagonal:
    """Causal attention's key loops end at the last key a block of queries attends: with
    the block loop ``block`` (``width`` queries a step) at b, the keys end at
    min(``keys``, (b + 1) * width) (a key after every query of the block has probability
    0: its scores, exponentials and products are skipped, not computed). The loops named in
    ``key_loops`` step a key at a time, those in ``tile_loops`` (name, keys a step) a tile
    at a time; every version of each (`VersionTails`) gets the stop. The last post-pass:
    the loops' ``stop`` (`kiln.tir.nodes.For`) is read by the renderers only."""

    block: str
    width: int
    keys: int
    key_loops: tuple[str, ...]
    tile_loops: tuple[tuple[str, int], ...]

    def apply(self, func: PrimFunc) -> PrimFunc:
        blocks = [s.var for s in iter_stmts(func.body)
                  if isinstance(s, For) and s.var.name == self.block]
        if not blocks:
            return func
        end = Binary(BinOp.MIN, const(self.keys, INDEX),
                     (blocks[0] + const(1, INDEX)) * const(self.width, INDEX))
        steps = {name: 1 for name in self.key_loops} | dict(self.tile_loops)

        def fn(s: Stmt) -> Stmt:
            if not isinstance(s, For) or s.var.name not in steps:
                return s
            step = steps[s.var.name]
            stop = end if step == 1 else \
                Binary(BinOp.FLOORDIV, end + const(step - 1, INDEX), const(step, INDEX))
            return dataclasses.replace(s, stop=stop)
        return func.with_body(map_stmt(func.body, fn))

    def as_python(self) -> str:
        return (f"stop_at_diagonal({self.block!r}, width={self.width}, keys={self.keys}, "
                f"key_loops={list(self.key_loops)!r}, tile_loops={list(self.tile_loops)!r})")


@dataclass(frozen=True)
class RenameParams:
    """The function renamed, and its parameters prefixed (apart from a prologue's names)."""

    name: str
    prefix: str

    def apply(self, func: PrimFunc) -> PrimFunc:
        body = func.body
        params = []
        for buf in func.params:
            new = dataclasses.replace(buf, name=f"{self.prefix}{buf.name}")
            body = replace_buffer(body, buf, new)
            params.append(new)
        k = len(func.inputs)
        return PrimFunc(self.name, tuple(params[:k]), tuple(params[k:]), body)

    def as_python(self) -> str:
        return f"rename({self.name!r}, prefix={self.prefix!r})"


@dataclass(frozen=True)
class InlineRowPrologue:
    """A row kernel's loads of its input row ``x[r, c]`` become ``value`` (the elementwise
    prologue, one expression in ``index_vars`` over the prologue's ``params``); with
    ``write_x`` each row of the prologue is first stored once to a new output ``x_out`` and
    the row passes read it back (GPT-2's residual stream is needed after the layer norm)."""

    value: Expr
    index_vars: tuple[Var, ...]  # the prologue's iteration variables, outermost first
    shape: tuple[int, ...]  # x's shape; the row kernel sees it as [rows, n]
    params: tuple[Buffer, ...]
    write_x: bool

    def apply(self, func: PrimFunc) -> PrimFunc:
        x_buf, rest = func.inputs[0], func.inputs[1:]
        rows, n = x_buf.shape
        outputs: tuple[Buffer, ...] = func.outputs
        if self.write_x:
            x_out = Buffer("row_x_out", (rows, n), DType.F32)
            loop = func.body
            assert isinstance(loop, For), "a row kernel's body is its row loop"
            write = _row_loop(loop.var, rows, n,
                              lambda r, c: BufferStore(x_out, (r, c), self.at(r, c)))
            body = _replace_loads(loop.body, x_buf, lambda idx: Load(x_out, idx))
            body = For(loop.var, loop.extent, seq(write, body), loop.kind)
            outputs = (x_out, *outputs)
        else:
            body = _replace_loads(func.body, x_buf, lambda idx: self.at(*idx))
        return PrimFunc(func.name, (*self.params, *rest), outputs, body)

    def at(self, r: Expr, c: Expr) -> Expr:
        """The prologue's value at row-major position (r, c) of x."""
        ivs, shape = self.index_vars, self.shape
        mapping: dict[Var, Expr] = {ivs[-1]: c}
        inner = 1
        for k in range(len(shape) - 2, -1, -1):
            idx = r if inner == 1 else r // inner
            mapping[ivs[k]] = idx % shape[k] if k > 0 else idx
            if shape[k] == 1:
                mapping[ivs[k]] = const(0, DType.I64)
            inner *= shape[k]
        return substitute(self.value, mapping)

    def as_python(self) -> str:
        names = ", ".join(p.name for p in self.params)
        return f"inline_row_prologue(params=[{names}], write_x={self.write_x})"


def _row_loop(r: Var, rows: int, n: int, body) -> Stmt:  # noqa: ANN001
    """``for j in vectorized(n): body(vr, vj)`` inside the row loop ``r``."""
    j = Var("kiln_j")
    vr, vj = IterVar(Var("kiln_vr"), rows), IterVar(Var("kiln_vj"), n)
    block = Block("prologue", (vr, vj), (r, j), body(vr.var, vj.var))
    return For(j, n, block, ForKind.VECTORIZED)


def _replace_loads(stmt: Stmt, buf: Buffer, make) -> Stmt:  # noqa: ANN001
    """Every load of ``buf`` becomes ``make(indices)``."""
    def efn(e: Expr) -> Expr:
        return make(e.indices) if isinstance(e, Load) and e.buffer == buf else e
    return map_stmt(stmt, efn=efn)

