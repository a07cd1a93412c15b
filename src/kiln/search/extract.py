"""Extraction: the cheapest well-typed graph an e-graph holds (Tensat, section 5).

    typed = type_egraph(run, graph, model)      # types, costs, weight-only classes
    choice = extract_greedy(typed, run.roots)   # or extract_ilp(typed, run.roots, 5.0)
    cheaper = rebuild(choice, run, graph)       # a kiln Graph

Typing. Every e-node is typed with kiln's own inference (`kiln.ir.infer`) from its children
classes' types; a class's type is its original value's type where it has one, else the first
type found. An e-node whose type differs from its class's is never chosen (a rewrite
egglog applied where the law's types do not hold: broadcasting, promotion).

Costs. An op e-node costs what the cost model says for that op on those types; leaves,
numbers, list cells and output selections cost nothing, and so does an op whose operands are
all computable from weights and numbers alone: constant folding computes it at compile time.

* **Greedy** picks, per class, the e-node whose own cost plus its children's best costs is
  least (a tree cost: a shared subterm counts once per use). Costs are positive, so the
  choice has no cycles.
* **ILP** (HiGHS, through `highspy`) minimizes the DAG cost, each chosen e-node counted once:
  binary x per e-node, one chosen per root class, a chosen e-node's children classes each
  with a chosen e-node, and an order variable per class with ``order(child) < order(parent)``
  for chosen e-nodes, which rules out cycles. Solved within a time limit; without a feasible
  solution by then, None (the caller keeps greedy's choice).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.cost.graph import CostModel
from kiln.ir.attrs import NO_ATTRS
from kiln.ir.graph import Graph, Node, Value, make_scalar
from kiln.ir.infer import InferenceError, infer_types
from kiln.ir.ops import Op
from kiln.ir.types import TensorType
from kiln.rewrite.pattern import MatchContext
from kiln.search.saturate import MULTI_OUTPUT, ENode, Saturation, number_value

__all__ = ["Typed", "extract_greedy", "extract_ilp", "rebuild", "type_egraph"]

EPSILON = 1e-12  # per chosen e-node: ties go to fewer nodes, and no zero-cost cycles


@dataclass
class Typed:
    types: dict[str, Any]  # value class: TensorType; tuple class: tuple of them; list: tuple
    valid: dict[str, list[ENode]]  # the well-typed e-nodes of each class
    cost: dict[ENode, float]
    weight: set[str] = field(default_factory=set)  # classes computable from weights alone
    scalars: dict[str, Any] = field(default_factory=dict)  # classes that hold a Python number
    rejected: int = 0  # e-nodes whose type differs from their class's


def type_egraph(run: Saturation, graph: Graph, model: CostModel) -> Typed:
    egraph = run.egraph
    typed = Typed({}, {c: [] for c in egraph}, {})
    for value, cls in run.classes.items():
        typed.types[cls] = value.type
    for node, cls in run.node_classes.items():
        typed.types[cls] = node.types
    for cls in egraph.values():
        for n in cls.nodes:
            if n.kind == "num":
                typed.scalars[cls.id] = number_value(n.data[0])
    order = sorted(egraph, key=_class_order)
    pending = {c: list(egraph[c].nodes) for c in order}
    infer_cache: dict[tuple, Any] = {}
    changed = True
    while changed:
        changed = False
        for c in order:
            still = []
            for n in pending[c]:
                t = _node_type(n, typed, run, infer_cache)
                if t is _UNKNOWN:
                    still.append(n)
                    continue
                changed = True
                if t is not None and c not in typed.types:
                    typed.types[c] = t
                if t is not None and t == typed.types[c]:
                    typed.valid[c].append(n)
                else:
                    typed.rejected += 1
            pending[c] = still
    _weights(typed, run)
    for c, nodes in typed.valid.items():
        for n in nodes:
            typed.cost[n] = _node_cost(n, c, typed, run, model)
    return typed


_UNKNOWN = object()  # a child's type is not known yet


def _class_order(cls: str) -> tuple[str, int]:
    sort, _, number = cls.rpartition("-")
    return (sort, int(number) if number.isdigit() else 0)


def _node_type(n: ENode, typed: Typed, run: Saturation, cache: dict[tuple, Any]) -> Any:
    """The e-node's type, None if it does not type-check, _UNKNOWN if a child is untyped."""
    if n.kind == "leaf":
        return run.encoding.leaves[n.data[0]].types[0]
    if n.kind == "num":
        return make_scalar(number_value(n.data[0])).types[0]
    if n.kind == "nil":
        return ()
    kids = [typed.types.get(c, _UNKNOWN) for c in n.children]
    if any(k is _UNKNOWN for k in kids):
        return _UNKNOWN
    if n.kind == "cons":
        head, rest = kids
        return (head, *rest) if isinstance(head, TensorType) else None
    if n.kind == "get":
        (whole,) = kids
        i = n.data[0]
        return whole[i] if isinstance(whole, tuple) and i < len(whole) else None
    op, key = Op.parse(n.data[0]), n.data[1]
    operands = _operands(n.children[0], typed, run)
    key_types = (op, key, tuple(v.type for v in operands),
                 tuple(typed.scalars.get(c) for c in _elements(n.children[0], run)))
    if key_types not in cache:
        try:
            types = infer_types(op, run.encoding.attrs[key], operands)
            cache[key_types] = types if op in MULTI_OUTPUT or len(types) > 1 else types[0]
        except (InferenceError, TypeError, ValueError, IndexError):
            cache[key_types] = None
    return cache[key_types]


def _elements(args_class: str, run: Saturation) -> list[str]:
    """The value classes of a list class, in order (a list class has one e-node)."""
    items = []
    cls = args_class
    while True:
        n = run.egraph[cls].nodes[0]
        if n.kind == "nil":
            return items
        items.append(n.children[0])
        cls = n.children[1]


def _operands(args_class: str, typed: Typed, run: Saturation) -> list[Value]:
    """Stand-in operands for type inference: numbers as numbers, tensors as inputs."""
    values = []
    for c in _elements(args_class, run):
        if c in typed.scalars:
            values.append(make_scalar(typed.scalars[c]).out())
        else:
            values.append(Node(Op.INPUT, (), NO_ATTRS, (typed.types[c],), "x").out())
    return values


def _weights(typed: Typed, run: Saturation) -> None:
    """Classes computable from weights and numbers alone (a fixpoint over valid e-nodes)."""
    changed = True
    while changed:
        changed = False
        for c, nodes in typed.valid.items():
            if c in typed.weight:
                continue
            for n in nodes:
                if n.kind == "leaf":
                    ok = run.encoding.leaves[n.data[0]].op is Op.CONSTANT
                elif n.kind in ("num", "nil"):
                    ok = True
                elif n.kind == "op" and Op.parse(n.data[0]) is Op.CALL:
                    ok = False  # an opaque call is not folded
                else:
                    ok = all(k in typed.weight for k in n.children)
                if ok:
                    typed.weight.add(c)
                    changed = True
                    break


def _node_cost(n: ENode, cls: str, typed: Typed, run: Saturation, model: CostModel) -> float:
    if n.kind != "op" or all(k in typed.weight for k in n.children):
        return 0.0
    op = Op.parse(n.data[0])
    operands = _operands(n.children[0], typed, run)
    t = typed.types[cls]
    types = t if isinstance(t, tuple) else (t,)
    return model.node_seconds(Node(op, operands, run.encoding.attrs[n.data[1]], types, "e"))


# --- greedy extraction -----------------------------------------------------------------------

def extract_greedy(typed: Typed, roots: Sequence[str]) -> dict[str, ENode] | None:
    """Per class, the e-node of least tree cost; None if a root has no finite choice."""
    best: dict[str, float] = {}
    choice: dict[str, ENode] = {}
    changed = True
    while changed:
        changed = False
        for c, nodes in typed.valid.items():
            for n in nodes:
                if any(k not in best for k in n.children):
                    continue
                total = typed.cost[n] + EPSILON + sum(best[k] for k in n.children)
                if total < best.get(c, math.inf) - 1e-18:
                    best[c], choice[c] = total, n
                    changed = True
    return choice if all(r in choice for r in roots) else None


# --- ILP extraction --------------------------------------------------------------------------

def _quiet_highs(highspy: Any) -> Any:
    """A Highs instance with its output off. The first one in a process prints HiGHS's
    banner to the C stdout before any option can be set (two lines in the middle of a
    user's compile or `kiln explain`), so stdout's descriptor points at /dev/null while
    it is made."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # None, or closed
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout to protect (a closed descriptor 1)
        h = highspy.Highs()
    else:
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def extract_ilp(typed: Typed, roots: Sequence[str], seconds: float,
                start: dict[str, ENode] | None = None) -> dict[str, ENode] | None:
    """The least DAG cost choice by integer programming (HiGHS), or None without one in
    ``seconds``. ``start``: a known choice (greedy's) the solver starts from."""
    try:
        import highspy
    except ImportError:
        return None  # no ILP solver: the caller keeps greedy's choice (kiln[search] has it)
    reach = _reachable(typed, roots)
    nodes = [(c, n) for c in reach for n in typed.valid[c]  # an e-node in its own child class
             if all(k in reach and k != c for k in n.children)]  # is a cycle: never chosen
    h = _quiet_highs(highspy)
    h.setOptionValue("time_limit", float(seconds))
    h.setOptionValue("mip_rel_gap", 1e-4)
    inf = highspy.kHighsInf
    x: dict[tuple[str, ENode], int] = {}
    for key in nodes:
        x[key] = h.getNumCol()
        h.addVar(0.0, 1.0)
        h.changeColCost(x[key], typed.cost[key[1]] + EPSILON)
        h.changeColIntegrality(x[key], highspy.HighsVarType.kInteger)
    order = {}
    big = float(len(reach) + 1)
    for c in reach:
        order[c] = h.getNumCol()
        h.addVar(0.0, big)
    members: dict[str, list[int]] = {c: [] for c in reach}
    for (c, _), i in x.items():
        members[c].append(i)
    for r in dict.fromkeys(roots):
        if not members[r]:
            return None
        _row(h, 1.0, inf, members[r], [1.0] * len(members[r]))
    for (c, n), i in x.items():
        for k in dict.fromkeys(n.children):
            # chosen n needs a chosen e-node in k, and k ordered before c
            _row(h, 0.0, inf, members[k] + [i], [1.0] * len(members[k]) + [-1.0])
            _row(h, -inf, big - 1.0, [order[k], order[c], i], [1.0, -1.0, big])
    if start is not None:
        _warm_start(h, x, start, reach)
    h.run()
    status = h.getModelStatus()
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit,
                      highspy.HighsModelStatus.kInterrupt):
        return None
    values = h.getSolution().col_value
    if not values:
        return None
    choice: dict[str, ENode] = {}
    for (c, n), i in x.items():
        if values[i] > 0.5 and (c not in choice or typed.cost[n] < typed.cost[choice[c]]):
            choice[c] = n
    return choice if all(r in choice for r in roots) else None


def _row(h: Any, lower: float, upper: float, index: list[int], value: list[float]) -> None:
    import numpy as np

    h.addRow(lower, upper, len(index), np.array(index, dtype=np.int32),
             np.array(value, dtype=np.float64))


def _warm_start(h: Any, x: dict, start: dict[str, ENode], reach: set[str]) -> None:
    import highspy

    solution = highspy.HighsSolution()
    cols = [0.0] * h.getNumCol()
    for (c, n), i in x.items():
        if start.get(c) == n:
            cols[i] = 1.0
    solution.col_value = cols
    try:
        h.setSolution(solution)
    except Exception:  # noqa: BLE001 - a start the solver refuses only costs time
        pass


def _reachable(typed: Typed, roots: Sequence[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for n in typed.valid[c]:
            stack.extend(n.children)
    return seen


# --- back to a kiln graph --------------------------------------------------------------------

def rebuild(choice: dict[str, ENode], run: Saturation, graph: Graph) -> Graph:
    """The graph the choice describes, over ``graph``'s inputs and weights."""
    names = {c: v.node.name for v, c in run.classes.items()}
    names.update({c: node.name for node, c in run.node_classes.items()})
    built: dict[str, Any] = {}
    nodes: list[Node] = []
    visiting: set[str] = set()

    def value(c: str) -> Any:
        if c in built:
            return built[c]
        if c in visiting:
            raise ValueError(f"the chosen e-nodes form a cycle through class {c}")
        visiting.add(c)
        n = choice[c]
        if n.kind == "leaf":
            result: Any = run.encoding.leaves[n.data[0]].out()
        elif n.kind == "num":
            node = make_scalar(number_value(n.data[0]))
            nodes.append(node)
            result = node.out()
        elif n.kind == "nil":
            result = ()
        elif n.kind == "cons":
            result = (value(n.children[0]), *value(n.children[1]))
        elif n.kind == "get":
            result = value(n.children[0]).out(n.data[0])
        else:
            op = Op.parse(n.data[0])
            inputs = value(n.children[0])
            attrs = run.encoding.attrs[n.data[1]]
            node = Node(op, inputs, attrs, infer_types(op, attrs, inputs), names.get(c, "sat"))
            nodes.append(node)
            result = node if op in MULTI_OUTPUT or len(node.types) > 1 else node.out()
        visiting.discard(c)
        built[c] = result
        return result

    outputs = [value(c) for c in run.roots]
    # leaves computed from weights keep their subgraphs (dead ones are dropped later)
    leaves = set(run.encoding.leaves)
    ctx = MatchContext(graph)
    prelude = [n for n in graph.nodes if n in leaves or ctx.is_weight_only(n.out())]
    return Graph(graph.inputs, prelude + nodes, outputs, graph.constants, graph.device)
