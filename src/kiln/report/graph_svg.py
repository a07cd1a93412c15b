"""A kiln graph as an SVG picture: DOT text laid out by Graphviz's ``dot``, inlined in the page.

Every computing node is one SVG group ``<g id="{prefix}-n{i}" class="node op {kind}">``
(``i``: its index in ``graph.nodes``), so the page's script and the tests find them by class.
Weights and numbers are not drawn (they show among a node's operands); graph inputs and the
output are drawn as ``input``/``output`` nodes. Nodes are coloured by what runs them after
optimization (a generated kernel, a library kernel on prepacked weights, a library call, a
view that computes nothing) and by op family before it; the nodes of one fused kernel are
boxed together (a DOT cluster, ``class="cluster kernel"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.ir.graph import Graph, Node, Value, unique_names
from kiln.ir.ops import Op, OpGroup
from kiln.ir.printer import format_attrs
from kiln.report.compile_report import KernelInfo
from kiln.report.details import NOT_RUN

MAX_DRAWN_NODES = 3000  # beyond this, dot takes minutes and nobody reads the picture

# fill colours, by kernel kind (after) or op family (before); the legend reads this table
KIND_COLOURS: dict[str, tuple[str, str]] = {
    "generated": ("#f59e42", "generated kernel (kiln's C)"),
    "prepacked": ("#b48ee8", "library kernel on prepacked weights"),
    "library": ("#8ec5f5", "library call (ATen)"),
    "view": ("#e4e4e4", "view (no computation)"),
    "contraction": ("#8ec5f5", "matmul / convolution"),
    "elementwise": ("#a8dba8", "elementwise"),
    "reduction": ("#f7d774", "reduction / normalization / pooling"),
    "movement": ("#e4e4e4", "view / movement"),
    "opaque": ("#f28b82", "ATen op kiln does not model"),
    "other": ("#ffffff", "other"),
}
AFTER_KINDS = ("generated", "prepacked", "library", "view")
BEFORE_KINDS = ("contraction", "elementwise", "reduction", "movement", "opaque", "other")


class GraphvizMissing(RuntimeError):
    """The picture needs Graphviz: the ``graphviz`` Python package and the ``dot`` program."""


@dataclass(frozen=True)
class DrawnGraph:
    svg: str  # the <svg> element, without XML prolog
    nodes: dict[str, dict[str, str]]  # SVG id -> what the details panel shows
    drawn_ops: int  # computing nodes drawn (== graph.num_ops())
    clusters: int  # fused kernels boxed


def node_kind(node: Node, step: int, kernels: Sequence[KernelInfo] | None) -> str:
    """The colour class of a node: its kernel's kind after optimization (``kernels`` given),
    its op family before."""
    if kernels is not None and step != NOT_RUN:
        kind = kernels[step].kind
        if kind == "library" and node.op.is_a(OpGroup.VIEW):
            return "view"
        return kind if kind in KIND_COLOURS else "library"
    op = node.op
    for group, kind in ((OpGroup.OPAQUE, "opaque"), (OpGroup.CONTRACTION, "contraction"),
                        (OpGroup.MOVEMENT, "movement"), (OpGroup.ELEMENTWISE, "elementwise")):
        if op.is_a(group):
            return kind
    if op.is_a(OpGroup.REDUCTION | OpGroup.NORMALIZATION | OpGroup.POOLING):
        return "reduction"
    return "other"


def draw_graph(graph: Graph, prefix: str, step_of_node: Sequence[int] | None = None,
               kernels: Sequence[KernelInfo] | None = None) -> DrawnGraph:
    """The SVG of ``graph``; with ``step_of_node`` and ``kernels`` (after optimization), nodes
    are coloured by kernel and fused kernels boxed. Raises GraphvizMissing without Graphviz."""
    try:
        import graphviz
    except ImportError as err:
        raise GraphvizMissing("drawing graphs needs the graphviz Python package "
                              "(pip install 'kiln[report]') and Graphviz's dot program") from err
    if graph.num_ops() > MAX_DRAWN_NODES:
        raise ValueError(f"{graph.num_ops()} nodes is too many to draw "
                         f"(at most {MAX_DRAWN_NODES})")
    steps = step_of_node if step_of_node is not None else [NOT_RUN] * len(graph.nodes)
    dot, nodes, clusters = _dot(graph, prefix, steps, kernels, graphviz)
    try:
        svg = dot.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound as err:
        raise GraphvizMissing("drawing graphs needs Graphviz's dot program on PATH "
                              "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install "
                              "graphviz); the rest of the report does not") from err
    svg = svg[svg.index("<svg"):]
    drawn = sum(1 for key in nodes if key.startswith(f"{prefix}-n"))
    return DrawnGraph(svg, nodes, drawn, clusters)


def _dot(graph: Graph, prefix: str, steps: Sequence[int], kernels: Sequence[KernelInfo] | None,
         graphviz: object) -> tuple[object, dict[str, dict[str, str]], int]:
    names = unique_names(graph.all_nodes())
    dot = graphviz.Digraph(name=prefix)  # type: ignore[attr-defined]
    dot.attr("graph", rankdir="TB", nodesep="0.25", ranksep="0.35", bgcolor="transparent",
             fontname="Helvetica")
    dot.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10",
             height="0.3", margin="0.08,0.03", color="#555555", penwidth="0.8")
    dot.attr("edge", color="#888888", arrowsize="0.5", penwidth="0.8")
    ids: dict[Node, str] = {}
    details: dict[str, dict[str, str]] = {}
    for i, node in enumerate(graph.inputs):
        ids[node] = f"{prefix}-in{i}"
        dot.node(ids[node], f"{names[node]}\n{_types(node)}", id=ids[node], shape="oval",
                 fillcolor="#ffffff", tooltip=f"graph input {names[node]}: {_types(node)}",
                 **{"class": "input"})
        details[ids[node]] = {"title": f"input {names[node]}", "types": _types(node)}
    by_step: dict[int, list[Node]] = {}
    for i, node in enumerate(graph.nodes):
        if node.op in (Op.CONSTANT, Op.SCALAR):
            continue
        ids[node] = f"{prefix}-n{i}"
        if steps[i] != NOT_RUN:
            by_step.setdefault(steps[i], []).append(node)
    clusters = 0
    position = {node: i for i, node in enumerate(graph.nodes)}
    for i, node in enumerate(graph.nodes):
        if node not in ids:
            continue
        step = steps[i]
        group = by_step.get(step, [node])
        boxed = kernels is not None and len(group) > 1
        if boxed and node is not group[0]:
            continue  # drawn with its kernel's first node
        target = dot
        if boxed:
            kind = kernels[step].kind  # type: ignore[index]
            target = graphviz.Digraph(name=f"cluster_{prefix}_k{step}")  # type: ignore
            target.attr(label=f"kernel {step}: {kind}", style="rounded,dashed",
                        color="#d9822b" if kind == "generated" else "#7d5bbf", fontsize="9",
                        fontcolor="#555555", id=f"{prefix}-k{step}", **{"class": "kernel"})
            clusters += 1
        for member in group if boxed else [node]:
            _add_node(target, member, graph, names, ids, details, steps[position[member]],
                      kernels)
        if boxed:
            dot.subgraph(target)
    out_id = f"{prefix}-out"
    dot.node(out_id, "output", id=out_id, shape="oval", fillcolor="#ffffff",
             **{"class": "output"})
    details[out_id] = {"title": "graph outputs",
                       "types": ", ".join(_ref(v, names) for v in graph.outputs)}
    edges: set[tuple[str, str]] = set()
    for node in graph.nodes:
        if node in ids:
            for v in node.inputs:
                if v.node in ids and (ids[v.node], ids[node]) not in edges:
                    edges.add((ids[v.node], ids[node]))
                    dot.edge(ids[v.node], ids[node])
    for v in graph.outputs:
        if v.node in ids and (ids[v.node], out_id) not in edges:
            edges.add((ids[v.node], out_id))
            dot.edge(ids[v.node], out_id)
    return dot, details, clusters


def _add_node(target: object, node: Node, graph: Graph, names: dict[Node, str],
              ids: dict[Node, str], details: dict[str, dict[str, str]], step: int,
              kernels: Sequence[KernelInfo] | None) -> None:
    kind = node_kind(node, step, kernels)
    operands = [_operand(v, graph, names) for v in node.inputs]
    attrs = format_attrs(node)
    info = {"title": f"{names[node]} = {node.op.text}", "op": node.op.text,
            "inputs": "\n".join(operands), "outputs": _types(node), "attributes": attrs}
    if kernels is not None and step != NOT_RUN:
        k = kernels[step]
        info["kernel"] = f"step {step}: {k.kind}" + (f" ({k.decision})" if k.decision else "")
    tooltip = "\n".join([info["title"], f"out: {info['outputs']}", *operands[:6],
                         attrs[:200]]).strip()
    target.node(ids[node], f"{node.op.text}\n{_types(node)}", id=ids[node],  # type: ignore
                fillcolor=KIND_COLOURS[kind][0], tooltip=tooltip, **{"class": f"op {kind}"})
    details[ids[node]] = info


def _types(node: Node) -> str:
    return ", ".join(str(t) for t in node.types) or "(no result)"


def _ref(value: Value, names: dict[Node, str]) -> str:
    name = names[value.node]
    return f"%{name}#{value.index}" if len(value.node.types) > 1 else f"%{name}"


def _operand(value: Value, graph: Graph, names: dict[Node, str]) -> str:
    node = value.node
    if node.op is Op.SCALAR:
        return f"number {format_attrs(node).removeprefix('value=')}"
    if node.op is Op.CONSTANT:
        return f"weight {node.attrs.name}: {value.type}"  # type: ignore[attr-defined]
    return f"{_ref(value, names)}: {value.type}"
