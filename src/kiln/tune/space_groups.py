"""Design spaces of the partitioner's fused kernels: row kernels (softmax, layer norm, with
their inlined prologue) and elementwise chains.

    space = GroupSpace.of(graph, group)
    planned = space.planned(space.default())     # (plan, inputs, outputs), as compiled

Decisions:

* a row kernel: ``lanes``, the width of its partial reductions (8 to 64 fp32 lanes; a row
  pass that reads a bool mask needs 64 byte lanes to vectorize under gcc, so 32 or 64
  there), and ``parallel``, whether its rows are split over the threads;
* an elementwise chain: ``vector``, the lanes a single long loop is split into, and
  ``parallel``.

The default point is what `kiln.kernels.build` compiles untuned: the row schedule's lanes,
and threads only for kernels with at least `GRAIN` output elements.

A space holds its group as a graph of its own (the group's nodes, its inputs as graph
inputs, the weights it reads), so it travels to the runner's process as IR text and those
weights. Its workload key is the group's structure (ops, attributes, types and wiring), not
its node names: the twelve layer norms of a BERT share one workload and one tuning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Graph, Node, Value, unique_names
from kiln.ir.ops import Op, OpGroup
from kiln.ir.parser import parse_graph
from kiln.ir.printer import print_graph
from kiln.kernels.loops import plan_loops
from kiln.kernels.loops_schedule import VECTOR
from kiln.kernels.plan import GRAIN, BoolsAsBytes, KernelPlan, Serial
from kiln.kernels.rows import default_lanes, is_row_group, plan_rows
from kiln.kernels.strides import runtime_strides
from kiln.kernels.validate import library_results, random_operands
from kiln.passes.layout import channels_last_values
from kiln.passes.partition import KernelGroup
from kiln.tir.nodes import channels_last_strides
from kiln.tune.space import with_samples

__all__ = ["GroupSpace"]

Planned = tuple[KernelPlan, tuple[Value, ...], tuple[Value, ...]]


@dataclass(frozen=True, eq=False)
class GroupSpace:
    graph: Graph  # the group alone: its inputs, the weights it reads, its nodes
    group: KernelGroup
    kind: str = field(default="")
    # the standalone graph's values -> the values of the graph the space was made from
    origin: dict[Value, Value] = field(default_factory=dict)
    # the standalone inputs that are views in the graph the space was made from: the strides
    # the run time gives them (`kiln.kernels.strides.runtime_strides`), which the loops
    # kernel reads them with
    strides: dict[Value, tuple[int, ...]] = field(default_factory=dict)
    # the standalone outputs written with other strides (NHWC: `_channels_last_layout`)
    out_strides: dict[Value, tuple[int, ...]] = field(default_factory=dict)

    @staticmethod
    def of(graph: Graph, group: KernelGroup, nhwc: set[Value] | None = None) -> GroupSpace:
        """``nhwc``: the graph's `channels_last_values`, where the caller has them."""
        alone, alone_group, origin = standalone(graph, group)
        kind = "rows" if is_row_group(alone_group) else "loops"
        layout = _channels_last_layout(graph, group, nhwc) if kind == "loops" else {}
        strides = {new: s for new, old in origin.items() if new in alone_group.inputs
                   for s in [layout.get(old) or runtime_strides(graph, old)] if s is not None}
        out_strides = {new: layout[old] for new, old in origin.items()
                       if new in alone_group.outputs and old in layout}
        return GroupSpace(alone, alone_group, kind, origin, strides, out_strides)

    def planned_in_source(self, decisions: Mapping[str, Any], record: bool = True) -> Planned:
        """`planned`, with inputs and outputs as values of the graph the space came from."""
        plan, ins, outs = self.planned(decisions, record)
        return plan, tuple(self.origin[v] for v in ins), tuple(self.origin[v] for v in outs)

    def __reduce__(self) -> tuple[Any, ...]:
        """IR nodes refuse pickle's setattr: the graph travels as text, and the values the
        space refers to (group inputs, their strides, NHWC outputs) by their printed names."""
        names = unique_names(self.graph.all_nodes())

        def key(v: Value) -> tuple[str, int]:
            return names[v.node], v.index

        return (_from_text, (print_graph(self.graph), self.graph.constants, self.kind,
                             [key(v) for v in self.group.inputs],
                             {key(v): s for v, s in self.strides.items()},
                             {key(v): s for v, s in self.out_strides.items()}))

    @property
    def rows(self) -> bool:
        return self.kind == "rows"

    def names(self) -> tuple[str, ...]:
        return ("lanes", "parallel") if self.rows else ("vector", "parallel")

    def default(self) -> dict[str, Any]:
        width = default_lanes(self.group) if self.rows else VECTOR
        return {self.names()[0]: width, "parallel": self._elements() >= GRAIN}

    def candidates(self, name: str, fixed: Mapping[str, Any]) -> tuple[Any, ...]:
        if name == "parallel":
            return (False, True)
        if name in ("lanes", "vector"):
            if self.rows and default_lanes(self.group) > 16:  # a mask: byte vectors
                return (32, 64)
            return (8, 16, 32, 64)
        raise KeyError(f"the {self.kind} space has no decision {name!r}")

    def planned(self, decisions: Mapping[str, Any], record: bool = True) -> Planned:
        """The plan (with its decisions at the head of its trace where ``record``) and the
        values its parameters stand for."""
        if self.rows:
            plan, ins, outs = plan_rows(self.graph, self.group, lanes=decisions["lanes"],
                                        strides=self.strides)
        else:
            plan, ins, outs = plan_loops(self.graph, self.group, vector=decisions["vector"],
                                         strides=self.strides, out_strides=self.out_strides)
        plan = plan.with_post(BoolsAsBytes())
        if not decisions["parallel"]:
            why = (f"fewer than {GRAIN} output elements" if self._elements() < GRAIN
                   else "tuned: one thread is faster")
            plan = plan.with_post(Serial(why))
        if record:
            plan = with_samples(plan, self, decisions)
        return plan, tuple(ins), tuple(outs)

    def plan(self, decisions: Mapping[str, Any]) -> KernelPlan:
        return self.planned(decisions)[0]

    def operands(self, decisions: Mapping[str, Any], gen: torch.Generator
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Random operands in parameter order (the real weights), empty outputs last, and
        the library's results for those outputs."""
        _, ins, outs = self.planned(decisions, record=False)
        env = library_results(self.graph, self.group,
                              random_operands(self.graph, self.group, self.strides))
        inputs = [self.graph.constant(v.node) if v.node.op is Op.CONSTANT else env[v]
                  for v in ins]
        results = [torch.empty(v.type.shape, dtype=v.type.dtype.torch) if v not in
                   self.out_strides else torch.empty_strided(v.type.shape, self.out_strides[v],
                                                             dtype=v.type.dtype.torch)
                   for v in outs]
        return [*inputs, *results], [env[v] for v in outs]

    def workload_text(self) -> str:
        """The group's structure: each node's op, attributes, operand wiring and types."""
        position = {v: f"%{i}" for i, v in enumerate(self.group.inputs)}
        lines = [f"{self.kind} in: " + ", ".join(str(v.type) for v in self.group.inputs)]
        for j, node in enumerate(self.group.nodes):
            for k, out in enumerate(node.outputs):
                position[out] = f"n{j}.{k}"
            args = ", ".join(position.get(v, _literal(v)) for v in node.inputs)
            types = ", ".join(str(v.type) for v in node.outputs)
            lines.append(f"n{j} = {node.op.text}({args}) {node.attrs} -> {types}")
        lines.append("out: " + ", ".join(position[v] for v in self.group.outputs))
        return "\n".join(lines)

    def workload(self) -> str:
        return hashlib.sha256(self.workload_text().encode()).hexdigest()[:32]

    def _elements(self) -> int:
        return sum(v.type.numel for v in self.group.outputs)


def _channels_last_layout(graph: Graph, group: KernelGroup, nhwc: set[Value] | None
                          ) -> dict[Value, tuple[int, ...]]:
    """Where every output of the elementwise group is NHWC at run time (a SiLU or hardswish
    between convolutions: MobileViT, EfficientNet, LeViT), its outputs and its NHWC inputs
    that are not views (views: `runtime_strides`), with NHWC strides; else nothing. Read and
    written contiguously, such a kernel found its operands NHWC at every call and its
    group's library ops ran instead."""
    if not group.outputs or any(len(v.type.shape) != 4 for v in group.outputs):
        return {}
    nhwc = channels_last_values(graph) if nhwc is None else nhwc
    if not all(v in nhwc for v in group.outputs):
        return {}
    return {v: channels_last_strides(v.type.shape) for v in (*group.inputs, *group.outputs)
            if v in nhwc and len(v.type.shape) == 4 and not v.node.op.is_a(OpGroup.VIEW)}


def standalone(graph: Graph, group: KernelGroup
               ) -> tuple[Graph, KernelGroup, dict[Value, Value]]:
    """``group`` as a graph of its own: its inputs become graph inputs (weights stay
    constants, numbers stay numbers), its outputs the graph's outputs; and the map from its
    values back to ``graph``'s. Names are by position (``in0``, ``c0``, ``n0``), so the
    layers of a model that repeat one structure give equal programs, whose plans are then
    built once (`kiln.kernels.plan._build`: GPT-2's 23 add + layer-norm groups)."""
    b = GraphBuilder(graph.device)
    mapping: dict[Value, Value] = {}

    def source(v: Value) -> Value:
        if v not in mapping:
            node = v.node
            if node.op is Op.CONSTANT:
                constants = sum(1 for m in mapping if m.node.op is Op.CONSTANT)
                mapping[v] = b.constant(f"c{constants}", graph.constant(node))
            elif node.op is Op.SCALAR:
                mapping[v] = b.scalar(node.attrs.value)  # type: ignore[attr-defined]
            else:
                mapping[v] = b.input(f"in{len(b.inputs)}", v.type)
        return mapping[v]

    for v in group.inputs:
        source(v)
    nodes = []
    for i, node in enumerate(group.nodes):
        new = b.add(Node(node.op, [mapping.get(v) or source(v) for v in node.inputs],
                         node.attrs, node.types, f"n{i}"))
        mapping.update(zip(node.outputs, new.outputs))
        nodes.append(new)
    alone = b.build(*(mapping[v] for v in group.outputs))
    alone_group = KernelGroup(tuple(nodes), tuple(mapping[v] for v in group.inputs),
                              tuple(mapping[v] for v in group.outputs))
    return alone, alone_group, {new: old for old, new in mapping.items()}


Key = tuple[str, int]


def _from_text(text: str, constants: dict[str, torch.Tensor], kind: str, inputs: list[Key],
               strides: dict[Key, tuple[int, ...]], out_strides: dict[Key, tuple[int, ...]]
               ) -> GroupSpace:
    graph = parse_graph(text, constants)
    nodes = {n.name: n for n in graph.all_nodes()}

    def value(key: Key) -> Value:
        return nodes[key[0]].outputs[key[1]]

    body = tuple(n for n in graph.nodes if n.op not in (Op.CONSTANT, Op.SCALAR))
    group = KernelGroup(body, tuple(value(k) for k in inputs), graph.outputs)
    return GroupSpace(graph, group, kind, {},
                      {value(k): s for k, s in strides.items()},
                      {value(k): s for k, s in out_strides.items()})


def _literal(value: Value) -> str:
    node = value.node
    if node.op is Op.SCALAR:
        return repr(node.attrs.value)  # type: ignore[attr-defined]
    return f"const {value.type}"

