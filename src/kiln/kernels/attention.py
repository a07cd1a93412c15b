"""Generated attention: an attention call becomes the loop program of
`kiln.kernels.attention_schedule`, used only where it measures faster than ATen's fused
attention on its shapes, on this machine (the contraction stage times the two side by side).
The calls are the attention pass's ``kiln::attention`` (the decomposed softmax(Q Kᵀ · c + M) V
of a model's eager attention) and the model's own ``scaled_dot_product_attention`` (Hugging
Face's default), which torch.export leaves as ATen's CPU flash entry point.

    %o = kiln::attention(Q, K, V, None, 0.125)  f32[1, 8, 1500, 64]:
        library 31.0 ms | kiln_attention_8x1500x1500x64 25.7 ms -> kiln_attention_8x1500x1500x64

The kernel reads Q, K and V where they lie (views of the projections, with the strides the
run time gives them: `runtime_strides`). A constant mask is laid out once at compile time
(`transposed_mask`: keys by queries, as the scores are, in panels of the default block of
queries, so that each block reads its part in order); one the model computes
(a padded batch's attention mask, float or bool) is read where it lies and transposed inside
the kernel (`RuntimeMask`). ATen's ``is_causal`` masks the keys after each query, and a
block of queries skips the keys after its last query; so does a constant causal mask
(`_causal_constant`: nanoGPT's fill, or the float mask torch.export leaves of Hugging Face's,
the latter where a test of the operands each call finds every score bounded). Where the
call's one reader is the transpose of heads and queries a model reshapes next, the kernel
writes that layout and the reshape is a view.

Its numerics are the decomposition's, which ``kiln::attention`` computes wherever an operand
is not finite (`kiln.ir.fused.attention`): so no run-time check there. ATen's own call answers
an empty row (every key masked) and non-finite operands in its own way, and a bool mask of
``kiln::attention`` selects (a score of +inf or NaN where the query attends no key is -inf
there, not NaN as the kernel's 0 / -inf added makes it); for these the library runs again
wherever the kernel's output is not finite (`Built.library_where_not_finite`: where the
kernel's output is finite, no such score was met).

A call of fewer than 16 queries (a decode step's one token, or a shared key head's stacked
query heads: `kiln.passes.grouped_heads`) runs the few-queries kernel of
`kiln.kernels.attention_decode` instead, masked or causal alike, each query a row with the
head dimension in the lanes (the query-block kernel filled one lane of 16 there). It has no
tuning space: `kiln tune` leaves such calls alone.

With ``enable_gqa`` (grouped-query attention: fewer key and value heads than query heads,
as Hugging Face's sdpa path calls it for Llama-style models), each query head reads its
group's key head where it lies.

Not taken (the call stays): dropout, a mask together with ``is_causal``, operands that
broadcast, a value width that is not whole vectors, types other than float32, a read
log-sum-exp.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from kiln.codegen.isa import target_isa
from kiln.ir import fused
from kiln.ir.attrs import CallAttrs, Operand, PermuteAttrs
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.shared import packed
from kiln.ir.types import DType
from kiln.kernels.attention_decode import decode_attention_plan, decode_shape, decodes
from kiln.kernels.attention_schedule import (
    AttentionShape,
    RuntimeMask,
    default_attention_config,
    laid_mask,
    stops_at_diagonal,
    transposed_mask,
)
from kiln.kernels.build import checked_candidate
from kiln.kernels.checks import Checks
from kiln.kernels.outcome import Built, Skipped, SkipReason
from kiln.kernels.plan import KernelPlan
from kiln.kernels.strides import runtime_strides
from kiln.options import Options
from kiln.passes.partition import KernelGroup, chain
from kiln.tune.apply import tuned_or_default
from kiln.tune.space_attention import AttentionSpace

__all__ = ["AttentionCall", "attention_call", "attention_candidate", "attention_groups",
           "attention_shape", "attention_space", "plan_attention", "refusal",
           "scores_bounded"]

AttentionPlanned = tuple[KernelPlan, tuple, dict]
# ATen's fused attention as a model calls it, and as torch.export leaves that call on CPU
# (the flash kernel's entry point; its second result, the log-sum-exp, unread in inference)
_ATEN = (torch.ops.aten.scaled_dot_product_attention.default,
         torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def attention_groups(graph: Graph) -> list[KernelGroup]:
    """One group per attention call: the attention pass's ``kiln::attention``, or the
    model's own ATen fused attention whose log-sum-exp (a second result) nothing reads. A
    call the generated kernel refuses is a group of its own (`attention_space` says why,
    and the report shows it). Where the call's one reader is the transpose of heads and
    queries that a model reshapes to [B, L, H * Ev] next, the group takes it in: the kernel
    writes that layout, and the reshape is a view."""
    if graph.device.type != "cpu":
        return []
    read = {v for n in graph.nodes for v in n.inputs} | set(graph.outputs)
    users = graph.users()
    returned = set(graph.outputs)
    groups = []
    for node in graph.nodes:
        if attention_call(node) is None or any(v in read for v in node.outputs[1:]):
            continue
        after = users.get(node, [])
        heads_out = refusal(node) is None and len(after) == 1 and node.out() not in returned \
            and after[0].op is Op.PERMUTE and after[0].inputs[0] == node.out() \
            and isinstance(after[0].attrs, PermuteAttrs) \
            and tuple(d % 4 for d in after[0].attrs.dims) == (0, 2, 1, 3)
        groups.append(chain(graph, [node, after[0]] if heads_out else [node]))
    return groups


@dataclass(frozen=True)
class AttentionCall:
    """An attention call's operands and arguments."""

    q: Value
    k: Value
    v: Value
    mask: Value | None
    scale: float | None  # None: 1 / sqrt(E)
    causal: bool = False  # ATen's ``is_causal``
    dropout: float = 0.0
    grouped: bool = False  # ATen's ``enable_gqa``: K and V with fewer heads
    # ATen's call (the model's own): its results for non-finite operands are its kernel's,
    # not the decomposition's, so the library runs again where the kernel's are not finite
    aten: bool = False

    @property
    def library_where_not_finite(self) -> bool:
        """Whether the library's results must replace the kernel's where those are not
        finite: ATen's call, or a bool mask that selects (the module docstring)."""
        return self.aten or (self.mask is not None and self.mask.type.dtype is DType.BOOL)


def attention_call(node: Node) -> AttentionCall | None:
    """The call as an `AttentionCall`, or None where it is no attention call."""
    if node.op is not Op.CALL or not isinstance(node.attrs, CallAttrs):
        return None
    attrs = node.attrs

    def value(arg: Any) -> Value | None:
        return node.inputs[arg.index] if isinstance(arg, Operand) else None

    if attrs.target is fused.attention._opoverload:
        q, k, v, mask, scale = attrs.args
        query, key = value(q), value(k)
        grouped = query is not None and key is not None and len(key.type.shape) == 4 \
            and query.type.shape[1] != key.type.shape[1]  # (its keys' heads shared)
        return AttentionCall(query, key, value(v), value(mask), float(scale),
                             grouped=grouped)
    if attrs.target not in _ATEN:
        return None
    schema = attrs.target._schema.arguments
    bound = {a.name: a.default_value if a.has_default_value() else None for a in schema}
    bound.update(zip((a.name for a in schema), attrs.args))
    bound.update(dict(attrs.kwargs))
    if not all(isinstance(bound[n], Operand) for n in ("query", "key", "value")):
        return None
    mask = bound["attn_mask"]
    q, k = value(bound["query"]), value(bound["key"])
    # (the CPU flash entry point has no enable_gqa: it takes fewer key heads as groups)
    grouped = bool(bound["enable_gqa"]) if "enable_gqa" in bound \
        else q.type.shape[1:2] != k.type.shape[1:2]
    return AttentionCall(q, k, value(bound["value"]), value(mask), bound["scale"],
                         bool(bound["is_causal"]), float(bound["dropout_p"]), grouped,
                         aten=True)


def refusal(node: Node) -> str | None:
    """Why the generated kernel does not take this attention call; None where it does."""
    call = attention_call(node)
    if call is None:
        return "not an attention call"
    q, k, v = call.q, call.k, call.v
    if call.dropout:
        return "dropout"
    if any(x.type.dtype is not DType.F32 or len(x.type.shape) != 4 for x in (q, k, v)):
        return "not 4-d float32 operands"
    if call.mask is not None:
        mask = call.mask.type
        if call.causal:
            return "a mask and is_causal"
        if mask.dtype not in (DType.F32, DType.BOOL):
            return f"a {mask.dtype.name} mask"
        full = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
        if len(full) != 4 or any(n not in (1, want) for n, want in zip(
                full, (*q.type.shape[:3], k.type.shape[2]))):
            return f"a mask of shape {list(mask.shape)} (each dim 1 or the scores' [B, H, L, S])"
    heads, kv_heads = q.type.shape[1], k.type.shape[1]
    grouped = call.grouped and kv_heads and heads % kv_heads == 0
    if k.type.shape[0] != q.type.shape[0] or v.type.shape[:3] != k.type.shape[:3] \
            or (kv_heads != heads and not grouped):
        return "operands whose batch, heads or keys differ (broadcast)"
    if any(d == 0 for x in (q, k, v) for d in x.type.shape):
        return "an empty tensor"
    return None


def attention_shape(graph: Graph, node: Node, heads_inner: bool = False) -> AttentionShape:
    """The call's shapes, scale and the strides its operands have at run time; with
    ``heads_inner``, its result written transposed ([B, L, H, Ev])."""
    call = attention_call(node)
    assert call is not None
    q, k, v = call.q, call.k, call.v
    batch, heads, queries, depth = q.type.shape
    extents, runtime = None, None
    causal = call.causal or _causal_constant(graph, call) is not None
    if call.mask is not None and not causal:
        dims = tuple(call.mask.type.shape)
        full = (1,) * (4 - len(dims)) + dims
        extents = (batch if full[0] > 1 else 1, heads if full[1] > 1 else 1)
        if call.mask.node.op is not Op.CONSTANT:  # (a constant is laid out for it instead)
            runtime = RuntimeMask(dims, runtime_strides(graph, call.mask),
                                  call.mask.type.dtype is DType.BOOL)
    scale = call.scale if call.scale is not None else depth ** -0.5
    return AttentionShape(batch, heads, queries, k.type.shape[2], depth, v.type.shape[3],
                          scale, runtime_strides(graph, q), runtime_strides(graph, k),
                          runtime_strides(graph, v), extents, runtime, causal,
                          heads_inner, k.type.shape[1] if k.type.shape[1] != heads else 0)


# a constant float mask's value above the diagonal that counts as -inf: with every score
# finite and below `fused._SCORE_BOUND` in size (the run-time test), its exponential is 0
CAUSAL_FILL = -1e35


def _causal_constant(graph: Graph, call: AttentionCall) -> str | None:
    """How the call's mask, a constant over as many keys as queries, lets each query attend
    the keys up to its own and no other, where it does: "selects" (a bool one: nanoGPT's
    ``masked_fill`` of a causal buffer, as the attention pass inverts it) or "adds" (a
    float one, 0 there and -inf or below `CAUSAL_FILL` after: Hugging Face's causal mask as
    torch.export materializes it). The kernel then masks as ``is_causal`` does, reads no
    mask and skips the keys after each block of queries; an added mask only where the
    scores are finite and bounded (`Built.run_if`: +inf + -inf is NaN, which a select
    would not make, and a finite fill must underflow). None: no such mask."""
    mask = call.mask
    queries, keys = call.q.type.shape[2], call.k.type.shape[2]
    if mask is None or mask.node.op is not Op.CONSTANT or queries != keys \
            or tuple(mask.type.shape[-2:]) != (queries, keys) \
            or mask.type.dtype not in (DType.BOOL, DType.F32):
        return None
    values = graph.constant(mask.node).reshape(-1, queries, keys)
    tril = torch.ones(queries, keys, dtype=torch.bool).tril()
    if mask.type.dtype is DType.BOOL:
        return "selects" if bool((values == tril).all()) else None
    hidden = ~tril.expand_as(values)  # (no boolean indexing: a quarter of the time)
    causal = torch.equal(values <= CAUSAL_FILL, hidden) \
        and bool((values.masked_fill(hidden, 0.0) == 0).all())  # (NaN fails either)
    return "adds" if causal else None


def scores_bounded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> bool:
    """Every operand finite and every score below `fused._SCORE_BOUND` in size: an added
    causal mask's fill then makes an exponential of 0, as the kernel's skipped keys do."""
    return fused._fused_attention_is_exact(q, k, v, None, scale)


def plan_attention(graph: Graph, group: KernelGroup,
                   options: Options) -> AttentionPlanned | Skipped:
    """The generated kernel's plan for an attention group (the tuning database's best schedule
    where it has one), its operands (Q, K, V, and the mask) and the mask's layout for it."""
    space = attention_space(graph, group, options)
    if isinstance(space, Skipped):
        return space
    call, shape = attention_call(group.nodes[0]), space.shape
    assert call is not None
    constant_mask = shape.mask is not None and shape.runtime_mask is None
    if decodes(shape):  # a few queries: the keys along the work (no tuning space)
        plan = decode_attention_plan(decode_shape(shape), space.name.replace(
            "kiln_attention", "kiln_attention_decode"))
        layout = (_decode_mask, ())
    else:
        plan, _ = tuned_or_default(space, options)
        layout = (transposed_mask, (shape.mask_panel,))
    weights = {}
    if constant_mask:  # laid out once, here
        pack, extra = layout
        weights[call.mask] = packed(pack, graph.constant(call.mask.node), shape.batch,
                                    shape.heads, shape.queries, shape.keys, *extra)
    operands = (call.q, call.k, call.v) + ((call.mask,) if shape.mask is not None else ())
    return plan, operands, weights


def _decode_mask(mask: torch.Tensor, batch: int, heads: int, queries: int,
                 keys: int) -> torch.Tensor:
    """A constant mask as the decode kernel reads it (`attention_decode.decode_shape`)."""
    return laid_mask(mask, batch, heads, queries, keys).contiguous()


def attention_space(graph: Graph, group: KernelGroup,
                    options: Options) -> AttentionSpace | Skipped:
    """The design space of the generated kernel for an `attention_groups` group, or why
    there is none; its default point is `default_attention_config`, `kiln tune` searches the
    rest."""
    node = group.nodes[0]
    why = refusal(node)
    if why is not None:
        return Skipped(group, SkipReason.NOT_LOWERABLE, why)
    shape = attention_shape(graph, node, heads_inner=len(group.nodes) == 2)
    isa = target_isa(options)
    config = default_attention_config(isa, shape.v_depth, shape.queries, shape.heads,
                                      stops=stops_at_diagonal(shape))
    if config is None:
        return Skipped(group, SkipReason.NOT_LOWERABLE,
                       f"a value width of {shape.v_depth} has no register tile on {isa.label}")
    if shape.mask is not None and shape.runtime_mask is None:  # (panels of the default block)
        shape = dataclasses.replace(shape, mask_panel=config.qb)
    name = (f"kiln_attention_{shape.batch * shape.heads}x{shape.queries}x{shape.keys}"
            f"x{shape.depth}{'_causal' if shape.causal else ''}")  # (the report names it)
    return AttentionSpace(shape, isa, torch.get_num_threads(), name)


def attention_candidate(graph: Graph, group: KernelGroup, options: Options,
                        checks: Checks | None = None,
                        planned: AttentionPlanned | Skipped | None = None) -> Built | Skipped:
    """The generated attention for an attention group, compiled and checked against its calls on
    random operands with the run-time strides, not yet measured."""
    planned = planned if planned is not None else plan_attention(graph, group, options)
    call = attention_call(group.nodes[0])
    built = checked_candidate(graph, group, options, planned, checks,
                              library_where_not_finite=call is not None
                              and call.library_where_not_finite)
    if isinstance(built, Built) and call is not None and _causal_constant(graph, call) == "adds":
        scale = call.scale if call.scale is not None else call.q.type.shape[3] ** -0.5
        built = dataclasses.replace(built, run_if=(functools.partial(scores_bounded,
                                                                     scale=scale), (0, 1, 2)))
    return built
