"""A graph's cost: the sum of its nodes' costs under a cost model, over the nodes that run
at call time (nodes that depend on weights only are folded at compile time).

    GraphCost(AnalyticCost(roof)).seconds(graph)

Memoized per node: the graphs a search compares share most of their (immutable) nodes, so
each node is costed and classified once.
"""

from __future__ import annotations

from typing import Protocol

from kiln.ir.graph import Graph, Node
from kiln.ir.ops import Op, OpGroup

__all__ = ["CostModel", "GraphCost"]

_SOURCES = frozenset({Op.INPUT, Op.CONSTANT, Op.SCALAR})


class CostModel(Protocol):
    name: str

    def node_seconds(self, node: Node) -> float: ...


class GraphCost:
    def __init__(self, model: CostModel) -> None:
        self.model = model
        self._cost: dict[Node, float] = {}
        self._weight: dict[Node, bool] = {}

    def seconds(self, graph: Graph) -> float:
        total = 0.0
        for node in graph.nodes:
            if node.op in _SOURCES or self.weight_only(node):
                continue
            found = self._cost.get(node)
            if found is None:
                found = self._cost[node] = self.model.node_seconds(node)
            total += found
        return total

    def weight_only(self, node: Node) -> bool:
        """Depends on weights and numbers only (as `MatchContext.is_weight_only` decides)."""
        known = self._weight.get(node)
        if known is None:
            if node.op in (Op.CONSTANT, Op.SCALAR):
                known = True
            elif node.op is Op.INPUT or node.op.is_a(OpGroup.OPAQUE) or not node.inputs:
                known = node.op.is_a(OpGroup.CREATION)
            else:
                known = all(self.weight_only(v.node) for v in node.inputs)
            self._weight[node] = known
        return known
