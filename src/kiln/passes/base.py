"""What a pass is: a named function from Graph to Graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.ir.graph import Graph
from kiln.options import Options


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph, Options], Graph]
    min_level: int = 0  # runs when Options.opt_level >= min_level
    why: str = ""  # one line: why it stands where it does in the pipeline

    def __call__(self, graph: Graph, options: Options) -> Graph:
        return self.run(graph, options)
