"""The pass pipeline: a table of contents of what kiln does to a graph, in order."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from kiln.ir.graph import Graph
from kiln.ir.verify import verify
from kiln.options import Options
from kiln.passes.base import Pass
from kiln.passes.cse import eliminate_common_subexpressions
from kiln.passes.dce import eliminate_dead_code
from kiln.passes.fold import fold_constants

PIPELINE: tuple[Pass, ...] = (
    Pass("dce", eliminate_dead_code, 0, "drop what capture left unused before spending time on it"),
    Pass("cse", eliminate_common_subexpressions, 0, "merge duplicates so folding sees each once"),
    Pass("fold", fold_constants, 0, "precompute weight-only subgraphs (e.g. weight transposes)"),
    Pass("dce.final", eliminate_dead_code, 0, "drop the sources folding left behind"),
)


@dataclass(frozen=True)
class PassRecord:
    """One pass's run; node counts leave out weights and numbers (Graph.num_ops)."""

    name: str
    nodes_before: int
    nodes_after: int
    seconds: float


def run_pipeline(graph: Graph, options: Options, passes: Sequence[Pass] = PIPELINE,
                 keep_snapshots: bool = False) -> tuple[Graph, list[PassRecord], list[Graph]]:
    """Run every pass enabled at ``options.opt_level``; verify after each when debugging."""
    records: list[PassRecord] = []
    snapshots: list[Graph] = []
    for p in passes:
        if options.opt_level < p.min_level:
            continue
        start = time.perf_counter()
        before = graph.num_ops()
        graph = p(graph, options)
        records.append(PassRecord(p.name, before, graph.num_ops(), time.perf_counter() - start))
        if options.debug:
            verify(graph)
        if keep_snapshots:
            snapshots.append(graph)
    return graph, records, snapshots
