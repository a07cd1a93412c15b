"""The engine both frontends share: optimize a captured graph and make it runnable."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir.graph import Graph
from kiln.ir.verify import verify
from kiln.options import Options
from kiln.passes.pipeline import run_pipeline
from kiln.report import GraphReport
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import MemoryPlan, plan_memory


@dataclass
class CompiledGraph:
    """A graph ready to run: call it with the boxed argument list, get the outputs."""

    graph: Graph  # after optimization
    captured: Graph  # as imported
    plan: MemoryPlan | None
    source: str  # the generated executor
    report: GraphReport
    run: Any  # (args: list) -> list

    def __call__(self, args: list[Any]) -> list[Any]:
        return self.run(args)


def compile_graph(graph: Graph, options: Options, input_positions: Sequence[int],
                  opaque_ops: Sequence[str] = (), started: float | None = None) -> CompiledGraph:
    start = time.perf_counter() if started is None else started
    if options.debug:
        verify(graph)
    optimized, records, _ = run_pipeline(graph, options)
    plan = plan_memory(optimized) if options.memory_plan else None
    run, source = build_executor(optimized, plan, input_positions)
    report = GraphReport(
        nodes_before=graph.num_ops(), nodes_after=optimized.num_ops(), passes=tuple(records),
        ops=optimized.op_counts(), opaque_ops=tuple(opaque_ops),
        planned_peak_bytes=plan.arena_bytes if plan else 0,
        intermediate_bytes=plan.intermediate_bytes if plan else 0,
        planned_bytes=plan.planned_bytes if plan else 0,
        compile_seconds=time.perf_counter() - start,
        planned_peak_bytes_before=plan_memory(graph).arena_bytes if plan else 0)
    return CompiledGraph(optimized, graph, plan, source, report, run)
