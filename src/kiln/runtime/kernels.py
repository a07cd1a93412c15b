"""Generated kernels for the partitioner's groups: build, check, or fall back to library calls.

Two recipes, chosen by the group's shape:

* **rows** — a group closed by a last-axis softmax or layer norm: the row kernel of
  `kiln.codegen.fused` (its compute definition and the row schedule: rows in parallel,
  vectorized passes, reductions rfactored into lane partials; the kernel's trace is that
  schedule) whose loads of its input ``x[r, c]`` are replaced by the group's elementwise
  prologue, inlined (compute_inline on the prologue's own lowering, then substitution)::

      x = where(mask, -inf, scores); y = softmax(x)   ->   y[r, :] = softmax(where(...)[r, :])

  When ``x`` itself is needed after the group (GPT-2's residual stream) each row is first
  written to it once, then the row passes read it back from L1.
  A prologue that selects between loads (GPT-2's ``where(mask, scores, -inf)``) vectorizes
  because the C renderer reads the loads that are in bounds either way before the select (a
  blend, not a branch); with a bool mask the row kernel uses `fused.BYTE_LANES` lanes.
* **loops** — an elementwise-only group: `kiln.tir.lower.lower_chain`, the default schedule of
  `kiln.codegen.heuristics` (intermediates inlined, vectorized, parallel), buffer compaction.

Both: one-element weights become literals, bool inputs are read as bytes (gcc vectorizes a
select on ``uint8_t`` loads, not on ``bool`` ones), and kernels with fewer than `GRAIN` output
elements run on one thread.

Any failure (the op has no loop definition, a schedule primitive refuses, no C compiler, the
compiler rejects the source, the built kernel disagrees with the library on random data)
leaves the group to its library calls: never a crash, never a wrong answer.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kiln.codegen import fused
from kiln.codegen.build import CompileError, CompilerUnavailable
from kiln.codegen.c import UnsupportedForC
from kiln.codegen.heuristics import default_schedule
from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.options import Options
from kiln.passes.partition import KernelGroup, without_last
from kiln.tir.compact import compact_buffers
from kiln.tir.lower import lower_chain
from kiln.tir.nodes import (
    Block,
    Buffer,
    BufferStore,
    CmpOp,
    Compare,
    Expr,
    For,
    ForKind,
    IterVar,
    Load,
    PrimFunc,
    Stmt,
    Var,
    const,
    seq,
)
from kiln.tir.primitives.common import ScheduleError
from kiln.tir.schedule import Schedule
from kiln.tir.te import NotLowerable
from kiln.tir.visit import iter_stmts, map_stmt, replace_buffer, substitute

__all__ = ["GroupKernel", "KernelBuild", "agrees_with_library", "build_group_kernel",
           "build_kernels", "random_operands", "serial"]

# below this many output elements a kernel runs on one thread, as ATen's parallel_for does
# (at::internal::GRAIN_SIZE): waking the OpenMP team costs more than it saves, and on a busy
# machine a descheduled team member stalls the call for a whole scheduler time slice
GRAIN = 32768
CHECK_TOLERANCE = 1e-5  # relative L2, float32: a kernel off by more than this is not used


class NoRecipe(Exception):
    """The group has a shape neither recipe takes."""


NO_ROW_KERNEL = "no row kernel"


@dataclass(frozen=True)
class GroupKernel:
    """A compiled kernel standing for a group; parameters are ``inputs`` then ``outputs``."""

    group: KernelGroup
    kernel: CompiledKernel
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    recipe: str  # "rows", "loops" or "gemm"
    trace: str  # how the schedule was made: the replayable Trace(s), as Python
    # the tensor to pass for a weight input, where not the weight made contiguous (a GEMM
    # reads a transposed weight in place: no copy of GPT-2's 154 MB LM head)
    weights: dict[Value, torch.Tensor] = field(default_factory=dict, compare=False)

    @property
    def source(self) -> str:
        return self.kernel.source

    def weight(self, graph: Graph, v: Value) -> torch.Tensor:
        """What the kernel reads for the weight input ``v``."""
        found = self.weights.get(v)
        return found if found is not None else graph.constant(v.node).contiguous()


@dataclass
class KernelBuild:
    """The result of building every group: the kernels, and why the other groups were left."""

    kernels: list[GroupKernel] = field(default_factory=list)
    skipped: list[tuple[KernelGroup, str]] = field(default_factory=list)


def build_kernels(graph: Graph, groups: Sequence[KernelGroup], options: Options) -> KernelBuild:
    """A kernel per group where one can be built and checked; the reasons elsewhere."""
    result = KernelBuild()
    checked: dict[str, bool] = {}  # kernel source -> agreed with the library (repeated layers)
    for i, group in enumerate(groups):
        built = build_group_kernel(graph, group, options)
        prologue = without_last(group)
        if isinstance(built, str) and built.startswith(NO_ROW_KERNEL) and prologue:
            # the normalization stays a library call; its prologue still fuses
            built = build_group_kernel(graph, prologue, options)
        if isinstance(built, str):
            result.skipped.append((group, built))
            if built.startswith("no C compiler"):  # (warned once, by codegen.build)
                result.skipped += [(g, built) for g in groups[i + 1:]]
                break
            continue
        key = built.source + repr([v.type for v in built.inputs])
        if key not in checked:
            checked[key] = agrees_with_library(graph, built)
        if checked[key]:
            result.kernels.append(built)
        else:
            warnings.warn(f"kiln: generated kernel {built.kernel.name} disagrees with the library "
                          f"calls on random data; using the library calls", RuntimeWarning,
                          stacklevel=2)
            result.skipped.append((group, "disagreed with the library on random data"))
    return result


def build_group_kernel(graph: Graph, group: KernelGroup, options: Options) -> GroupKernel | str:
    """The group's compiled kernel, or a one-line reason why there is none."""
    try:
        if group.last.op in (Op.SOFTMAX, Op.LAYER_NORM):
            func, trace, ins, outs = _rows(graph, group)
            recipe = "rows"
        else:
            func, trace, ins, outs = _loops(graph, group)
            recipe = "loops"
        func = _bools_as_bytes(func)
        if sum(v.type.numel for v in outs) < GRAIN:
            func = serial(func)
            trace += f"\n# parallel loops made serial: fewer than {GRAIN} output elements"
        kernel = compile_kernel(func, options)
    except NoRecipe as err:
        return f"{NO_ROW_KERNEL if group.last.op in (Op.SOFTMAX, Op.LAYER_NORM) else ''}: {err}"
    except (NotLowerable, ScheduleError, UnsupportedForC) as err:
        return f"not generated: {err}"
    except Exception as err:  # noqa: BLE001 - a bug in lowering must cost speed, not the model
        if options.strict:
            raise
        warnings.warn(f"kiln: could not generate a kernel for {group} ({type(err).__name__}: "
                      f"{err}); using library calls", RuntimeWarning, stacklevel=2)
        return f"internal error: {type(err).__name__}: {err}"
    except CompileError as err:
        warnings.warn(f"kiln: the C compiler rejected kernel {func.name}; using library calls "
                      f"({str(err).splitlines()[0]})", RuntimeWarning, stacklevel=2)
        return "the C compiler rejected the kernel"
    if isinstance(kernel, CompilerUnavailable):
        return f"no C compiler: {kernel.reason}"
    return GroupKernel(group, kernel, tuple(ins), tuple(outs), recipe, trace)


def _bools_as_bytes(func: PrimFunc) -> PrimFunc:
    """Bool inputs read as bytes (``m[i] != 0``, the same memory): gcc 12 does not vectorize
    a loop that selects floats on a C ``bool`` load, and does on a ``uint8_t`` one."""
    body = func.body
    params = []
    for buf in func.inputs:
        if buf.dtype is DType.BOOL:
            byte = dataclasses.replace(buf, dtype=DType.U8)
            zero = const(0, DType.U8)
            body = map_stmt(body, efn=lambda e, b=buf, u=byte, z=zero: Compare(
                CmpOp.NE, Load(u, e.indices), z) if isinstance(e, Load) and e.buffer == b else e)
            buf = byte
        params.append(buf)
    return PrimFunc(func.name, tuple(params), func.outputs, body)


def serial(func: PrimFunc) -> PrimFunc:
    """``func`` with its parallel loops run serially."""
    def fn(s: Stmt) -> Stmt:
        if isinstance(s, For) and s.kind is ForKind.PARALLEL:
            return For(s.var, s.extent, s.body, ForKind.SERIAL)
        return s
    return func.with_body(map_stmt(func.body, fn))


# -- loops: lower_chain + default schedule ----------------------------------------------------


def _loops(graph: Graph, group: KernelGroup
           ) -> tuple[PrimFunc, str, Sequence[Value], Sequence[Value]]:
    lowered = lower_chain(group.nodes, outputs=group.outputs)
    body, params, values = _inline_scalars(graph, lowered.func.body, lowered.func.inputs,
                                           lowered.inputs)
    func = PrimFunc(lowered.func.name, params, lowered.func.outputs, body)
    func, trace = default_schedule(func)
    return compact_buffers(func), trace.as_python(), values, lowered.outputs


def _inline_scalars(graph: Graph, body: Stmt, params: Sequence[Buffer], values: Sequence[Value]
                    ) -> tuple[Stmt, tuple[Buffer, ...], tuple[Value, ...]]:
    """One-element weights become literals: no load, and no masked load under a select,
    which gcc cannot vectorize (``where(mask, -inf, x)``)."""
    literal: dict[Buffer, Expr] = {}
    for buf, v in zip(params, values):
        if v.node.op is Op.CONSTANT and v.type.numel == 1 and v.type.dtype in (DType.F32,
                                                                              DType.BOOL):
            literal[buf] = const(graph.constant(v.node).item(), v.type.dtype)
    if not literal:
        return body, tuple(params), tuple(values)
    body = map_stmt(body, efn=lambda e: literal.get(e.buffer, e) if isinstance(e, Load) else e)
    kept = [(b, v) for b, v in zip(params, values) if b not in literal]
    return body, tuple(b for b, _ in kept), tuple(v for _, v in kept)


# -- rows: a fused row kernel with the elementwise prologue inlined ---------------------------


def _rows(graph: Graph, group: KernelGroup
          ) -> tuple[PrimFunc, str, Sequence[Value], Sequence[Value]]:
    norm = group.last
    x, y = norm.inputs[0], norm.out(0)
    shape = x.type.shape
    n = shape[-1]
    rows = math.prod(shape[:-1])
    prologue = group.nodes[:-1]
    reads_bytes = any(v.type.dtype is DType.BOOL for node in prologue for v in node.inputs)
    lanes = fused.BYTE_LANES if reads_bytes else fused.LANES
    if any(v not in (x, y) for v in group.outputs) or (not prologue and x in group.outputs):
        raise NoRecipe(f"{norm.name}: the group has outputs besides the row input and result")
    if norm.op is Op.SOFTMAX:
        kernel, extra = _row_kernel("softmax", rows, n, 0.0, lanes), ()
    else:
        w, b = norm.inputs[1], norm.inputs[2]
        if any(v.type.shape != (n,) or v.type.dtype is not DType.F32 for v in (w, b)):
            raise NoRecipe(f"{norm.name}: weight and bias are not f32[{n}]")
        eps = norm.attrs.eps  # type: ignore[attr-defined]
        kernel = _row_kernel("layernorm", rows, n, eps, lanes)
        extra = (w, b)
    # row_x, row_w, ...: apart from the prologue's buffer names; the C function is the group's
    base = dataclasses.replace(_renamed(kernel.func), name=_name(group))
    template = f"kiln.codegen.fused.{'softmax' if norm.op is Op.SOFTMAX else 'layernorm'}_rows"
    schedule = (f"# {template}({rows}, {n}, lanes={lanes}): the row schedule\n"
                f"{kernel.trace.as_python()}")
    x_buf, out_buf = base.inputs[0], base.outputs[0]
    if not prologue:
        return base, schedule, (x, *extra), (y,)
    body_of, params, values, trace = _prologue(graph, prologue, x,
                                               taken={b.name for b in base.params})
    outputs: list[Buffer] = []
    if x in group.outputs:  # write each row once, then read it back
        x_out = Buffer("row_x_out", (rows, n), DType.F32)
        outputs.append(x_out)
        loop = base.body
        assert isinstance(loop, For)
        write = _row_loop(loop.var, rows, n, lambda r, c: BufferStore(x_out, (r, c), body_of(r, c)))
        body = _replace_loads(loop.body, x_buf, lambda idx: Load(x_out, idx))
        body = For(loop.var, loop.extent, seq(write, body), loop.kind)
        outs: tuple[Value, ...] = (x, y)
    else:
        body = _replace_loads(base.body, x_buf, lambda idx: body_of(*idx))
        outs = (y,)
    func = PrimFunc(base.name, (*params, *base.inputs[1:]), (*outputs, out_buf), body)
    ins = (*values, *extra)
    ops = ", ".join(n.op.text for n in prologue)
    text = (f"{schedule}# its loads of x compute the prologue ({ops}), inlined by:\n"
            f"{trace.strip() or '# (one op: nothing to inline)'}")
    return func, text, ins, outs


@functools.lru_cache(maxsize=64)
def _row_kernel(kind: str, rows: int, n: int, eps: float, lanes: int) -> fused.RowKernel:
    """The scheduled row kernel, built once per shape (a transformer has one per layer)."""
    if kind == "softmax":
        return fused.softmax_rows(rows, n, name=kind, lanes=lanes)
    return fused.layernorm_rows(rows, n, eps, name=kind, lanes=lanes)


def _prologue(graph: Graph, nodes: Sequence[Node], x: Value, taken: set[str]):  # noqa: ANN202
    """The prologue's value at row-major position (r, c) of x, as an expression."""
    lowered = lower_chain(nodes, outputs=[x])
    sch = Schedule(lowered.func)
    out_name = lowered.func.outputs[0].name
    for name in sch.blocks():
        block = _block(sch.func, name)
        if not (isinstance(block.body, BufferStore) and block.body.buffer.name == out_name):
            sch.compute_inline(name)  # raises ScheduleError where it cannot: no kernel then
    blocks = [s for s in iter_stmts(sch.func.body) if isinstance(s, Block)]
    if len(blocks) != 1 or not isinstance(blocks[0].body, BufferStore) or blocks[0].init:
        raise NoRecipe("the prologue does not inline into one elementwise block")
    store = blocks[0].body
    ivs = [iv.var for iv in blocks[0].iter_vars]
    if list(store.indices) != ivs:
        raise NoRecipe("the prologue does not store x element by element")
    value, params, values = _inline_scalars(graph, store, lowered.func.inputs, lowered.inputs)
    assert isinstance(value, BufferStore)
    clash = [p.name for p in params if p.name in taken]
    if clash:
        raise NoRecipe(f"prologue buffer name {clash[0]} clashes with the row kernel's")
    shape = x.type.shape

    def at(r: Expr, c: Expr) -> Expr:
        mapping: dict[Var, Expr] = {ivs[-1]: c}
        inner = 1
        for k in range(len(shape) - 2, -1, -1):
            idx = r if inner == 1 else r // inner
            mapping[ivs[k]] = idx % shape[k] if k > 0 else idx
            if shape[k] == 1:
                mapping[ivs[k]] = const(0, DType.I64)
            inner *= shape[k]
        return substitute(value.value, mapping)
    return at, params, values, sch.trace.as_python()


def _renamed(func: PrimFunc) -> PrimFunc:
    body = func.body
    params = []
    for buf in func.params:
        new = dataclasses.replace(buf, name=f"row_{buf.name}")
        body = replace_buffer(body, buf, new)
        params.append(new)
    k = len(func.inputs)
    return PrimFunc(func.name, tuple(params[:k]), tuple(params[k:]), body)


def _block(func: PrimFunc, name: str) -> Block:
    for s in iter_stmts(func.body):
        if isinstance(s, Block) and s.name == name:
            return s
    raise NoRecipe(f"no block {name}")


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


def _name(group: KernelGroup) -> str:
    text = "_".join(dict.fromkeys(n.op.text for n in group.nodes))
    return "kiln_" + "".join(c if c.isalnum() else "_" for c in text)[:50]


# -- the safety net ---------------------------------------------------------------------------


def random_operands(graph: Graph, group: KernelGroup) -> dict[Value, torch.Tensor]:
    """Random tensors for the group's inputs (bool masks 0/1), the real weights for weights."""
    gen = torch.Generator().manual_seed(0)
    env: dict[Value, torch.Tensor] = {}
    for v in group.inputs:
        t = v.type
        if v.node.op is Op.CONSTANT:  # the real weight: kernels may bake in small ones
            env[v] = graph.constant(v.node)
        elif t.dtype is DType.BOOL:
            env[v] = torch.randint(0, 2, t.shape, generator=gen).bool()
        else:
            env[v] = torch.randn(t.shape, generator=gen).to(t.dtype.torch)
    return env


def agrees_with_library(graph: Graph, gk: GroupKernel) -> bool:
    """Run the kernel and the group's library calls on the same operands; compare."""
    env: dict[Value, object] = dict(random_operands(graph, gk.group))
    with torch.no_grad():
        for node in gk.group.nodes:
            results = evaluate_node(node, [env[v] if v in env else v.node.attrs.value  # type: ignore
                                           for v in node.inputs], graph)
            env.update(zip(node.outputs, results))
        outs = [torch.full(v.type.shape, float("nan")) for v in gk.outputs]
        operands = [gk.weight(graph, v) if v.node.op is Op.CONSTANT else env[v]
                    for v in gk.inputs]
        gk.kernel.run_unchecked(*[t.data_ptr() for t in operands],  # type: ignore
                                *[o.data_ptr() for o in outs])
    return all(_close(got, env[v]) for got, v in zip(outs, gk.outputs))  # type: ignore


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Infinities and NaNs at the same places (masks put -inf in), finite values within
    CHECK_TOLERANCE in relative L2."""
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(got)):
        return False
    if not torch.equal(got[~finite].nan_to_num(), want[~finite].nan_to_num()):
        return False
    a, b = got[finite].double(), want[finite].double()
    err = torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)
    return float(err) < CHECK_TOLERANCE
