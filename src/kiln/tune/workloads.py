"""The kernels of a model that the tuner can search: one design space per distinct workload.

    for w in model_workloads(model, inputs, options):
        print(w.label, len(w.nodes))          # "gemm 128x3072x768 +bias gelu, B packed", ...

The graph is the one `kiln.compile` would build kernels for (captured, then the pass
pipeline at ``options.opt_level``), so a tuned record's workload is exactly the one the
compile looks up. Today the GEMMs have a design space (`kiln.tune.space.GemmSpace`); row and
elementwise kernels keep their heuristic schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.ir.graph import Graph
from kiln.kernels.gemm import gemm_space
from kiln.kernels.outcome import Skipped
from kiln.options import Options
from kiln.passes.partition import gemms
from kiln.passes.pipeline import run_pipeline
from kiln.tune.space import GemmSpace

__all__ = ["KernelWorkload", "graph_workloads", "model_workloads"]


@dataclass(frozen=True)
class KernelWorkload:
    space: GemmSpace
    nodes: tuple[str, ...]  # the graph nodes that run this kernel

    @property
    def label(self) -> str:
        s = self.space
        extras = [x for x in ("+bias" if s.bias else "",
                              s.epilogue.activation.text if s.epilogue else "",
                              "B packed" if s.b_prepacked else "") if x]
        return f"{s.kind} {s.m}x{s.n}x{s.k}" + (f" {', '.join(extras)}" if extras else "")


def graph_workloads(graph: Graph, options: Options) -> list[KernelWorkload]:
    """The tunable kernels of an optimized graph, most frequent first."""
    found: dict[GemmSpace, list[str]] = {}
    for group in gemms(graph):
        space = gemm_space(graph, group, options)
        if not isinstance(space, Skipped):
            found.setdefault(space, []).append(group.last.name)
    workloads = [KernelWorkload(space, tuple(nodes)) for space, nodes in found.items()]
    return sorted(workloads, key=lambda w: (-len(w.nodes), w.label))


def model_workloads(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                    options: Options) -> list[KernelWorkload]:
    from kiln.frontend.export import _freeze
    from kiln.frontend.importer import import_fx

    with torch.no_grad():
        program = torch.export.export(model, inputs).run_decompositions()
    frozen, _ = _freeze(program)
    graph = import_fx(program.graph_module, frozen).graph
    optimized, _, _ = run_pipeline(graph, options)
    return graph_workloads(optimized, options)
