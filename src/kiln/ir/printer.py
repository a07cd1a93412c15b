"""IR text: one line per node, readable and parsed back by `kiln.ir.parser`.

    graph(%x: f32[8, 16]) {
      %w = constant {name='fc.weight'} : f32[4, 16]
      %t = permute(%w) {dims=(1, 0)} : f32[16, 4]
      %y = mm(%x, %t) : f32[8, 4]
      %ln = layer_norm(%y, %g, %b) {normalized_shape=(4,), eps=1e-05}
          : (f32[8, 4], f32[8, 1], f32[8, 1])     (one line in the real text)
      return %y, %ln#1
    }

A node with several outputs is named once; ``%ln#1`` is its second output.
"""

from __future__ import annotations

import dataclasses

from kiln.ir.attrs import NoAttrs
from kiln.ir.graph import Graph, Node, Value, unique_names
from kiln.ir.literal import format_literal


def print_graph(graph: Graph) -> str:
    names = unique_names(graph.all_nodes())
    params = ", ".join(f"%{names[n]}: {n.type}" for n in graph.inputs)
    device = "" if graph.device.type == "cpu" else f" on {graph.device}"
    lines = [f"graph({params}){device} {{"]
    lines += [f"  {format_node(node, names)}" for node in graph.nodes]
    lines.append("  return " + ", ".join(_ref(v, names) for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def format_node(node: Node, names: dict[Node, str]) -> str:
    operands = ", ".join(_ref(v, names) for v in node.inputs)
    text = f"%{names.get(node, node.name)} = {node.op.text}"
    if node.inputs:
        text += f"({operands})"
    attrs = format_attrs(node)
    if attrs:
        text += f" {{{attrs}}}"
    types = ", ".join(str(t) for t in node.types)
    return text + f" : {types if len(node.types) == 1 else f'({types})'}"


def format_attrs(node: Node) -> str:
    if isinstance(node.attrs, NoAttrs):
        return ""
    return ", ".join(f"{f.name}={format_literal(getattr(node.attrs, f.name))}"
                     for f in dataclasses.fields(node.attrs))  # type: ignore[arg-type]


def _ref(value: Value, names: dict[Node, str]) -> str:
    name = names.get(value.node, value.node.name)
    return f"%{name}#{value.index}" if len(value.node.types) > 1 else f"%{name}"
