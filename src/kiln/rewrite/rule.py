"""A rewrite rule is a row of data: name, pattern, replacement builder, guard, safety tag.

    Rule("mul-one", On(Op.MUL, Var("x"), Uniform(1)), lambda m: m["x"], EXACT)  # x*1 -> x

The builder gets a `Match`: the bound values by name, and an emitter for new nodes
(``m.op``, ``m.number``, ``m.constant``). It returns the value that replaces the root (or one
value per root for a `Siblings` pattern). The engine checks that each replacement has the
root's exact type, so a rule never needs to guard against broadcasting or dtype promotion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.ir.attrs import NO_ATTRS, Attrs, Number
from kiln.ir.graph import Node, Value, make_constant, make_scalar
from kiln.ir.infer import infer_types
from kiln.ir.ops import Op
from kiln.rewrite.law import EXACT, FAST_MATH, IEEE, Law, Safety
from kiln.rewrite.pattern import MatchContext, Pattern

__all__ = ["EXACT", "FAST_MATH", "IEEE", "Builder", "Guard", "Law", "Match", "Rule", "Safety"]




class Match:
    """A successful match: bound names, the graph it is in, and an emitter for new nodes."""

    def __init__(self, bindings: dict[str, Any], ctx: MatchContext, root: Node) -> None:
        self.bindings = bindings
        self.ctx = ctx
        self.root = root
        self.new_nodes: list[Node] = []
        self.new_constants: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> Any:
        return self.bindings[name]

    @property
    def members(self) -> list[dict[str, Any]]:
        """For a `Siblings` pattern: each root's bindings, in graph order."""
        return self.bindings["members"]

    def number_of(self, name: str) -> Any:
        """The Python number bound to ``name`` (a SCALAR operand)."""
        return self.bindings[name].node.attrs.value

    def uniform(self, name: str) -> Any:
        return self.ctx.uniform_value(self.bindings[name])

    def tensor(self, name: str) -> torch.Tensor:
        return self.ctx.graph.constant(self.bindings[name].node)

    # --- emitting new nodes -----------------------------------------------------------------

    def node(self, op: Op, *inputs: Value, attrs: Attrs = NO_ATTRS,
             name: str | None = None) -> Node:
        # new nodes carry the rewritten root's name, so reports and IR text stay traceable
        node = Node(op, inputs, attrs, infer_types(op, attrs, inputs), name or self.root.name)
        self.new_nodes.append(node)
        return node

    def op(self, op: Op, *inputs: Value, attrs: Attrs = NO_ATTRS,
           name: str | None = None) -> Value:
        return self.node(op, *inputs, attrs=attrs, name=name).out()

    def number(self, value: Number) -> Value:
        node = make_scalar(value)
        self.new_nodes.append(node)
        return node.out()

    def constant(self, tensor: torch.Tensor, label: str) -> Value:
        name = f"rw.{self.root.name}.{label}.{len(self.new_constants)}"
        self.new_constants[name] = tensor
        node = make_constant(name, tensor, label=label)
        self.new_nodes.append(node)
        return node.out()


Builder = Callable[[Match], "Value | Sequence[Value]"]
Guard = Callable[[Match], "str | None"]  # returns why the rule must not fire, or None


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Pattern
    build: Builder
    safety: Safety
    guard: Guard | None = None
    # the algebra the builder implements, one law per op the pattern accepts (kiln.synth
    # prints, proves and checks these; a test checks the builder against them)
    laws: tuple[Law, ...] = ()

    def __post_init__(self) -> None:
        if self.pattern.root_ops() is None:
            raise ValueError(f"rule {self.name}: the pattern's root must be an op pattern")

    def enabled(self, fast_math: bool) -> bool:
        return self.safety is not FAST_MATH or fast_math
