"""Generated attention: the ``kiln::attention`` call the attention pass makes of a model's
softmax(Q Kᵀ · c + M) V becomes the loop program of `kiln.kernels.attention_schedule`, used only
where it measures faster than ATen's fused attention on its shapes, on this machine (the
contraction stage times the two side by side).

    %o = kiln::attention(Q, K, V, None, 0.125)  f32[1, 8, 1500, 64]:
        library 31.0 ms | kiln_attention_8x1500x1500x64 27.8 ms -> kiln_attention_8x1500x1500x64

The kernel reads Q, K and V where they lie (views of the projections, with the strides the
run time gives them: `runtime_strides`), a constant mask transposed once at compile time
(`transposed_mask`: it is read as the scores are, keys by queries), and computes the
decomposition's numerics, so it needs no run-time check of its inputs (see
`kiln.ir.fused.attention`). Not taken: a mask computed at run time, a value width that is
not whole vectors, types other than float32.
"""

from __future__ import annotations

import torch

from kiln.codegen.isa import target_isa
from kiln.ir import fused
from kiln.ir.attrs import CallAttrs
from kiln.ir.graph import Graph, Node
from kiln.ir.ops import Op
from kiln.ir.shared import packed
from kiln.ir.types import DType
from kiln.kernels.attention_schedule import (
    AttentionShape,
    default_attention_config,
    transposed_mask,
)
from kiln.kernels.build import checked_candidate
from kiln.kernels.checks import Checks
from kiln.kernels.outcome import Built, Skipped, SkipReason
from kiln.kernels.plan import KernelPlan
from kiln.kernels.strides import runtime_strides
from kiln.options import Options
from kiln.passes.partition import KernelGroup, singles
from kiln.tune.apply import tuned_or_default
from kiln.tune.space_attention import AttentionSpace

__all__ = ["attention_candidate", "attention_groups", "attention_shape", "attention_space",
           "plan_attention", "refusal"]

AttentionPlanned = tuple[KernelPlan, tuple, dict]


def attention_groups(graph: Graph) -> list[KernelGroup]:
    """One group per ``kiln::attention`` call the generated kernel takes (`refusal` None)."""
    if graph.device.type != "cpu":
        return []
    return singles(graph, lambda node: _is_attention(node) and refusal(node) is None)


def _is_attention(node: Node) -> bool:
    return node.op is Op.CALL and isinstance(node.attrs, CallAttrs) \
        and node.attrs.target is fused.attention._opoverload


def refusal(node: Node) -> str | None:
    """Why the generated kernel does not take this attention call; None where it does."""
    q, k, v, *mask = node.inputs
    if mask and mask[0].node.op is not Op.CONSTANT:
        return "a mask computed at run time (only a constant one is laid out for the kernel)"
    if any(x.type.dtype is not DType.F32 or len(x.type.shape) != 4 for x in (q, k, v)):
        return "not 4-d float32 operands"
    if any(d == 0 for x in (q, k, v) for d in x.type.shape):
        return "an empty tensor"
    return None


def attention_shape(graph: Graph, node: Node) -> AttentionShape:
    """The call's shapes, scale and the strides its operands have at run time."""
    q, k, v, *mask = node.inputs
    batch, heads, queries, depth = q.type.shape
    attrs = node.attrs
    assert isinstance(attrs, CallAttrs)
    extents = None
    if mask:
        dims = mask[0].type.shape
        full = (1,) * (4 - len(dims)) + tuple(dims)
        extents = (batch if full[0] > 1 else 1, heads if full[1] > 1 else 1)
    return AttentionShape(batch, heads, queries, k.type.shape[2], depth, v.type.shape[3],
                          float(attrs.args[4]), runtime_strides(graph, q),
                          runtime_strides(graph, k), runtime_strides(graph, v), extents)


def plan_attention(graph: Graph, group: KernelGroup,
                   options: Options) -> AttentionPlanned | Skipped:
    """The generated kernel's plan for a one-call group (the tuning database's best schedule
    where it has one), its operands (Q, K, V, and the mask) and the mask's layout for it."""
    space = attention_space(graph, group, options)
    if isinstance(space, Skipped):
        return space
    plan, _ = tuned_or_default(space, options)
    node, shape = group.last, space.shape
    weights = {}
    if shape.mask is not None:  # laid out once, here, as the kernel reads it
        mask = node.inputs[3]
        weights[mask] = packed(transposed_mask, graph.constant(mask.node), shape.batch,
                               shape.heads, shape.queries, shape.keys)
    return plan, tuple(node.inputs), weights


def attention_space(graph: Graph, group: KernelGroup,
                    options: Options) -> AttentionSpace | Skipped:
    """The design space of the generated kernel for a one-call group, or why there is none;
    its default point is `default_attention_config`, `kiln tune` searches the rest."""
    node = group.last
    why = refusal(node)
    if why is not None:
        return Skipped(group, SkipReason.NOT_LOWERABLE, why)
    shape = attention_shape(graph, node)
    isa = target_isa(options)
    if default_attention_config(isa, shape.v_depth, shape.queries) is None:
        return Skipped(group, SkipReason.NOT_LOWERABLE,
                       f"a value width of {shape.v_depth} has no register tile on {isa.label}")
    name = (f"kiln_attention_{shape.batch * shape.heads}x{shape.queries}x{shape.keys}"
            f"x{shape.depth}")
    return AttentionSpace(shape, isa, torch.get_num_threads(), name)


def attention_candidate(graph: Graph, group: KernelGroup, options: Options,
                        checks: Checks | None = None,
                        planned: AttentionPlanned | Skipped | None = None) -> Built | Skipped:
    """The generated attention for a one-call group, compiled and checked against the call on
    random operands with the run-time strides, not yet measured."""
    planned = planned if planned is not None else plan_attention(graph, group, options)
    return checked_candidate(graph, group, options, planned, checks)
