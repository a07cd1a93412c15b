"""Equality saturation as a strategy: saturate, extract two ways, let the hand-written rules
finish, keep the cheapest.

    outcome = optimize(graph, laws, model, SatLimits(), ilp_seconds=3.0, finish=greedy_passes)

Trust: if any e-node fails to type-check, a law fired where its types do not hold, and what
was derived from that term is outside every proof; the e-graph is then not used at all (the
outcome is ``graph``, ``chosen`` says why). Candidates must keep the outputs' types.

Steps: `kiln.search.saturate` builds the e-graph of ``graph`` under ``laws``; extraction
(`kiln.search.extract`) picks the cheapest well-typed graph by greedy tree cost and by ILP
(DAG cost, warm-started from greedy's choice); ``finish`` (the greedy rule passes) then runs
on each extracted graph, since the hand-written rules with Python guards, builders that
compute weights (batch-norm folding) and multi-root merges are not in the e-graph. The
cheapest of all of these and ``graph`` itself, by ``model``, is the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kiln.cost.graph import CostModel, GraphCost
from kiln.ir.graph import Graph
from kiln.ir.verify import verify
from kiln.rewrite.law import Law
from kiln.search.extract import extract_greedy, extract_ilp, rebuild, type_egraph
from kiln.search.saturate import SatLimits, saturate

__all__ = ["SaturationOutcome", "optimize"]


@dataclass(frozen=True)
class SaturationOutcome:
    graph: Graph
    cost_before: float
    cost_after: float
    chosen: str  # "input", or "<extraction>" / "<extraction>+finish"
    iterations: int
    stopped: str
    classes: int
    enodes: int
    rejected: int  # e-nodes left out for their type
    rules: int  # rewrites in the egglog program
    matched: dict[str, int] = field(default_factory=dict)  # rule -> matches
    costs: dict[str, float] = field(default_factory=dict)  # candidate -> estimated seconds
    seconds: float = 0.0


def optimize(graph: Graph, laws: Sequence[Law], model: CostModel,
             limits: SatLimits | None = None, ilp_seconds: float = 3.0,
             finish: Callable[[Graph], Graph] | None = None) -> SaturationOutcome:
    start = time.perf_counter()
    run = saturate(graph, laws, limits or SatLimits())
    typed = type_egraph(run, graph, model)
    cost = GraphCost(model)
    candidates: dict[str, Graph] = {"input": graph}
    # an ill-typed e-node means a law fired where its types do not hold; rewrites of such a
    # term are outside what the law's proof covers and may have merged classes that differ:
    # then nothing in this e-graph is trusted
    trusted = typed.rejected == 0
    greedy_choice = extract_greedy(typed, run.roots) if trusted else None
    if greedy_choice is not None:
        candidates["greedy"] = rebuild(greedy_choice, run, graph)
        ilp_choice = extract_ilp(typed, run.roots, ilp_seconds, greedy_choice)
        if ilp_choice is not None:
            candidates["ilp"] = rebuild(ilp_choice, run, graph)
    if finish is not None:
        for name in [n for n in candidates if n != "input"]:
            candidates[f"{name}+finish"] = finish(candidates[name])
    want = [v.type for v in graph.outputs]
    for name, g in list(candidates.items()):
        verify(g)  # a wrong extraction is a bug in kiln: fail loudly, before it runs
        if [v.type for v in g.outputs] != want:
            raise AssertionError(f"extraction {name} changed the output types")
    costs = {name: cost.seconds(g) for name, g in candidates.items()}
    chosen = min(costs, key=lambda n: (costs[n], n != "input"))
    if not trusted:
        chosen = "input (an ill-typed rewrite: e-graph not used)"
        candidates[chosen], costs[chosen] = graph, costs["input"]
    enodes = sum(len(c.nodes) for c in run.egraph.values())
    return SaturationOutcome(
        candidates[chosen], costs["input"], costs[chosen], chosen, run.iterations, run.stopped,
        len(run.egraph), enodes, typed.rejected, run.rules, run.matches, costs,
        time.perf_counter() - start)
