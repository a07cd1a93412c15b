"""A rule table as a pipeline pass: runs the fixpoint driver and keeps its statistics."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kiln.ir.graph import Graph
from kiln.options import Options
from kiln.rewrite.engine import RewriteResult, apply_rules
from kiln.rewrite.rule import Rule


@dataclass(frozen=True)
class RulePass:
    name: str
    rules: tuple[Rule, ...]
    min_level: int = 1
    why: str = ""
    # a cost-based search (kiln.passes.search) takes this pass's rules; False for a pass that
    # cleans up after later non-rule passes, which must still run where it stands
    searched: bool = True

    def __call__(self, graph: Graph, options: Options) -> Graph:
        return self.rewrite(graph, options).graph

    def rewrite(self, graph: Graph, options: Options, trace: Iterable[str] = ()) -> RewriteResult:
        return apply_rules(graph, self.rules, options, trace)
