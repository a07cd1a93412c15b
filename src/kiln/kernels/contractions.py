"""Contractions (GEMMs and convolutions) run by whichever kernel is fastest on their shapes,
on this machine: the node's own ATen call, kiln's generated GEMM on weights packed at compile
time (`kiln.kernels.gemm`), kiln's generated depthwise or dense direct convolution on
channels-last data (`kiln.kernels.depthwise`, `kiln.kernels.conv`), or the library's kernel
on weights reordered once (`kiln.kernels.library`, oneDNN). Pools, the weightless window
reductions, compete the same way (`kiln.kernels.pool`). Each candidate is checked
against the ATen call first; then all are timed together with it, interleaved
(`kiln.kernels.decide.fastest`), and the decision is kept on disk.

    addmm_act(b, x, Wt){gelu}  f32[128, 3072]:
        library 3.61 ms | kiln_gemm_128x3072x768 2.95 ms | onednn_linear_packed 3.02 ms
        -> kiln_gemm_128x3072x768
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.codegen.kernel import prebuild
from kiln.ir.graph import Graph
from kiln.kernels.checks import Checks
from kiln.kernels.conv import conv_candidate, conv_groups, plan_conv
from kiln.kernels.decide import Decisions, fastest
from kiln.kernels.depthwise import depthwise_candidate, depthwise_groups, plan_depthwise
from kiln.kernels.gemm import gemm_candidate, plan_gemm
from kiln.kernels.library import library_candidates, library_groups
from kiln.kernels.outcome import Built, KernelBuild, Skipped, SkipReason
from kiln.kernels.pool import plan_pool, pool_candidate, pool_groups
from kiln.options import Options
from kiln.passes.partition import KernelGroup, alone, gemms

__all__ = ["build_contraction_kernels", "contraction_groups"]


def contraction_groups(graph: Graph) -> list[KernelGroup]:
    """One group per GEMM a generated kernel may run or contraction a library variant takes."""
    groups = {g.last: g for g in library_groups(graph)}
    groups.update({g.last: g for g in gemms(graph)})
    groups.update({g.last: g for g in depthwise_groups(graph)})
    groups.update({g.last: g for g in conv_groups(graph)})
    groups.update({g.last: g for g in pool_groups(graph)})
    index = {node: i for i, node in enumerate(graph.nodes)}
    return sorted(groups.values(), key=lambda g: index[g.last])


def build_contraction_kernels(graph: Graph, groups: Sequence[KernelGroup], options: Options,
                              decisions: Decisions) -> KernelBuild:
    """The fastest checked candidate per group, where one beats the ATen call."""
    result = KernelBuild()
    generate = options.generated_kernels and options.generated_gemm
    gemm_nodes = {g.last for g in gemms(graph)} if generate else set()
    depthwise_nodes = {g.last for g in depthwise_groups(graph)} if generate else set()
    conv_nodes = {g.last for g in conv_groups(graph)} if generate else set()
    pool_nodes = {g.last for g in pool_groups(graph)} if options.generated_kernels else set()
    checks = Checks(decisions)
    compiler = True
    planned: dict[KernelGroup, object] = {
        g: plan_gemm(graph, g, options) for g in groups if g.last in gemm_nodes}
    planned.update({g: plan_depthwise(graph, g, options) for g in groups
                    if g.last in depthwise_nodes})
    planned.update({g: plan_conv(graph, g, options) for g in groups if g.last in conv_nodes})
    planned.update({g: plan_pool(graph, g, options) for g in groups if g.last in pool_nodes})
    prebuild([p[0].build() for p in planned.values()  # type: ignore[index]
              if not isinstance(p, Skipped)], options)
    for group in groups:
        candidates: list[Built] = []
        reasons: list[Skipped] = []
        if len(group.nodes) > 1 and group.last in conv_nodes and compiler:
            # the convolution reading its input's NCHW source in place, where that beats
            # the copy and the convolution's ATen call; else the convolution alone, as usual
            built = conv_candidate(graph, group, options, checks, planned[group])  # type: ignore
            decided = fastest(graph, [built], decisions) if isinstance(built, Built) else built
            if isinstance(decided, Built):
                result.kernels.append(decided)
                continue
            group = alone(graph, group)
            planned[group] = plan_conv(graph, group, options)
        if len(group.nodes) > 1 and group.last not in gemm_nodes:
            group = alone(graph, group)  # (only the generated GEMM takes a residual's sum)
        generated = gemm_candidate if group.last in gemm_nodes else \
            depthwise_candidate if group.last in depthwise_nodes else \
            conv_candidate if group.last in conv_nodes else \
            pool_candidate if group.last in pool_nodes else None
        if compiler and generated is not None:
            built = generated(graph, group, options, checks, planned[group])  # type: ignore
            if isinstance(built, Skipped) and built.reason is SkipReason.NO_COMPILER:
                compiler = False  # (warned once, by codegen.build)
            (candidates if isinstance(built, Built) else reasons).append(built)
        if len(group.nodes) > 1 and not candidates:  # the library's, for the GEMM alone
            group = alone(graph, group)
        if options.prepacked_library and len(group.nodes) == 1:
            for built in library_candidates(graph, group, checks):
                if not (isinstance(built, Skipped) and built.reason is SkipReason.NO_RECIPE):
                    (candidates if isinstance(built, Built) else reasons).append(built)
        if not candidates:
            if reasons:
                result.skipped.append(Skipped(group, reasons[0].reason,
                                              "; ".join(str(r) for r in reasons)))
            continue
        decided = fastest(graph, candidates, decisions)
        if isinstance(decided, Skipped) and len(group.nodes) > 1 and options.prepacked_library:
            # the GEMM with its residual's sum lost to ATen's add + addmm: a library variant
            # may still beat ATen's call for the GEMM alone
            variants = [b for b in library_candidates(graph, alone(graph, group))
                        if isinstance(b, Built)]
            alternative = fastest(graph, variants, decisions) if variants else decided
            decided = alternative if isinstance(alternative, Built) else decided
        (result.kernels if isinstance(decided, Built) else result.skipped).append(decided)
    return result
