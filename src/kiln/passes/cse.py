"""Common-subexpression elimination: one node per (op, operands, attributes).

    before                                   after
    %a = exp(%x) : f32[4]                    %a = exp(%x) : f32[4]
    %b = exp(%x) : f32[4]                    %c = add(%a, %a) : f32[4]
    %c = add(%a, %b) : f32[4]

Attributes compare by value and kind of number (1 vs 1.0, 0.0 vs -0.0 stay apart). Calls of
random or mutating ATen ops are never merged.
"""

from __future__ import annotations

from kiln.ir import calls
from kiln.ir.graph import Graph, Node, Value, transform
from kiln.options import Options


def eliminate_common_subexpressions(graph: Graph, options: Options | None = None) -> Graph:
    seen: dict[tuple[object, ...], Node] = {}

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> Node | None:
        rebuilt = node if inputs == node.inputs else Node(node.op, inputs, node.attrs,
                                                          node.types, node.name)
        if not calls.is_pure(node):
            return rebuilt
        return seen.setdefault(rebuilt.key(), rebuilt)

    return transform(graph, rewrite)
