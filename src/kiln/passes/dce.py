"""Dead-code elimination: drop nodes no output depends on.

    before                                   after
    %a = relu(%x) : f32[4]                   %b = neg(%x) : f32[4]
    %b = neg(%x) : f32[4]                    return %b
    return %b
"""

from __future__ import annotations

from kiln.ir.graph import Graph, live_nodes
from kiln.ir.ops import Op
from kiln.options import Options


def eliminate_dead_code(graph: Graph, options: Options | None = None) -> Graph:
    live = live_nodes(graph)  # (with the calls run for their effect)
    kept = [n for n in graph.nodes if n in live]
    if len(kept) == len(graph.nodes):
        return graph
    used = {n.attrs.name for n in kept if n.op is Op.CONSTANT}  # type: ignore[attr-defined]
    return graph.replace(nodes=kept,
                         constants={k: v for k, v in graph.constants.items() if k in used})
