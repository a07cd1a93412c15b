"""Dead-code elimination: drop nodes no output depends on.

    before                                   after
    %a = relu(%x) : f32[4]                   %b = neg(%x) : f32[4]
    %b = neg(%x) : f32[4]                    return %b
    return %b
"""

from __future__ import annotations

from kiln.ir.graph import Graph, Node, live_nodes
from kiln.ir.ops import Op
from kiln.options import Options


def has_side_effects(node: Node) -> bool:
    """An opaque call of a mutating ATen op must run even if nothing reads its result."""
    if node.op is not Op.CALL:
        return False
    schema = node.attrs.target._schema  # type: ignore[attr-defined]
    return bool(schema.is_mutable)


def eliminate_dead_code(graph: Graph, options: Options | None = None) -> Graph:
    live = live_nodes(graph)
    roots = [n for n in graph.nodes if n not in live and has_side_effects(n)]
    if roots:
        stack = list(roots)
        while stack:
            node = stack.pop()
            if node not in live:
                live.add(node)
                stack.extend(v.node for v in node.inputs)
    kept = [n for n in graph.nodes if n in live]
    if len(kept) == len(graph.nodes):
        return graph
    used = {n.attrs.name for n in kept if n.op is Op.CONSTANT}  # type: ignore[attr-defined]
    return graph.replace(nodes=kept,
                         constants={k: v for k, v in graph.constants.items() if k in used})
