"""The rows recipe: a group closed by a last-axis softmax, layer norm, mean or sum, or by an
RMSNorm written out in arithmetic (`kiln.passes.rms_norm`).

The row kernel of `kiln.kernels.rows_schedule` (its compute definition and the row schedule:
rows in parallel, vectorized passes, reductions rfactored into lane partials) whose loads of
its input ``x[r, c]`` are replaced by the group's elementwise prologue, inlined
(compute_inline on the prologue's own lowering, then `plan.InlineRowPrologue`)::

    x = where(mask, -inf, scores); y = softmax(x)   ->   y[r, :] = softmax(where(...)[r, :])

When ``x`` itself is needed after the group (GPT-2's residual stream) each row is first
written to it once, then the row passes read it back from L1. A prologue that selects between
loads (GPT-2's ``where(mask, scores, -inf)``) vectorizes because the C renderer reads the
loads that are in bounds either way before the select (a blend, not a branch); with a bool
mask the row kernel uses `rows_schedule.BYTE_LANES` lanes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.kernels import rows_schedule
from kiln.kernels.loops import inline_scalars, read_views_in_place
from kiln.kernels.plan import (
    Compact,
    InlineRowPrologue,
    KernelPlan,
    Recipe,
    RenameParams,
    UnmaskScratchStores,
    VersionTails,
)
from kiln.passes.partition import KernelGroup
from kiln.passes.rms_norm import RmsNorm, rms_norm_at
from kiln.tir.lower import lower_chain
from kiln.tir.nodes import Block, BufferStore, For, ForKind, PrimFunc
from kiln.tir.schedule import Schedule
from kiln.tir.visit import iter_stmts

__all__ = ["NoRowKernel", "is_row_group", "plan_rows", "rms_norm_of"]

ROW_OPS = frozenset({Op.SOFTMAX, Op.LAYER_NORM, Op.MEAN, Op.SUM})
# the row schedule (`rows_schedule.<kind>_rows`) each op runs as
_KINDS = {Op.SOFTMAX: "softmax", Op.LAYER_NORM: "layernorm", Op.MEAN: "sum", Op.SUM: "sum"}


class NoRowKernel(Exception):
    """The group has a shape the rows recipe does not take."""


def plan_rows(graph: Graph, group: KernelGroup, lanes: int | None = None,
              strides: Mapping[Value, tuple[int, ...]] | None = None
              ) -> tuple[KernelPlan, Sequence[Value], Sequence[Value]]:
    """The group's plan, and the values its parameters stand for (inputs, outputs).
    ``lanes``: the width of the partial reductions (default: `default_lanes`);
    ``strides``: prologue inputs read with other than contiguous strides (views, as the run
    time gives them: `kiln.kernels.strides.runtime_strides`)."""
    norm = group.last
    rms = rms_norm_of(group)
    x, y = (rms.x if rms else norm.inputs[0]), norm.out(0)
    shape = x.type.shape
    n = shape[-1]
    rows = math.prod(shape[:-1])
    prologue = [node for node in group.nodes if node not in rms.nodes] if rms \
        else group.nodes[:-1]
    lanes = lanes or default_lanes(group)
    if any(v not in (x, y) for v in group.outputs) or (not prologue and x in group.outputs):
        raise NoRowKernel(f"{norm.name}: the group has outputs besides the row input and result")
    if rms and rms.weight is not None and rms.weight.node in prologue:
        raise NoRowKernel(f"{norm.name}: the norm's weight is computed in its own prologue")
    kind = "rmsnorm" if rms else _KINDS[norm.op]
    if rms:
        kernel = _row_kernel(kind, rows, n, rms.eps, lanes, rms.weight is not None)
        extra = (rms.weight,) if rms.weight is not None else ()
    elif norm.op is Op.SOFTMAX:
        kernel, extra = _row_kernel(kind, rows, n, 0.0, lanes), ()
    elif norm.op in (Op.MEAN, Op.SUM):  # (the partition takes last-axis ones only)
        if n == 0:
            raise NoRowKernel(f"{norm.name}: empty rows (a mean of none is NaN)")
        scale = 1.0 / n if norm.op is Op.MEAN else 1.0
        kernel, extra = _row_kernel(kind, rows, n, scale, lanes), ()
    else:
        w, b = norm.inputs[1], norm.inputs[2]
        if any(v.type.shape != (n,) or v.type.dtype is not DType.F32 for v in (w, b)):
            raise NoRowKernel(f"{norm.name}: weight and bias are not f32[{n}]")
        eps = norm.attrs.eps  # type: ignore[attr-defined]
        kernel = _row_kernel(kind, rows, n, eps, lanes)
        extra = (w, b)
    template = f"rows_schedule.{kind}_rows"
    # row_x, row_w, ...: apart from the prologue's buffer names; the C function is the group's
    plan = KernelPlan(Recipe.ROWS, kernel.lowered, kernel.trace,
                      (Compact(), VersionTails(_serial_loops(kernel.func)),
                       UnmaskScratchStores(), RenameParams(kernel_name(group), "row_")),
                      notes=f"# {template}({rows}, {n}, lanes={lanes}): the row schedule",
                      scheduled=kernel.scheduled)
    if not prologue:
        return plan, (x, *extra), (y,)
    taken = {f"row_{b.name}" for b in kernel.lowered.params}
    inline, values, trace = _prologue(graph, prologue, x, x in group.outputs, taken,
                                      strides or {})
    ops = ", ".join(node.op.text for node in prologue)
    notes = (f"{plan.notes}\n# its loads of x compute the prologue ({ops}), inlined by:\n"
             f"{_comment(trace) or '# (one op: nothing to inline)'}")
    plan = dataclasses.replace(plan, post=(*plan.post, inline), notes=notes)
    outs = (x, y) if inline.write_x else (y,)
    return plan, (*values, *extra), outs


def _serial_loops(func: PrimFunc) -> tuple[str, ...]:
    """The serial loops, among them the loops over a row's chunks of lanes: where the row is
    no multiple of the lanes, the last chunk's bounds checks are kept out of the others
    (`kiln.tir.tails.version_tails` versions a loop only on the guards that change with it,
    so the others stay as they are)."""
    return tuple(f.var.name for f in iter_stmts(func.body)
                 if isinstance(f, For) and f.kind is ForKind.SERIAL)


def default_lanes(group: KernelGroup) -> int:
    """A vector of fp32 lanes, or of bytes where a row pass also reads a bool mask."""
    reads_bytes = any(v.type.dtype is DType.BOOL for node in group.nodes[:-1]
                      for v in node.inputs)
    return rows_schedule.BYTE_LANES if reads_bytes else rows_schedule.LANES


def rms_norm_of(group: KernelGroup) -> RmsNorm | None:
    """The RMSNorm that ends ``group`` (`kiln.passes.rms_norm`), or None."""
    if group.last.op in ROW_OPS:
        return None
    means = [node for node in group.nodes[:-1] if node.op is Op.MEAN]
    if len(means) != 1:
        return None
    users: dict[Node, list[Node]] = {node: [] for node in group.nodes}
    for node in group.nodes:
        for producer in dict.fromkeys(v.node for v in node.inputs):
            users.setdefault(producer, []).append(node)
    norm = rms_norm_at(means[0], users, set(group.outputs))
    return norm if norm is not None and norm.last is group.last else None


def is_row_group(group: KernelGroup) -> bool:
    """Whether the rows recipe (not the loops recipe) plans ``group``."""
    return group.last.op in ROW_OPS or rms_norm_of(group) is not None


@functools.lru_cache(maxsize=64)
def _row_kernel(kind: str, rows: int, n: int, constant: float, lanes: int,
                weighted: bool = True) -> rows_schedule.RowKernel:
    """The scheduled row kernel of ``kind`` (a `_KINDS` value or "rmsnorm"), built once per
    shape (a transformer has one per layer). ``constant``: layer norm's or RMSNorm's eps, or
    a sum's scale (1/n for a mean); softmax takes none. ``weighted``: an RMSNorm with a
    weight."""
    if kind == "rmsnorm":
        return rows_schedule.rmsnorm_rows(rows, n, constant, weighted, name=kind, lanes=lanes)
    if kind == "softmax":
        return rows_schedule.softmax_rows(rows, n, name=kind, lanes=lanes)
    if kind == "sum":
        return rows_schedule.sum_rows(rows, n, constant, name=kind, lanes=lanes)
    return rows_schedule.layernorm_rows(rows, n, constant, name=kind, lanes=lanes)


def _prologue(graph: Graph, nodes: Sequence[Node], x: Value, write_x: bool, taken: set[str],
              strides: Mapping[Value, tuple[int, ...]]
              ) -> tuple[InlineRowPrologue, tuple[Value, ...], str]:
    """The prologue as one expression over its inputs (views among them read where they
    lie), and the trace that inlined it."""
    lowered = lower_chain(nodes, outputs=[x])
    sch = Schedule(lowered.func)
    out_name = lowered.func.outputs[0].name
    for name in sch.blocks():
        block = _block(sch, name)
        if not (isinstance(block.body, BufferStore) and block.body.buffer.name == out_name):
            sch.compute_inline(name)  # raises ScheduleError where it cannot: no kernel then
    blocks = [s for s in iter_stmts(sch.func.body) if isinstance(s, Block)]
    if len(blocks) != 1 or not isinstance(blocks[0].body, BufferStore) or blocks[0].init:
        raise NoRowKernel("the prologue does not inline into one elementwise block")
    store = blocks[0].body
    ivs = tuple(iv.var for iv in blocks[0].iter_vars)
    if tuple(store.indices) != ivs:
        raise NoRowKernel("the prologue does not store x element by element")
    value, params, values = inline_scalars(graph, store, lowered.func.inputs, lowered.inputs)
    # (a view read across the row with a stride gathers: a dense copy before the kernel
    # costs less, T5's position bias 295 us read in place against 74 + the copy)
    along = {v: s for v, s in strides.items() if s and s[-1] == 1}
    value, params = read_views_in_place(value, params, values, along)
    assert isinstance(value, BufferStore)
    clash = [p.name for p in params if p.name in taken]
    if clash:
        raise NoRowKernel(f"prologue buffer name {clash[0]} clashes with the row kernel's")
    inline = InlineRowPrologue(value.value, ivs, x.type.shape, params, write_x)
    return inline, values, sch.trace.as_python()


def _block(sch: Schedule, name: str) -> Block:
    for s in iter_stmts(sch.func.body):
        if isinstance(s, Block) and s.name == name:
            return s
    raise NoRowKernel(f"no block {name}")


def _comment(python: str) -> str:
    return "\n".join(f"# {line}" for line in python.strip().splitlines())


def kernel_name(group: KernelGroup) -> str:
    text = "_".join(dict.fromkeys(n.op.text for n in group.nodes))
    return "kiln_" + "".join(c if c.isalnum() else "_" for c in text)[:50]
