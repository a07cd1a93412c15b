"""The tensor-level dataflow graph: immutable nodes, values, and the graph that orders them.

A `Node` is one op application; it produces one or more `Value`s (``node.out(i)``). Nodes are
immutable: a pass builds new nodes and returns a new `Graph` (or the same object when it
changed nothing). Graph inputs are INPUT nodes; weights are CONSTANT nodes whose tensors live
in ``Graph.constants``; Python numbers are SCALAR nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from kiln.ir import calls
from kiln.ir.attrs import Attrs, ConstantAttrs, InputAttrs, Number, ScalarAttrs
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType


class Node:
    """One op application. Identity matters: two nodes are equal only if they are the same."""

    __slots__ = ("op", "inputs", "attrs", "types", "name")

    def __init__(self, op: Op, inputs: Sequence[Value], attrs: Attrs,
                 types: Sequence[TensorType], name: str) -> None:
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "types", tuple(types))
        object.__setattr__(self, "name", name)

    op: Op
    inputs: tuple[Value, ...]
    attrs: Attrs
    types: tuple[TensorType, ...]
    name: str  # a readable label, kept across passes; the printer makes it unique

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("kiln IR nodes are immutable; build a new node instead")

    def out(self, index: int = 0) -> Value:
        return Value(self, index)

    @property
    def outputs(self) -> tuple[Value, ...]:
        return tuple(Value(self, i) for i in range(len(self.types)))

    @property
    def type(self) -> TensorType:
        """The type of a single-output node."""
        if len(self.types) != 1:
            raise ValueError(f"node {self.name} ({self.op.text}) has {len(self.types)} outputs")
        return self.types[0]

    def key(self) -> tuple[object, ...]:
        """Structural key: equal keys compute equal values (used by CSE)."""
        return (self.op, self.inputs, self.attrs, self.types)

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.op.text}>"


@dataclass(frozen=True, slots=True)
class Value:
    """The ``index``-th output of ``node``."""

    node: Node
    index: int = 0

    @property
    def type(self) -> TensorType:
        return self.node.types[self.index]

    @property
    def op(self) -> Op:
        return self.node.op

    def __repr__(self) -> str:
        suffix = f"#{self.index}" if len(self.node.types) > 1 else ""
        return f"%{self.node.name}{suffix}"


class Graph:
    """Inputs, an ordered body of nodes, outputs, and the weights CONSTANT nodes refer to."""

    __slots__ = ("inputs", "nodes", "outputs", "constants", "device")

    def __init__(self, inputs: Sequence[Node], nodes: Sequence[Node], outputs: Sequence[Value],
                 constants: Mapping[str, torch.Tensor] | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.inputs = tuple(inputs)
        self.nodes = tuple(nodes)
        self.outputs = tuple(outputs)
        self.constants = dict(constants or {})
        self.device = torch.device(device)

    def all_nodes(self) -> Iterator[Node]:
        yield from self.inputs
        yield from self.nodes

    def users(self) -> dict[Node, list[Node]]:
        """For each node, the body nodes that read one of its outputs, in order."""
        users: dict[Node, list[Node]] = {n: [] for n in self.all_nodes()}
        for node in self.nodes:
            for node_in in dict.fromkeys(v.node for v in node.inputs):
                users.setdefault(node_in, []).append(node)
        return users

    def constant(self, node: Node) -> torch.Tensor:
        assert isinstance(node.attrs, ConstantAttrs)
        return self.constants[node.attrs.name]

    def num_ops(self) -> int:
        """Body nodes that compute something (weights and numbers not counted)."""
        return sum(1 for n in self.nodes if n.op not in (Op.CONSTANT, Op.SCALAR))

    def op_counts(self) -> dict[str, int]:
        """How many body nodes of each op, sources excluded, by kiln op name."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            if node.op not in (Op.CONSTANT, Op.SCALAR):
                counts[node.op.text] = counts.get(node.op.text, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def replace(self, *, nodes: Sequence[Node] | None = None,
                outputs: Sequence[Value] | None = None,
                constants: Mapping[str, torch.Tensor] | None = None) -> Graph:
        return Graph(self.inputs, self.nodes if nodes is None else nodes,
                     self.outputs if outputs is None else outputs,
                     self.constants if constants is None else constants, self.device)

    def __str__(self) -> str:
        from kiln.ir.printer import print_graph

        return print_graph(self)


def make_input(index: int, name: str, type_: TensorType) -> Node:
    return Node(Op.INPUT, (), InputAttrs(index), (type_,), name)


def make_constant(name: str, tensor: torch.Tensor, label: str | None = None) -> Node:
    return Node(Op.CONSTANT, (), ConstantAttrs(name), (TensorType.of(tensor),), label or name)


def make_scalar(value: Number, name: str = "c") -> Node:
    return Node(Op.SCALAR, (), ScalarAttrs(value), (scalar_type(value),), name)


def scalar_type(value: Number) -> TensorType:
    """ATen treats a Python number as a 0-d tensor of double, long or bool ("wrapped")."""
    if isinstance(value, bool):
        return TensorType((), DType.BOOL)
    if isinstance(value, int):
        return TensorType((), DType.I64)
    return TensorType((), DType.F64)


Rewrite = Callable[[Node, tuple[Value, ...]], "Sequence[Value] | Node | None"]


def transform(graph: Graph, rewrite: Rewrite) -> Graph:
    """Rebuild ``graph`` node by node.

    For each body node, ``rewrite(node, new_inputs)`` sees the node and its operands after
    earlier rewrites. It returns None to keep the node (rebuilt only if an operand changed),
    a Node to use instead (already built from ``new_inputs``) or the Values that replace the
    node's outputs. Nodes the result refers to that are not yet in the body are appended
    before the node's users, so a rewrite may build small subgraphs.
    """
    mapping: dict[Value, Value] = {}
    new_nodes: list[Node] = []
    placed: set[Node] = set(graph.inputs)
    changed = False

    def place(node: Node) -> None:
        if node in placed:
            return
        for v in node.inputs:
            place(v.node)
        placed.add(node)
        new_nodes.append(node)

    for node in graph.nodes:
        new_inputs = tuple(mapping.get(v, v) for v in node.inputs)
        result = rewrite(node, new_inputs)
        if result is None:
            if new_inputs != node.inputs:
                result = Node(node.op, new_inputs, node.attrs, node.types, node.name)
            else:
                result = node
        if isinstance(result, Node):
            place(result)
            replacements: Sequence[Value] = result.outputs
        else:
            replacements = result
            for v in replacements:
                place(v.node)
        if len(replacements) != len(node.types):
            raise ValueError(f"rewrite of {node.name} gave {len(replacements)} values for "
                             f"{len(node.types)} outputs")
        for old, new in zip(node.outputs, replacements):
            if old != new:
                mapping[old] = new
                changed = True
    if not changed:
        return graph
    outputs = [mapping.get(v, v) for v in graph.outputs]
    return graph.replace(nodes=new_nodes, outputs=outputs)


def live_nodes(graph: Graph) -> set[Node]:
    """Nodes that an output depends on, and the calls run for their effect (a run-time
    assertion, an in-place write) with the nodes they read."""
    live: set[Node] = set()
    stack = [v.node for v in graph.outputs] + [n for n in graph.nodes if calls.has_effect(n)]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(v.node for v in node.inputs)
    return live


def unique_names(nodes: Iterable[Node]) -> dict[Node, str]:
    """A distinct printable name per node, from its label (``x``, ``x_1``, ...)."""
    taken: set[str] = set()
    names: dict[Node, str] = {}
    for node in nodes:
        base = _sanitize(node.name)
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        names[node] = name
    return names


def _sanitize(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_." else "_" for c in name)
    return cleaned or "v"


def substitute(graph: Graph, mapping: Mapping[Value, Value],
               constants: Mapping[str, torch.Tensor] | None = None) -> Graph:
    """Every use of a key of ``mapping`` becomes its value; dead nodes are dropped.

    Replacement values may be new nodes (built from values of ``graph``, and from other keys,
    which are followed in turn); each new node is placed just before its first user. Weights
    that new CONSTANT nodes refer to come in ``constants``.
    """
    rebuilt: dict[Node, Node] = {n: n for n in graph.inputs}
    order: list[Node] = []

    def resolve(value: Value) -> Value:
        seen: set[Value] = set()
        while value in mapping:
            if value in seen:
                raise ValueError(f"substitution of {value} refers back to itself")
            seen.add(value)
            value = mapping[value]
        return Value(build(value.node), value.index)

    def build(node: Node) -> Node:
        done = rebuilt.get(node)
        if done is not None:
            return done
        inputs = tuple(resolve(v) for v in node.inputs)
        new = node if inputs == node.inputs else Node(node.op, inputs, node.attrs, node.types,
                                                      node.name)
        rebuilt[node] = new
        order.append(new)
        return new

    for node in graph.nodes:
        build(node)
    outputs = [resolve(v) for v in graph.outputs]
    result = graph.replace(nodes=order, outputs=outputs,
                           constants={**graph.constants, **(constants or {})})
    live = live_nodes(result)
    kept = [n for n in order if n in live]
    used = {n.attrs.name for n in kept if n.op is Op.CONSTANT}  # type: ignore[attr-defined]
    return result.replace(nodes=kept, constants={k: v for k, v in result.constants.items()
                                                 if k in used})

