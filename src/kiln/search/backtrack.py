"""Backtracking search over rewrites, as TASO does it (Jia et al., SOSP'19, Algorithm 2).

    outcome = backtrack(graph, rules, options, AnalyticCost(roof), Limits(alpha=1.05))
    outcome.graph, outcome.cost_before, outcome.cost_after, outcome.path

A priority queue holds graphs by estimated cost, cheapest first. Each step takes the cheapest,
applies every rule at every place it matches (one rewrite per new graph,
`kiln.rewrite.engine.single_rewrites`), and queues each new graph whose cost is below
``alpha`` times the best cost so far. With ``alpha > 1`` a graph may get a little worse for
a while, which is how the search leaves a local minimum that a greedy pass cannot (TASO
uses 1.05). Graphs already seen are skipped, by a structural key that ignores node names.
The search stops when the queue is empty, after ``expansions`` steps, or after ``seconds``.

Seeds (e.g. the greedy pipeline's result) enter the queue next to the input graph, so the
search never returns a graph its cost model ranks below them.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kiln.cost.graph import CostModel, GraphCost
from kiln.ir.graph import Graph, Node
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.rewrite.engine import Move, rules_by_root, single_rewrites
from kiln.rewrite.rule import Rule

__all__ = ["GraphKeys", "Limits", "Outcome", "Step", "backtrack", "graph_key"]


class GraphKeys:
    """Structural keys of graphs, memoized per (immutable, shared) node."""

    def __init__(self) -> None:
        self._key: dict[Node, int] = {}

    def key(self, graph: Graph) -> int:
        """Equal for graphs that compute the same ops on the same operands, whatever the node
        names and order: a hash over each node's op, attributes, types and operands' keys."""
        for i, node in enumerate(graph.inputs):
            if node not in self._key:
                self._key[node] = hash(("input", i, node.types))
        for node in graph.nodes:
            if node in self._key:
                continue
            if node.op is Op.CONSTANT:
                self._key[node] = hash(("constant", node.attrs, node.types))
            else:
                operands = tuple((self._key[v.node], v.index) for v in node.inputs)
                self._key[node] = hash((node.op, node.attrs, node.types, operands))
        return hash(tuple((self._key[v.node], v.index) for v in graph.outputs))


@dataclass(frozen=True)
class Limits:
    alpha: float = 1.05  # queue graphs costing less than alpha x the best so far
    expansions: int = 400  # graphs whose rewrites are generated
    seconds: float = 7.0  # wall-clock budget (with the greedy seed and measuring: <= 10 s)
    queue: int = 2000  # most graphs waiting; the costliest are dropped beyond it


Step = tuple[str, str]  # (rule, node name) of one rewrite


@dataclass(frozen=True)
class Outcome:
    graph: Graph
    cost_before: float
    cost_after: float
    path: tuple[Step, ...]  # the rewrites from the input (or the seed named first) to graph
    seed: str  # "input" or the name of the seed the path starts from
    explored: int  # distinct graphs costed
    expanded: int
    seconds: float
    stopped: str  # "exhausted", "expansions" or "time"


def backtrack(graph: Graph, rules: Sequence[Rule], options: Options, model: CostModel,
              limits: Limits = Limits(), seeds: Sequence[tuple[str, Graph]] = (),
              moves: Callable[[Graph], Iterable[Move]] | None = None) -> Outcome:
    """``moves``: more neighbours of a graph besides the rules' (e.g. `kiln.pet.moves`)."""
    start = time.perf_counter()
    by_root = rules_by_root(rules, options)
    scorer, keys = GraphCost(model), GraphKeys()
    order = itertools.count()
    queue: list[tuple[float, int, Graph, tuple[Step, ...], str]] = []
    seen: set[int] = set()
    never: set[tuple[str, Node]] = set()  # (rule, node) pairs that cannot match, ever
    cost_before = scorer.seconds(graph)
    best = (cost_before, graph, (), "input")
    for name, g in [("input", graph), *seeds]:
        key = keys.key(g)
        if key in seen:
            continue
        seen.add(key)
        cost = scorer.seconds(g)
        heapq.heappush(queue, (cost, next(order), g, (), name))
        if cost < best[0]:
            best = (cost, g, (), name)
    explored, expanded, stopped = len(seen), 0, "exhausted"
    while queue:
        if expanded >= limits.expansions:
            stopped = "expansions"
            break
        if time.perf_counter() - start > limits.seconds:
            stopped = "time"
            break
        _, _, current, path, seed = heapq.heappop(queue)
        expanded += 1
        extra = moves(current) if moves is not None else ()
        for move in itertools.chain(single_rewrites(current, by_root, never), extra):
            key = keys.key(move.graph)
            if key in seen:
                continue
            seen.add(key)
            explored += 1
            cost = scorer.seconds(move.graph)
            steps = (*path, (move.rule, move.node))
            if cost < best[0]:
                best = (cost, move.graph, steps, seed)
            if cost < limits.alpha * best[0]:
                heapq.heappush(queue, (cost, next(order), move.graph, steps, seed))
            if time.perf_counter() - start > limits.seconds:
                break
        if len(queue) > limits.queue:
            queue = heapq.nsmallest(limits.queue, queue)
    cost, chosen, steps, seed = best
    return Outcome(chosen, cost_before, cost, steps, seed, explored, expanded,
                   time.perf_counter() - start, stopped)


def graph_key(graph: Graph) -> int:
    return GraphKeys().key(graph)
