"""Patterns: typed objects that match a value in a graph and bind names.

    On(Op.MUL, Var("x"), Uniform(1))               # x * 1, either operand order (mul commutes)
    On(Op.BATCH_NORM, On(Op.CONVOLUTION, Var("x"), Var("w", Weight()), name="conv"),
       Var("gamma", Weight()), ...)

A pattern's `match` returns None on success (bindings filled in) or a short reason saying
which part failed; the reasons feed `kiln explain --rule`. Interior nodes (matched nodes other
than the root) must be used only inside the match, unless the pattern says ``shared=True``:
otherwise a rewrite would keep them alive and compute them twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.attrs import Attrs, canonical
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.ir.types import DType

FLOATS = frozenset({DType.F64, DType.F32, DType.F16, DType.BF16})


class MatchContext:
    """What patterns may ask of the graph: users, weights, constant values."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.users = graph.users()
        self._weight_only: dict[Node, bool] = {}
        # commutative nodes whose operands are tried in the other order first: a match that
        # binds one order may fail the engine's checks where the other order passes them
        self.swapped: set[Node] = set()

    def is_weight_only(self, value: Value) -> bool:
        """True when the value depends on weights and numbers only (constant folding's domain)."""
        node = value.node
        known = self._weight_only.get(node)
        if known is None:
            stack, order = [node], []
            while stack:  # iterative: weight chains can be long
                n = stack.pop()
                if n in self._weight_only or n in order:
                    continue
                order.append(n)
                stack.extend(v.node for v in n.inputs)
            for n in reversed(order):
                if n.op in (Op.CONSTANT, Op.SCALAR):
                    self._weight_only[n] = True
                elif n.op is Op.INPUT or n.op.is_a(OpGroup.OPAQUE) or not n.inputs:
                    self._weight_only[n] = n.op.is_a(OpGroup.CREATION)
                else:
                    self._weight_only[n] = all(self._weight_only.get(v.node, False)
                                               for v in n.inputs)
            known = self._weight_only[node]
        return known

    def uniform_value(self, value: Value) -> Any:
        """The one number every element of ``value`` equals, or None (numbers, fills, weights)."""
        node = value.node
        if node.op is Op.SCALAR:
            return node.attrs.value  # type: ignore[attr-defined]
        if node.op is Op.FULL:
            return node.attrs.value  # type: ignore[attr-defined]
        if node.op is Op.CONSTANT:
            t = self.graph.constant(node)
            if t.numel() == 0 or t.numel() > 1 << 16:
                return None
            first = t.reshape(-1)[0]
            same = torch.equal(t, first.expand_as(t)) and _same_sign_zeros(t, first)
            if not same:
                return None
            item = first.item()
            if t.dtype.is_floating_point and not math.isnan(item) and item == 0:
                return -0.0 if math.copysign(1.0, item) < 0 else 0.0
            return item
        return None


def _same_sign_zeros(t: torch.Tensor, first: torch.Tensor) -> bool:
    if not t.dtype.is_floating_point:
        return True
    return bool(torch.equal(torch.signbit(t), torch.signbit(first).expand_as(t)))


class Pattern:
    """Base of all patterns. ``match`` returns None on success, else why it failed."""

    def match(self, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def root_ops(self) -> frozenset[Op] | None:
        """Ops a root node must have for this pattern to match (None: any)."""
        return None

    def never_matches(self, value: Value) -> bool:
        """True where the pattern cannot match ``value`` whatever the graph around it: a
        test of the value's own subgraph (immutable), so a search may remember it (False:
        no such test)."""
        return False


# --- constraints on a bound value --------------------------------------------------------

@dataclass(frozen=True)
class Constraint:
    """A test on a value; ``describe`` is what a failure message says was expected."""

    test: Callable[[Value, MatchContext], bool]
    describe: str


def Weight() -> Constraint:  # noqa: N802 - reads like a type in patterns
    return Constraint(lambda v, ctx: ctx.is_weight_only(v), "a weight (constant subgraph)")


def FloatDType() -> Constraint:  # noqa: N802
    return Constraint(lambda v, ctx: v.type.dtype in FLOATS, "a floating-point tensor")


def IntDType() -> Constraint:  # noqa: N802
    return Constraint(lambda v, ctx: v.type.dtype not in FLOATS, "an integer or bool tensor")


def Rank(*ranks: int) -> Constraint:  # noqa: N802
    return Constraint(lambda v, ctx: len(v.type.shape) in ranks, f"rank in {ranks}")


def NotOutput() -> Constraint:  # noqa: N802
    return Constraint(lambda v, ctx: v not in ctx.graph.outputs, "not a graph output")


# --- patterns -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Var(Pattern):
    """Any value, bound to ``name``; the same name twice must be the same value."""

    name: str
    constraints: tuple[Constraint, ...] = ()

    def __init__(self, name: str, *constraints: Constraint) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "constraints", constraints)

    def match(self, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
        if self.name in b and b[self.name] != value:
            return f"{self.name} must be the same value as before, got {_show(value)}"
        for c in self.constraints:
            if not c.test(value, ctx):
                return f"{self.name} must be {c.describe}, got {_show(value)}"
        b[self.name] = value
        return None


@dataclass(frozen=True)
class Uniform(Pattern):
    """A number, a fill or a weight whose every element equals ``value``.

    Equality is by kind and sign: Uniform(0.0) does not match -0.0, Uniform(1) matches 1 and
    1.0 unless ``exact_kind``. Whether the rewrite keeps the type is checked by the engine.
    """

    value: float | int | bool
    name: str | None = None
    exact_kind: bool = False  # True: 1 and 1.0 differ too

    def match(self, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
        got = ctx.uniform_value(value)
        wanted = self.value
        ok = got is not None and (canonical(got) == canonical(wanted) if self.exact_kind
                                  else _same_number(got, wanted))
        if not ok:
            return f"expected a value of all {wanted!r}, got {_show(value)}"
        if self.name is not None:
            b[self.name] = value
        return None


def _same_number(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if a != b:
        return False
    if a == 0:  # tell +0 from -0 where either side is a float
        return math.copysign(1.0, a) == math.copysign(1.0, b)
    return True


@dataclass(frozen=True)
class Number(Pattern):
    """A Python number operand (an ATen wrapped scalar) passing ``where``; bound by name."""

    name: str
    where: Callable[[Any], bool] | None = None
    describe: str = "a number"

    def match(self, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
        if value.node.op is not Op.SCALAR:
            return f"{self.name} must be {self.describe}, got {_show(value)}"
        number = value.node.attrs.value  # type: ignore[attr-defined]
        if self.where is not None and not self.where(number):
            return f"{self.name} must be {self.describe}, got {number!r}"
        b[self.name] = value
        return None


@dataclass(frozen=True)
class On(Pattern):
    """A node with one of ``ops``, operands matching ``operands`` in order (or swapped, for a
    commutative binary op), attributes passing ``where``; bound by ``name``."""

    ops: frozenset[Op]
    operands: tuple[Pattern, ...]
    where: Callable[[Attrs], bool] | None = None
    describe: str = ""  # what ``where`` asks, for failure messages
    name: str | None = None
    output: int | None = 0  # which output of the node the value must be (None: any)
    shared: bool = False  # as an interior node, may it have users outside the match?
    exact_arity: bool = True

    def __init__(self, ops: Op | Iterable[Op], *operands: Pattern,
                 where: Callable[[Attrs], bool] | None = None, describe: str = "",
                 name: str | None = None, output: int | None = 0, shared: bool = False,
                 exact_arity: bool = True) -> None:
        ops_set = frozenset([ops] if isinstance(ops, Op) else ops)
        for key, val in (("ops", ops_set), ("operands", operands), ("where", where),
                         ("describe", describe), ("name", name), ("output", output),
                         ("shared", shared), ("exact_arity", exact_arity)):
            object.__setattr__(self, key, val)

    def root_ops(self) -> frozenset[Op] | None:
        return self.ops

    def match(self, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
        node = value.node
        wanted = "/".join(sorted(op.text for op in self.ops))
        if node.op not in self.ops:
            return f"expected {wanted}, got {_show(value)}"
        if self.output is not None and value.index != self.output:
            return f"expected output {self.output} of {node.name}, got output {value.index}"
        if self.where is not None and not self.where(node.attrs):
            return f"{node.name}: attributes must be {self.describe or 'as the rule needs'}"
        arity_ok = (len(node.inputs) == len(self.operands) if self.exact_arity
                    else len(node.inputs) >= len(self.operands))
        if not arity_ok:
            return f"{node.name}: expected {len(self.operands)} operands, got {len(node.inputs)}"
        orders = [tuple(range(len(self.operands)))]
        if node.op.is_a(OpGroup.COMMUTATIVE) and len(self.operands) == 2:
            orders.insert(1 if node not in ctx.swapped else 0, (1, 0))
        reasons = []
        for order in orders:
            trial = dict(b)
            reason = self._match_operands(node, order, ctx, trial)
            reasons.append(reason)
            if not reason:
                b.clear()
                b.update(trial)
                if self.name is not None:
                    b[self.name] = node
                b.setdefault("_interior", []).append((node, self.shared))
                return None
        return reasons[0]  # the operands in their written order say it most plainly

    def _match_operands(self, node: Node, order: tuple[int, ...], ctx: MatchContext,
                        b: dict[str, Any]) -> str:
        for slot, pattern in zip(order, self.operands):
            reason = pattern.match(node.inputs[slot], ctx, b)
            if reason:
                return f"{node.name} operand {slot}: {reason}"
        return ""


@dataclass(frozen=True)
class Siblings(Pattern):
    """Several roots that read one shared value: the nodes among ``shared``'s users that match
    ``each`` (with the shared value bound to ``shared``) and agree on ``key``.

    A match binds ``"members"``: one bindings dict per root, in graph order (at least
    ``min_count``). Used to merge parallel matmuls/convolutions into one wider op.
    """

    each: On
    shared: str
    key: Callable[[dict[str, Any]], Any] = field(default=lambda b: None)
    min_count: int = 2

    def root_ops(self) -> frozenset[Op] | None:
        return self.each.ops

    def match(self, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
        first: dict[str, Any] = {}
        reason = self.each.match(value, ctx, first)
        if reason:
            return reason
        shared = first[self.shared]
        key = self.key(first)
        members = []
        for user in ctx.users.get(shared.node, []):
            if len(user.types) != 1 or user.op not in self.each.ops:
                continue
            trial: dict[str, Any] = {}
            if self.each.match(user.out(), ctx, trial) is None and trial[self.shared] == shared \
                    and self.key(trial) == key:
                trial["_root"] = user
                members.append(trial)
        if len(members) < self.min_count:
            return (f"{value.node.name}: only {len(members)} matching reader(s) of "
                    f"{_show(shared)} agree, {self.min_count} needed")
        if members[0]["_root"] is not value.node:
            return f"{value.node.name}: not the first of its siblings"
        b["members"] = members
        b["_interior"] = [item for m in members for item in m["_interior"]]
        return None


def _show(value: Value) -> str:
    node = value.node
    suffix = f"#{value.index}" if len(node.types) > 1 else ""
    if node.op is Op.SCALAR:
        return f"number {node.attrs.value!r}"  # type: ignore[attr-defined]
    return f"%{node.name}{suffix} ({node.op.text} {value.type})"
