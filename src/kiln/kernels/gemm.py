"""Generated GEMMs (``Options.generated_gemm``): an ``mm``/``addmm``/``addmm_act`` node becomes
the GEMM of `kiln.kernels.gemm_schedule`: one candidate of `kiln.kernels.contractions`, used
only where it measures fastest, on this machine, at the node's shapes.

A constant B (a Linear weight) is packed once, at compile time, into the panel layout the
kernel reads (`gemm_schedule.pack_b`: f32[ceil(N/NR), K, NR]); the kernel then streams its
panels in place, where the library re-packs the weight on every call. An ``addmm_act``'s
activation runs in the register tile's write-back (`plan.Epilogue`), so Linear + bias + GELU
is one kernel and one pass over the output.

Each distinct kernel is built once and checked against the library on random inputs with the
real weights; the contraction stage then times it. The kernel's plan is its schedule
(replayable Python) and its lowering post-passes; ``kiln explain MODEL --kernels`` shows it
and the measurement.
"""

from __future__ import annotations

import dataclasses

import torch

from kiln.codegen.isa import target_isa
from kiln.cost.machine import full_rate_512
from kiln.ir.attrs import AddmmActAttrs
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.shared import packed
from kiln.kernels.build import checked_candidate
from kiln.kernels.checks import Checks
from kiln.kernels.gemm_schedule import GemmConfig, default_gemm_config, pack_b
from kiln.kernels.outcome import Built, Skipped, SkipReason
from kiln.kernels.plan import Epilogue, KernelPlan
from kiln.kernels.plan_store import stored_plan
from kiln.kernels.streaming import streams_weights
from kiln.kernels.strides import runtime_strides
from kiln.options import Options
from kiln.passes.partition import KernelGroup, residual_bias
from kiln.tir.lower_elementwise import activation
from kiln.tir.te import NotLowerable
from kiln.tune.apply import TUNED, tuned_schedule
from kiln.tune.space import GemmSpace

__all__ = ["gemm_candidate", "gemm_space", "plan_gemm", "runtime_strides"]



GemmPlanned = tuple[KernelPlan, tuple[Value, ...], dict[Value, torch.Tensor]]


def gemm_space(graph: Graph, group: KernelGroup, options: Options) -> GemmSpace | Skipped:
    """The design space of the generated GEMM for an mm / addmm / addmm_act group (one
    node, or an [M, N] bias's ``add(residual, row)`` and the GEMM: `partition.gemms`): its
    shapes, bias, whether B is a constant packed at compile time, and its epilogue. Its
    default point is the heuristic schedule; `kiln tune` searches the rest."""
    node = group.last
    if node.op is Op.BMM:
        return _bmm_space(graph, group, options)
    bias, a, b = node.inputs if node.op is not Op.MM else (None, *node.inputs)
    (m, k), n = a.type.shape, b.type.shape[1]
    if k == 1:  # (an outer product: nothing to block, and ATen's is the term itself)
        return Skipped(group, SkipReason.NOT_LOWERABLE, "K = 1: ATen's product is the one "
                       "term, -0.0 included, where the kernel's sum from 0.0 gives 0.0")
    epilogue = _epilogue(node)
    if epilogue is False:
        return Skipped(group, SkipReason.NOT_LOWERABLE,
                       f"no loop form for {node.attrs} as an epilogue")
    if epilogue is not None and k == 0:  # (the result is act(bias); the library does that)
        return Skipped(group, SkipReason.NOT_LOWERABLE, "K = 0: no K block to end with the "
                       "epilogue")
    matrix = bias is not None and len(bias.type.shape) == 2  # addmm's [M, N] input
    row = len(group.nodes) == 2  # (that input is the sum of the group's first node)
    suffix = "_rb" if row else "_r" if matrix else ""
    return GemmSpace(m, n, k, target_isa(options), torch.get_num_threads(),
                     full_rate_512=full_rate_512(options), bias=bias is not None,
                     b_prepacked=b.node.op is Op.CONSTANT, epilogue=epilogue,
                     name=f"kiln_gemm_{m}x{n}x{k}{suffix}", bias_matrix=matrix, bias_row=row,
                     streamed=streams_weights(graph, group))


def plan_gemm(graph: Graph, group: KernelGroup, options: Options) -> GemmPlanned | Skipped:
    """The plan of the generated GEMM for an mm / bmm / addmm / addmm_act group, its inputs
    (A, B, then the bias, or the residual and its row), and the weights packed for it: the
    tuner's choice (`kiln.tune.apply.tuned_schedule`, ``Options.tuning_db``) where it has
    one, else the heuristic."""
    space = gemm_space(graph, group, options)
    if isinstance(space, Skipped):
        return space
    m, n, k = space.m, space.n, space.k
    node = group.last
    bias, a, b = node.inputs if node.op not in (Op.MM, Op.BMM) else (None, *node.inputs)
    tuned = tuned_schedule(space, options)
    if tuned is None and space.batch:  # each batch on one thread
        config = space.config(space.default())
        plan = stored_plan(space, config, options)
    elif tuned is None:  # the heuristic as it always was: sized for every core
        config = default_gemm_config(m, n, k, base=GemmConfig.for_isa(space.isa),
                                     b_prepacked=space.b_prepacked,
                                     one_k_block=space.epilogue is not None,
                                     full_rate_512=space.full_rate_512)
        plan = stored_plan(space, config, options)
    else:  # the decisions head the trace: the plan says it was tuned
        config = space.config(tuned[0])
        plan = space.plan(tuned[0])
        plan = dataclasses.replace(plan, notes=plan.notes + f"\n# {TUNED} (recorded median "
                                   f"{tuned[1] * 1e6:.1f} us)")
    weights = {}
    if space.b_prepacked:  # packed once, here: the kernel reads B's panels in place
        weights[b] = packed(pack_b, graph.constant(b.node), config.nr)
    operands = (a, b) if bias is None else (a, b, bias)
    if space.bias_row:  # the sum stays in the kernel: its operands are the inputs
        operands = (a, b, *residual_bias(bias, graph.users(), set(graph.outputs)))  # type: ignore
    return plan, operands, weights


def _bmm_space(graph: Graph, group: KernelGroup, options: Options) -> GemmSpace | Skipped:
    """A bmm's space: the batch on the threads, each batch a one-thread GEMM, A and B read
    with the strides the run time gives them (`runtime_strides`: attention's operands are
    views of a projection)."""
    a, b = group.last.inputs
    batch, m, k = a.type.shape
    n = b.type.shape[2]
    if k == 1:  # (as for mm: see `gemm_space`)
        return Skipped(group, SkipReason.NOT_LOWERABLE, "K = 1: ATen's product is the one "
                       "term, -0.0 included, where the kernel's sum from 0.0 gives 0.0")
    if batch < 2 or 0 in (m, n, k):  # (one batch: the mm, which the graph passes make it)
        return Skipped(group, SkipReason.NOT_LOWERABLE, f"batch {batch} of {m}x{n}x{k}")
    return GemmSpace(m, n, k, target_isa(options), torch.get_num_threads(),
                     full_rate_512=full_rate_512(options),
                     name=f"kiln_bmm_{batch}x{m}x{n}x{k}", batch=batch,
                     a_strides=runtime_strides(graph, a), b_strides=runtime_strides(graph, b))


def gemm_candidate(graph: Graph, group: KernelGroup, options: Options,
                   checks: Checks | None = None,
                   planned: GemmPlanned | Skipped | None = None) -> Built | Skipped:
    """The generated GEMM for a one-node mm / addmm / addmm_act group, compiled and checked
    against the library (``checks`` remembers the answers), not yet measured."""
    planned = planned if planned is not None else plan_gemm(graph, group, options)
    return checked_candidate(graph, group, options, planned, checks)


def _epilogue(node: Node) -> Epilogue | None | bool:
    """The node's activation as a GEMM epilogue; None for none; False where it has no loop
    form."""
    if node.op is not Op.ADDMM_ACT:
        return None
    attrs = node.attrs
    assert isinstance(attrs, AddmmActAttrs)
    try:
        activation(attrs.activation, attrs.act_args)
    except NotLowerable:
        return False
    return Epilogue(attrs.activation, attrs.act_args)
