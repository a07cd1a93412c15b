"""The kernels of a model that the tuner can search: one design space per distinct workload.

    for w in model_workloads(model, inputs, options):
        print(w.label, len(w.nodes))          # "gemm 128x3072x768 +bias gelu, B packed", ...

The graph is the one `kiln.compile` would build kernels for (captured, then the pass
pipeline at ``options.opt_level``), so a tuned record's workload is exactly the one the
compile looks up: the fused row and elementwise kernels of the partitioner
(`kiln.tune.space_groups.GroupSpace`), then the GEMMs of the nodes left
(`kiln.tune.space.GemmSpace`), the direct convolutions and pools
(`kiln.tune.space_window.WindowSpace`) and the attention calls
(`kiln.tune.space_attention.AttentionSpace`), as `kiln.engine.KERNEL_STAGES` takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kiln.ir.graph import Graph, Node
from kiln.kernels.attention import attention_groups, attention_space
from kiln.kernels.attention_decode import decodes
from kiln.kernels.conv import conv_groups, group_space
from kiln.kernels.depthwise import depthwise_groups, depthwise_space
from kiln.kernels.gemm import gemm_space
from kiln.kernels.outcome import Skipped, SkipReason
from kiln.kernels.pool import pool_groups, pool_space
from kiln.kernels.pool_schedule import PoolShape
from kiln.options import Options
from kiln.passes.partition import KernelGroup, gemms, partition
from kiln.passes.pipeline import run_pipeline
from kiln.tune.space import GemmSpace, Space
from kiln.tune.space_attention import AttentionSpace
from kiln.tune.space_groups import GroupSpace
from kiln.tune.space_window import WindowSpace

__all__ = ["KernelWorkload", "graph_workloads", "model_workloads"]


@dataclass(frozen=True)
class KernelWorkload:
    space: Space
    nodes: tuple[str, ...]  # the graph nodes whose kernels are this workload (last nodes)

    @property
    def label(self) -> str:
        s = self.space
        if isinstance(s, GemmSpace):
            bias = "+residual+bias" if s.bias_row else "+residual" if s.bias_matrix else \
                "+bias" if s.bias else ""
            extras = [x for x in (bias,
                                  s.epilogue.activation.text if s.epilogue else "",
                                  "B packed" if s.b_prepacked else "") if x]
            if s.batch:  # (a bmm: the batch, and whether it reads views)
                extras.append("strided" if s.strided_operands else "")
                extras = [x for x in extras if x]
                return f"bmm {s.batch}x{s.m}x{s.n}x{s.k}" + (f" {', '.join(extras)}"
                                                              if extras else "")
            return f"gemm {s.m}x{s.n}x{s.k}" + (f" {', '.join(extras)}" if extras else "")
        if isinstance(s, AttentionSpace):
            sh = s.shape
            mask = " +mask" if sh.mask is not None else ""
            return (f"attention {sh.batch * sh.heads}x{sh.queries}x{sh.keys}x{sh.depth}"
                    f"{mask}")
        if isinstance(s, WindowSpace):
            sh = s.shape
            (kh, kw), sy = sh.kernel, sh.stride[0]
            what = f"{sh.kind}pool" if isinstance(sh, PoolShape) else s.kind
            sizes = f"{sh.ci}x{sh.h}x{sh.w}->{sh.co}" if s.kind == "conv" else \
                f"{sh.c}x{sh.h}x{sh.w}"
            act = f" {s.epilogue.activation.text}" if s.epilogue else ""
            residual = " +residual" if getattr(sh, "residual", False) else ""
            return f"{what} {sizes} k{kh}x{kw} s{sy}{residual}{act}"
        assert isinstance(s, GroupSpace)
        ops = " ".join(n.op.text for n in s.group.nodes)
        shape = "x".join(map(str, s.group.last.out().type.shape))
        return f"{s.kind} {ops} {shape}"


def graph_workloads(graph: Graph, options: Options) -> list[KernelWorkload]:
    """The tunable kernels of an optimized graph, most frequent first."""
    found: dict[str, tuple[Space, list[str]]] = {}
    taken: set[Node] = set()
    for group in partition(graph):
        space = GroupSpace.of(graph, group)
        try:
            space.planned(space.default(), record=False)[0].build()
        except Exception:  # noqa: BLE001 - no kernel for this group: nothing to tune
            continue
        taken.update(group.nodes)
        found.setdefault(space.workload(), (space, []))[1].append(group.last.name)
    for group in gemms(graph):
        gemm = gemm_space(graph, group, options)
        if group.last not in taken and not isinstance(gemm, Skipped):
            found.setdefault(gemm.workload(), (gemm, []))[1].append(group.last.name)
    window_spaces: tuple[tuple[Callable, Callable[[KernelGroup], Space | Skipped]], ...] = (
        (depthwise_groups, lambda g: depthwise_space(g.last, options)),
        (conv_groups, lambda g: group_space(graph, g, options)),
        (pool_groups, lambda g: pool_space(g.last, options)),
        (attention_groups, lambda g: _tunable_attention(graph, g, options)))
    for groups, space_of in window_spaces:
        for group in groups(graph):
            if group.last not in taken:
                window = space_of(group)
                if isinstance(window, Skipped):  # (no kernel for it on this target)
                    continue
                found.setdefault(window.workload(), (window, []))[1].append(group.last.name)
    workloads = [KernelWorkload(space, tuple(nodes)) for space, nodes in found.values()]
    return sorted(workloads, key=lambda w: (-len(w.nodes), w.label))


def _tunable_attention(graph: Graph, group: KernelGroup, options: Options) -> Space | Skipped:
    """The attention group's space, or Skipped where the call runs the few-queries kernel
    (`kiln.kernels.attention_decode`: a decode step's), which has none."""
    space = attention_space(graph, group, options)
    if not isinstance(space, Skipped) and decodes(space.shape):
        return Skipped(group, SkipReason.NOT_LOWERABLE, "a few queries: the decode kernel, "
                       "which has no tuning space")
    return space


def model_workloads(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                    options: Options) -> list[KernelWorkload]:
    from kiln.frontend.export import import_model

    graph = import_model(model, inputs).graph
    optimized, _, _ = run_pipeline(graph, options)
    return graph_workloads(optimized, options)
