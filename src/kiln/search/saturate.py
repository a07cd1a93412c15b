"""Equality saturation with egglog (Tensat's method: Yang et al., MLSys'21): the graph goes
into an e-graph, every rule is applied everywhere at once, repeatedly, and the cheapest
equivalent graph is extracted afterwards (`kiln.search.extract`).

    run = saturate(graph, laws, SatLimits(iterations=8, nodes=20_000, seconds=3.0))
    run.egraph, run.classes (the class of each original value), run.iterations, run.stopped

Encoding (one egglog program per graph):

    (datatype* (T (Leaf i64) (Num String) (Get i64 T) (Op String String Args))
               (Args (Nil) (Cons T Args)))

``Leaf i`` is graph input or weight ``i`` (or a value computed from weights alone: constant
folding computes it, so rewriting it gains nothing); ``Num`` a Python number operand, written
with its kind (``f:2.0``, ``i:2``, ``b:True``: ATen promotes each differently); ``Op name
attrs args`` an op application whose attributes are interned under a key (``a3``); ``Get i
t`` output ``i`` of a multi-output op (split, layer_norm, max_pool2d); ``Val k`` names the
class of the graph's k-th value.

A law becomes a ``rewrite`` when egglog can state it: attributes written as values (or left
at their defaults), number conditions only (``(number ?s)`` matches a ``Num``), no
compile-time functions. Commutative ops get their swap as a rule, as the engine's matcher
swaps operands. Everything else a law needs (float/int tensors, same types, weights, guards,
types in general) egglog cannot see; a rewrite may therefore build terms that are ill-typed
on this graph. Extraction types every e-node with kiln's own type inference and never picks
one whose type differs from its class's: what it returns type-checks like the engine's
rewrites do (each replacement has the exact type of what it replaces).

Cycles are normal in an e-graph (x = x + 0 puts a class under itself); extraction keeps them
out of the chosen graph. Limits: iterations, e-nodes and seconds, checked after each
iteration; `stopped` says which one ended the run, or "saturated".
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiln.ir import calls
from kiln.ir.attrs import Attrs, Number, attrs_class_of
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.rewrite.law import App, AttrFn, CondKind, Law, Lit, PVar, Term
from kiln.rewrite.pattern import MatchContext

if TYPE_CHECKING:
    import egglog.bindings as egglog

INSTALL_HINT = "pip install 'kiln[search]'"

__all__ = ["EClass", "ENode", "Encoding", "SatLimits", "Saturation", "SaturationError",
           "UnsupportedLaw",
           "egglog_rule", "saturate"]

MULTI_OUTPUT = frozenset({Op.SPLIT, Op.LAYER_NORM, Op.MAX_POOL2D})
_DECLARE = ("(datatype* (T (Val i64) (Leaf i64) (Num String) (Get i64 T) (Op String String Args))"
            " (Args (Nil) (Cons T Args)))")


class UnsupportedLaw(ValueError):
    """A law egglog cannot state (see the module docstring)."""


class SaturationError(RuntimeError):
    """egglog refused the program or failed (a Rust panic is turned into this)."""


def _egglog(eg: egglog.EGraph, text: str) -> list:
    try:
        return eg.run_program(*eg.parse_program(text))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 - pyo3 panics derive from BaseException
        raise SaturationError(f"egglog: {type(err).__name__}: {str(err)[:300]}") from None


@dataclass(frozen=True)
class SatLimits:
    iterations: int = 8
    nodes: int = 20_000  # e-nodes of T and Args, after an iteration
    seconds: float = 3.0


@dataclass
class Encoding:
    """What the egglog terms stand for in kiln: leaves, interned attributes, numbers."""

    leaves: list[Node] = field(default_factory=list)
    attrs: dict[str, Attrs] = field(default_factory=dict)
    _keys: dict[Any, str] = field(default_factory=dict)

    def attr_key(self, attrs: Attrs) -> str:
        found = self._keys.get(attrs)
        if found is None:
            found = self._keys[attrs] = f"a{len(self.attrs)}"
            self.attrs[found] = attrs
        return found


def number_text(value: Number) -> str:
    kind = "b" if isinstance(value, bool) else "i" if isinstance(value, int) else "f"
    return f"{kind}:{value!r}"


def number_value(text: str) -> Number:
    kind, body = text.split(":", 1)
    if kind == "b":
        return body == "True"
    return int(body) if kind == "i" else float(body)


@dataclass(frozen=True)
class ENode:
    kind: str  # "leaf", "num", "get", "op", "cons", "nil"
    data: tuple  # leaf: (index,); num: (text,); get: (i,); op: (op name, attrs key)
    children: tuple[str, ...]  # class ids


@dataclass
class EClass:
    id: str
    nodes: list[ENode]


@dataclass
class Saturation:
    egraph: dict[str, EClass]
    encoding: Encoding
    classes: dict[Value, str]  # the class of each value of the graph saturated
    node_classes: dict[Node, str]  # the class of each multi-output node (its outputs' tuple)
    roots: tuple[str, ...]  # the classes of the graph's outputs
    iterations: int
    stopped: str  # "saturated", "iterations", "nodes" or "seconds"
    matches: dict[str, int]  # rule -> matches over the run
    rules: int  # rewrites in the program
    skipped: dict[str, str]  # law -> why egglog cannot state it
    seconds: float


def saturate(graph: Graph, laws: Sequence[Law], limits: SatLimits = SatLimits()
             ) -> Saturation:
    """Saturate ``graph`` under ``laws`` within ``limits`` (module docstring)."""
    start = time.perf_counter()
    if any(calls.has_effect(n) for n in graph.nodes):
        raise ValueError("a graph with side effects is not rewritten by saturation")
    encoding = Encoding()
    program, refs = _encode_graph(graph, encoding)
    bodies: dict[str, str] = {}  # egglog refuses a rule twice: laws that encode alike, once
    skipped = {}
    for law in relevant_laws(graph, laws):
        try:
            rule = egglog_rule(law, encoding)
        except UnsupportedLaw as err:
            skipped[law.name] = str(err)
            continue
        bodies.setdefault(rule.rsplit(" :name ", 1)[0], rule)
    rules = list(bodies.values()) + _commutations(graph)
    try:
        import egglog.bindings as egglog_bindings
    except ImportError:
        raise SaturationError(f"equality saturation needs egglog: {INSTALL_HINT}") from None
    eg = egglog_bindings.EGraph()
    _egglog(eg, "\n".join([_DECLARE, *program, *rules]))
    matches: dict[str, int] = {}
    iterations, stopped = 0, "iterations"
    while iterations < limits.iterations:
        out = _egglog(eg, "(run 1)")
        iterations += 1
        report = out[0].report
        for rule, n in report.num_matches_per_rule.items():
            matches[rule] = matches.get(rule, 0) + n
        if not report.updated:
            stopped = "saturated"
            break
        if time.perf_counter() - start > limits.seconds:
            stopped = "seconds"
            break
        if _size(eg) > limits.nodes:
            stopped = "nodes"
            break
    egraph, named_classes = _read(eg)
    classes = {v: named_classes[k] for v, k in refs.items()}
    node_classes = {n: named_classes[k] for n, k in _tuple_refs(graph).items()}
    named = {r: n for r, n in matches.items() if n}
    return Saturation(egraph, encoding, classes, node_classes,
                      tuple(classes[v] for v in graph.outputs),
                      iterations, stopped, named, len(rules), skipped,
                      time.perf_counter() - start)


def relevant_laws(graph: Graph, laws: Sequence[Law]) -> list[Law]:
    """The laws whose left side can ever match: every (op, attributes) it names occurs in the
    graph or on the right side of a law that can match (a fixpoint). egglog's cost of loading
    a program grows faster than linearly with its rules, so the others are left out."""
    ctx = MatchContext(graph)
    body = [n for n in graph.nodes if not _leaf(n, ctx) and n.op is not Op.SCALAR]
    present = {(n.op, n.attrs) for n in body}
    ops = {n.op for n in body}
    needs = {law.name: _apps(law.src) for law in laws}
    chosen: dict[str, Law] = {}
    changed = True
    while changed:
        changed = False
        for law in laws:
            if law.name in chosen:
                continue
            if all(_available(app, present, ops) for app in needs[law.name]):
                chosen[law.name] = law
                for app in _apps(law.dst):
                    attrs = _literal_or_none(app)
                    present.add((app.op, attrs))
                    ops.add(app.op)
                changed = True
    return [law for law in laws if law.name in chosen]


def _apps(terms: Sequence[Term]) -> list[App]:
    found: list[App] = []
    stack = list(terms)
    while stack:
        t = stack.pop()
        if isinstance(t, App):
            found.append(t)
            stack.extend(t.args)
    return found


def _literal_or_none(app: App) -> Attrs | None:
    try:
        return _literal_attrs(app)
    except UnsupportedLaw:
        return None  # attributes computed when the law fires: any value of this op


def _available(app: App, present: set, ops: set) -> bool:
    attrs = _literal_or_none(app)
    if attrs is None or (app.op, None) in present:
        return app.op in ops
    return (app.op, attrs) in present


# --- kiln graph -> egglog --------------------------------------------------------------------

def _encode_graph(graph: Graph, enc: Encoding) -> tuple[list[str], dict[Value, int]]:
    """One ``(union (Val k) term)`` per node: ``Val k`` names node k's class without a global
    per node (egglog's ``let`` makes a table each, and every iteration visits them all)."""
    lines: list[str] = []
    index: dict[Node, int] = {}
    refs: dict[Value, int] = {}
    ctx = MatchContext(graph)
    for node in graph.all_nodes():
        k = index[node] = len(index)
        if _leaf(node, ctx):
            term = f"(Leaf {len(enc.leaves)})"
            enc.leaves.append(node)
        elif node.op is Op.SCALAR:
            term = f"(Num {_quote(number_text(node.attrs.value))})"  # type: ignore[attr-defined]
        else:
            args = _args([_value_term(v, index) for v in node.inputs])
            term = f"(Op {_quote(node.op.text)} {_quote(enc.attr_key(node.attrs))} {args})"
        lines.append(f"(union (Val {k}) {term})")
        if not _multi(node):
            refs[node.out()] = k
    extra = len(index)
    for node in graph.all_nodes():  # each output of a multi-output op gets a name too
        if _multi(node):
            for i in range(len(node.types)):
                lines.append(f"(union (Val {extra}) (Get {i} (Val {index[node]})))")
                refs[node.out(i)] = extra
                extra += 1
    return lines, refs


def _leaf(node: Node, ctx: MatchContext) -> bool:
    """An input, a weight, or a value computed from weights only: folded at compile time, so
    how it is computed costs nothing at run time."""
    if node.op is Op.INPUT:
        return True
    return node.op is not Op.SCALAR and not _multi(node) and ctx.is_weight_only(node.out())


def _multi(node: Node) -> bool:
    return node.op in MULTI_OUTPUT or len(node.types) > 1


def _value_term(value: Value, index: dict[Node, int]) -> str:
    ref = f"(Val {index[value.node]})"
    return f"(Get {value.index} {ref})" if _multi(value.node) else ref


def _args(items: Sequence[str]) -> str:
    text = "(Nil)"
    for item in reversed(items):
        text = f"(Cons {item} {text})"
    return text


def _quote(text: str) -> str:
    return json.dumps(text)


# --- laws -> egglog rewrites -----------------------------------------------------------------

def egglog_rule(law: Law, enc: Encoding) -> str:
    """The law as an egglog ``rewrite``; UnsupportedLaw where egglog cannot state it."""
    if len(law.src) != 1 or not isinstance(law.src[0], App):
        raise UnsupportedLaw("one op application on the left side is needed")
    numbers = set()
    for cond in law.when:
        if cond.kind is not CondKind.NUMBER:
            raise UnsupportedLaw(f"the condition ({cond.kind.text} ...) is not expressible")
        numbers.add(cond.args[0].name)
    src = _term(law.src[0], enc, numbers)
    dst = _term(law.dst[0], enc, numbers)
    return f"(rule ((= lhs {src})) ((union lhs {dst})) :name {_quote(law.name)})"


def _term(term: Term, enc: Encoding, numbers: set[str]) -> str:
    if isinstance(term, PVar):
        return f"(Num ?{_var(term.name)})" if term.name in numbers else f"?{_var(term.name)}"
    if isinstance(term, Lit):
        return f"(Num {_quote(number_text(term.value))})"
    if not isinstance(term, App):
        raise UnsupportedLaw("compile-time functions are not expressible")
    attrs = _literal_attrs(term)
    args = _args([_term(a, enc, numbers) for a in term.args])
    text = f"(Op {_quote(term.op.text)} {_quote(enc.attr_key(attrs))} {args})"
    return f"(Get {term.output} {text})" if term.op in MULTI_OUTPUT else text


def _var(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _literal_attrs(term: App) -> Attrs:
    values = {}
    for key, value in term.attrs:
        if _has_variable(value):
            raise UnsupportedLaw(f":{key} is not a literal value")
        values[key] = value
    try:
        return attrs_class_of(term.op)(**values)
    except TypeError as err:
        raise UnsupportedLaw(f"{term.op.text} attributes: {err}") from None


def _has_variable(value: Any) -> bool:
    if isinstance(value, tuple):
        return any(_has_variable(v) for v in value)
    return isinstance(value, (PVar, AttrFn))


def _commutations(graph: Graph) -> list[str]:
    ops = sorted({n.op for n in graph.nodes if n.op.is_a(OpGroup.COMMUTATIVE)},
                 key=lambda o: o.text)
    return [f"(rule ((= lhs (Op {_quote(op.text)} ?a (Cons ?x (Cons ?y (Nil))))))"
            f" ((union lhs (Op {_quote(op.text)} ?a (Cons ?y (Cons ?x (Nil))))))"
            f" :name {_quote('commute.' + op.text)})" for op in ops]


# --- egglog -> e-graph -----------------------------------------------------------------------

def _size(eg: egglog.EGraph) -> int:
    out = _egglog(eg, "(print-size)")
    return sum(n for name, n in out[0].sizes if name in ("Op", "Cons", "Get"))


_KINDS = ("Val", "Leaf", "Num", "Get", "Op", "Cons", "Nil")


def _read(eg: egglog.EGraph) -> tuple[dict[str, EClass], dict[int, str]]:
    """The e-graph's classes of T and Args, and the class each ``Val k`` is in."""
    data = json.loads(eg.serialize([]).to_json())
    nodes = data["nodes"]
    classes: dict[str, EClass] = {}
    named: dict[int, str] = {}
    for node in nodes.values():
        op = node["op"]
        if op not in _KINDS:
            continue  # a primitive (an i64 or a String): read through its parent
        kids = node["children"]
        prims = tuple(json.loads(nodes[k]["op"]) for k in kids if nodes[k]["op"] not in _KINDS)
        refs = tuple(nodes[k]["eclass"] for k in kids if nodes[k]["op"] in _KINDS)
        if op == "Val":
            named[prims[0]] = node["eclass"]
            continue  # a name, not a computation
        enode = ENode(op.lower(), prims, refs)
        classes.setdefault(node["eclass"], EClass(node["eclass"], [])).nodes.append(enode)
    return classes, named


def _tuple_refs(graph: Graph) -> dict[Node, int]:
    """The ``Val`` index of each multi-output node (its position among the nodes)."""
    return {node: k for k, node in enumerate(graph.all_nodes()) if _multi(node)}
