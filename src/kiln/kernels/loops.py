"""The loops recipe: an elementwise-only group as `kiln.tir.lower.lower_chain` gives it,
one-element weights as literals, then the default schedule of
`kiln.kernels.loops_schedule` (intermediates inlined, vectorized, parallel).

    %t = add(%x, %b); %y = relu(%t)    ->    for i (parallel): for j (vectorized):
                                                 y[i, j] = max(x[i, j] + b[j], 0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kiln.ir.graph import Graph, Value
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.kernels.loops_schedule import VECTOR, default_schedule
from kiln.kernels.plan import Compact, KernelPlan, Recipe
from kiln.passes.partition import KernelGroup
from kiln.tir.lower import lower_chain
from kiln.tir.nodes import Buffer, Expr, Load, PrimFunc, Stmt, const
from kiln.tir.visit import map_stmt, replace_buffer

__all__ = ["inline_scalars", "plan_loops", "read_views_in_place"]


def plan_loops(graph: Graph, group: KernelGroup, vector: int = VECTOR,
               strides: Mapping[Value, tuple[int, ...]] | None = None,
               out_strides: Mapping[Value, tuple[int, ...]] | None = None
               ) -> tuple[KernelPlan, Sequence[Value], Sequence[Value]]:
    """The group's plan, and the values its parameters stand for (inputs, outputs).
    ``vector``: the lanes a single long loop is split into (`default_schedule`);
    ``strides``: inputs read with other than contiguous strides (views, as the run time
    gives them: `kiln.kernels.strides.runtime_strides`; NHWC values); ``out_strides``:
    outputs written so (NHWC between convolutions), the loops then in memory order."""
    lowered = lower_chain(group.nodes, outputs=group.outputs)
    body, params, values = inline_scalars(graph, lowered.func.body, lowered.func.inputs,
                                          lowered.inputs)
    body, params = read_views_in_place(body, params, values, strides or {})
    body, outputs = read_views_in_place(body, lowered.func.outputs, lowered.outputs,
                                        out_strides or {})
    program = PrimFunc(lowered.func.name, params, outputs, body)
    scheduled, trace = default_schedule(program, vector)
    plan = KernelPlan(Recipe.LOOPS, program, trace, (Compact(),),
                      notes="# kiln.kernels.loops_schedule.default_schedule",
                      scheduled=scheduled)
    return plan, values, lowered.outputs


def read_views_in_place(body: Stmt, params: Sequence[Buffer], values: Sequence[Value],
                         strides: Mapping[Value, tuple[int, ...]]
                         ) -> tuple[Stmt, tuple[Buffer, ...]]:
    """Inputs that are views (a permute of a GEMM's output: Llama's rotary embedding reads
    q and k so; T5's position bias, a permute of an embedding, in its softmax's prologue)
    read with the strides the run time gives them. Declared contiguous, the
    executor's check found them strided on every call and ran the library calls instead:
    72-85 us for a kernel timed at 7 us."""
    new_params = []
    for buf, v in zip(params, values):
        given = strides.get(v)
        if given is not None and len(given) == buf.rank and buf.strides is None:
            strided = dataclasses.replace(buf, strides=given)
            body = replace_buffer(body, buf, strided)
            buf = strided
        new_params.append(buf)
    return body, tuple(new_params)


def inline_scalars(graph: Graph, body: Stmt, params: Sequence[Buffer], values: Sequence[Value]
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
