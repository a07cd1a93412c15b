"""Contractions (GEMMs and convolutions) run by whichever kernel is fastest on their shapes,
on this machine: the node's own ATen call, kiln's generated GEMM on weights packed at compile
time (`kiln.kernels.gemm`), kiln's generated depthwise or dense direct convolution on
channels-last data (`kiln.kernels.depthwise`, `kiln.kernels.conv`), or the library's kernel
on weights reordered once (`kiln.kernels.library`, oneDNN). Pools, the weightless window
reductions, compete the same way (`kiln.kernels.pool`), and so do attention calls (the
attention pass's, or the model's own ATen fused attention) against kiln's generated attention
(`kiln.kernels.attention`). Each candidate is checked
against the ATen call first; then all are timed together with it, interleaved
(`kiln.kernels.decide.fastest`), and the decision is kept on disk.

    addmm_act(b, x, Wt){gelu}  f32[128, 3072]:
        library 3.61 ms | kiln_gemm_128x3072x768 2.95 ms | onednn_linear_packed 3.02 ms
        -> kiln_gemm_128x3072x768
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kiln.codegen.kernel import prebuild
from kiln.ir.graph import Graph, Node
from kiln.kernels.attention import attention_candidate, attention_groups, plan_attention
from kiln.kernels.build import internal_error
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
    groups.update({g.last: g for g in attention_groups(graph)})
    index = {node: i for i, node in enumerate(graph.nodes)}
    return sorted(groups.values(), key=lambda g: index[g.last])


def build_contraction_kernels(graph: Graph, groups: Sequence[KernelGroup], options: Options,
                              decisions: Decisions) -> KernelBuild:
    """The fastest checked candidate per group, where one beats the ATen call. A bug in one
    group's planning, check or measurement costs that group's speed, not the model: it keeps
    its library call, with a warning (raised under ``Options.strict``)."""
    result = KernelBuild()
    generate = options.generated_kernels and options.generated_gemm
    stage = _Stage(graph, options, decisions, Checks(decisions),
                   gemm={g.last for g in gemms(graph)} if generate else set(),
                   depthwise={g.last for g in depthwise_groups(graph)} if generate else set(),
                   conv={g.last for g in conv_groups(graph)} if generate else set(),
                   pool={g.last for g in pool_groups(graph)} if options.generated_kernels
                   else set(),
                   attention={g.last for g in attention_groups(graph)}
                   if options.generated_kernels else set())
    for group in groups:
        stage.plan(group)
    prebuild([p[0].build() for p in stage.planned.values()  # type: ignore[index]
              if not isinstance(p, Skipped)], options)
    for group in groups:
        try:
            decided = stage.decide(group)
        except Exception as err:  # noqa: BLE001 - see the docstring
            decided = internal_error(group, err, options)
        if decided is not None:
            (result.kernels if isinstance(decided, Built) else result.skipped).append(decided)
    return result


@dataclass
class _Stage:
    """What the decisions of one graph's contraction groups share: the nodes each generated
    kernel takes, the plans, the checks, and whether a C compiler answered."""

    graph: Graph
    options: Options
    decisions: Decisions
    checks: Checks
    gemm: set[Node]
    depthwise: set[Node]
    conv: set[Node]
    pool: set[Node]
    attention: set[Node]
    planned: dict[KernelGroup, object] = field(default_factory=dict)
    compiler: bool = True

    def plan(self, group: KernelGroup) -> None:
        """The group's generated plan, if a generated kernel takes it."""
        for nodes, make in ((self.gemm, plan_gemm), (self.depthwise, plan_depthwise),
                            (self.conv, plan_conv), (self.pool, plan_pool),
                            (self.attention, plan_attention)):
            if group.last in nodes:
                try:
                    self.planned[group] = make(self.graph, group, self.options)
                except Exception as err:  # noqa: BLE001 - see build_contraction_kernels
                    self.planned[group] = internal_error(group, err, self.options)
                return

    def decide(self, group: KernelGroup) -> Built | Skipped | None:
        """The group's fastest checked candidate, or why it keeps its library call (None:
        no candidate and no reason)."""
        graph, options, decisions, checks = self.graph, self.options, self.decisions, self.checks
        candidates: list[Built] = []
        reasons: list[Skipped] = []
        window = conv_candidate if group.last in self.conv else \
            depthwise_candidate if group.last in self.depthwise else None
        if len(group.nodes) > 1 and window is not None and self.compiler:
            # the convolution reading its input's NCHW source in place (or its zero pad's
            # input, the pad's taps skipped), where that beats the copy (the pad) and the
            # convolution's ATen call; else the convolution alone, as usual
            built = window(graph, group, options, checks, self.planned[group])  # type: ignore
            decided = fastest(graph, [built], decisions) if isinstance(built, Built) else built
            if isinstance(decided, Built):
                return decided
            group = alone(graph, group)
            self.plan(group)
        if len(group.nodes) > 1 and group.last not in self.gemm | self.attention:
            group = alone(graph, group)  # (only the generated GEMM takes a residual's sum)
        generated = gemm_candidate if group.last in self.gemm else \
            depthwise_candidate if group.last in self.depthwise else \
            conv_candidate if group.last in self.conv else \
            pool_candidate if group.last in self.pool else \
            attention_candidate if group.last in self.attention else None
        if self.compiler and generated is not None:
            built = generated(graph, group, options, checks, self.planned[group])  # type: ignore
            if isinstance(built, Skipped) and built.reason is SkipReason.NO_COMPILER:
                self.compiler = False  # (warned once, by codegen.build)
            (candidates if isinstance(built, Built) else reasons).append(built)
        if len(group.nodes) > 1 and not candidates and group.last in self.gemm:
            # the library's, for the GEMM alone
            group = alone(graph, group)
        if options.prepacked_library and len(group.nodes) == 1:
            for built in library_candidates(graph, group, checks):
                if not (isinstance(built, Skipped) and built.reason is SkipReason.NO_RECIPE):
                    (candidates if isinstance(built, Built) else reasons).append(built)
        if not candidates:  # (the first reason's kind, then every reason: that one's detail)
            details = [reasons[0].detail, *map(str, reasons[1:])] if reasons else []
            return Skipped(group, reasons[0].reason, "; ".join(d for d in details if d)) \
                if reasons else None
        decided = fastest(graph, candidates, decisions)
        if isinstance(decided, Skipped) and len(group.nodes) > 1 and options.prepacked_library:
            # the GEMM with its residual's sum lost to ATen's add + addmm: a library variant
            # may still beat ATen's call for the GEMM alone
            variants = [b for b in library_candidates(graph, alone(graph, group), checks)
                        if isinstance(b, Built)]
            alternative = fastest(graph, variants, decisions) if variants else decided
            decided = alternative if isinstance(alternative, Built) else decided
        return decided
