"""GraphBuilder: the one way to build a graph by hand (frontends, passes, tests).

    b = GraphBuilder()
    x = b.input("x", TensorType((8, 16), DType.F32))
    w = b.constant("fc.weight", torch.randn(4, 16))
    y = b.op(Op.MM, x, b.op(Op.PERMUTE, w, attrs=PermuteAttrs((1, 0))))
    graph = b.build(y)

Output types are inferred from the op's ATen meaning unless given.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kiln.ir.attrs import NO_ATTRS, Attrs, Number, canonical
from kiln.ir.graph import Graph, Node, Value, make_constant, make_input, make_scalar
from kiln.ir.infer import infer_types
from kiln.ir.ops import Op
from kiln.ir.types import TensorType


class GraphBuilder:
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.inputs: list[Node] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, torch.Tensor] = {}
        self._scalars: dict[object, Node] = {}

    def input(self, name: str, type_: TensorType) -> Value:
        node = make_input(len(self.inputs), name, type_)
        self.inputs.append(node)
        return node.out()

    def constant(self, name: str, tensor: torch.Tensor) -> Value:
        """A weight; the same name always means the same tensor."""
        if name in self.constants and self.constants[name] is not tensor:
            raise ValueError(f"constant {name!r} is already bound to another tensor")
        self.constants[name] = tensor
        node = make_constant(name, tensor)
        self.nodes.append(node)
        return node.out()

    def scalar(self, value: Number) -> Value:
        key = canonical(value)  # 0.0 and -0.0, 1 and 1.0 stay apart
        if key not in self._scalars:
            node = make_scalar(value, "c")
            self._scalars[key] = node
            self.nodes.append(node)
        return self._scalars[key].out()

    def add(self, node: Node) -> Node:
        """Append an already built node."""
        self.nodes.append(node)
        return node

    def node(self, op: Op, *inputs: Value, attrs: Attrs = NO_ATTRS,
             types: Sequence[TensorType] | None = None, name: str | None = None) -> Node:
        if types is None:
            types = infer_types(op, attrs, inputs)
        node = Node(op, inputs, attrs, types, name or op.text)
        self.nodes.append(node)
        return node

    def op(self, op: Op, *inputs: Value, attrs: Attrs = NO_ATTRS,
           name: str | None = None) -> Value:
        """A single-output op; returns its value."""
        return self.node(op, *inputs, attrs=attrs, name=name).out()

    def build(self, *outputs: Value) -> Graph:
        return Graph(self.inputs, self.nodes, outputs, self.constants, self.device)
