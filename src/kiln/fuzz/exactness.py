"""How exactly each output of a compiled graph must match the reference: what was done to it.

A compiled graph is bit-identical to the interpreter except where something that rounds
differently ran: a rewrite rule tagged ``ieee`` (or ``fast_math``), a generated or prepacked
kernel, a convolution moved to channels-last, or a layout-sensitive ATen kernel (``exp``,
``sum``, ``mm`` ...: vectorized and scalar loops round differently, sums follow memory order)
reading or writing a value whose memory layout differs from eager mode's (the memory plan
and kernels write contiguous buffers where eager would keep a transposed input's strides).
Those nodes are *rounded*; the strength of each value follows from the original graph's data
flow:

    EXACT      nothing rounded differently upstream: compared bit for bit
    CLOSE      a rounded node upstream: compared up to rounding (`kiln.fuzz.compare`)
    NEAR       CLOSE, and a sum rounded (or a max/min computed another way): the signs of
               zeros and which non-finite value a sum of infinities ends in are conventions
    UNCHECKED  upstream, a discontinuous op read a rounded value (``gt(x*(1/3), y)`` may flip
               where ``gt(x/3, y)`` does not, ``floor`` jumps, ``log`` of a rounded zero is
               -inf or finite), or a ``fast_math`` rule fired: the values are not compared,
               only types

Rounded nodes are found by name: rules give their new nodes the rewritten root's name, and
kernels report the names of the nodes they cover. A name that the original graph does not
know makes every node rounded (never a false "exact").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.engine import CompiledGraph
from kiln.fuzz.compare import Strength
from kiln.ir import attrs as A
from kiln.ir import calls
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.ir.types import DType
from kiln.options import Options
from kiln.passes.pipeline import run_pipeline
from kiln.rewrite.pattern import Siblings
from kiln.rewrite.rule import Safety
from kiln.rules import ALL_RULES
from kiln.search.rules import shipped_generated_rules

_CONVS = frozenset({Op.CONVOLUTION, Op.CONV_ACT})

# Rules tagged ieee whose results differ by more than rounding on some inputs (kiln bugs the
# fuzzer found, reported, not fixed here): their results are not compared, as fast_math ones.
UNSOUND_RULES: dict[str, str] = {
    "scale-into-matmul": "(a@b)*s -> (a*s)@b: a*s overflows to inf where a@b*s does not, "
                         "and inf times a zero of b is NaN (2*3.4e38 in a, 0 in b)",
    "scale-into-addmm": "addmm(b, x, W)*s -> addmm(b*s, x, W*s): the same move of a scale "
                        "before the sum (W*s may overflow where the product does not)",
}

# a rounding-level change of an operand can change these ops' results by more than rounding
DISCONTINUOUS = frozenset({
    Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.ARGMAX, Op.ARGMIN, Op.FLOOR, Op.CEIL,
    Op.LOGICAL_NOT, Op.LOGICAL_AND, Op.LOGICAL_OR, Op.WHERE, Op.MAX_POOL2D,
    Op.DIV, Op.RECIPROCAL, Op.RSQRT, Op.SQRT, Op.LOG, Op.POW,  # a pole or a domain edge
    Op.CAST,  # to an integer type: truncation jumps
})
# ATen rounds these differently in its vectorized and scalar loops, or sums in memory order:
# their bits depend on the layout of their operands and result
LAYOUT_SENSITIVE = frozenset({
    Op.EXP, Op.LOG, Op.TANH, Op.SIGMOID, Op.GELU, Op.SIN, Op.COS, Op.ERF, Op.POW,
    Op.RSQRT,  # bfloat16: 1 ulp apart (704 -> 0.03784 strided, 0.03760 dense; seed 5, 33973)
    Op.SUM, Op.MEAN, Op.VAR, Op.SOFTMAX, Op.LOG_SOFTMAX, Op.LAYER_NORM, Op.BATCH_NORM,
    Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT, Op.CONVOLUTION, Op.CONV_ACT, Op.AVG_POOL2D,
    Op.ADAPTIVE_AVG_POOL2D, Op.CALL, Op.MAXIMUM, Op.MINIMUM,
})
# sums: computed another way, an exact zero result may take the other sign
SUMS = frozenset({
    Op.SUM, Op.MEAN, Op.VAR, Op.SOFTMAX, Op.LOG_SOFTMAX, Op.LAYER_NORM, Op.BATCH_NORM,
    Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT, Op.CONVOLUTION, Op.CONV_ACT, Op.AVG_POOL2D,
    Op.ADAPTIVE_AVG_POOL2D, Op.CALL,
})
# max(+0.0, -0.0): ATen's vectorized loop gives one zero, its scalar loop the other
MAX_MIN = frozenset({Op.MAXIMUM, Op.MINIMUM})
# their result has the same layout whatever their operands' layouts
LAYOUT_RESETS = frozenset({Op.CLONE, Op.TO_LAYOUT, Op.FULL, Op.ARANGE, Op.CONSTANT, Op.SCALAR})


@dataclass
class Rounding:
    """What a compiled graph computes differently from the interpreter, by original node name."""

    rounded: set[str] = field(default_factory=set)  # other rounding (rule, kernel, layout)
    fast: set[str] = field(default_factory=set)  # rewritten by a fast_math rule
    relaid: set[str] = field(default_factory=set)  # written in another memory layout


def rounding_of(graph: Graph, compiled: CompiledGraph, options: Options,
                eager: Mapping[Value, Any]) -> Rounding:
    """Which nodes of ``graph`` ``compiled`` computes differently; ``eager`` holds the
    reference's value of every node (for the layouts eager mode gives them)."""
    found = Rounding()
    fired = compiled.report.rules_fired()
    rules = {r.name: r for r in ALL_RULES + shipped_generated_rules() if r.name in fired}
    if rules:
        _, records, _ = run_pipeline(graph, options, trace_rules=rules)
        for record in records:
            for event in record.trace:
                if not event.fired:
                    continue
                rule = rules[event.rule]
                names = _sibling_names(graph, rule.pattern) \
                    if isinstance(rule.pattern, Siblings) else {event.node}
                if rule.safety is Safety.EXACT:
                    # the same bits, maybe in another layout: x + (-0.0) -> x hands on x's
                    # strides where the add made a fresh dense tensor
                    found.relaid.update(names)
                elif rule.safety is Safety.FAST_MATH or rule.name in UNSOUND_RULES:
                    found.fast.update(names)
                else:
                    found.rounded.update(names)
    written: set[str] = set()  # values kiln writes into memory it allocates itself
    for kernel in compiled.report.kernels:
        if kernel.kind != "library":
            found.rounded.update(kernel.nodes)
            written.update(kernel.nodes)
        if kernel.kind == "prepacked":  # the library chooses its output's layout
            found.relaid.update(kernel.nodes)
    if compiled.plan is not None:
        written.update(v.node.name for v in compiled.plan.offsets)
    # the layout pass adds conversions when it moves convolutions (those of weights are then
    # folded away, so the final graph may show none)
    if any(p.name == "layout" and p.nodes_after != p.nodes_before
           for p in compiled.report.passes):
        convs = {n.name for n in graph.nodes if n.op in _CONVS}
        found.rounded |= convs
        found.relaid |= convs
    by_name = {n.name: n for n in graph.nodes}
    for name in written:
        node = by_name.get(name)
        if node is None:
            found.relaid |= set(by_name)
        elif any(not _dense(eager.get(v)) for v in node.outputs):
            found.relaid.add(name)
    return found


def _dense(value: Any) -> bool:
    return not isinstance(value, torch.Tensor) or value.is_contiguous()


def _sibling_names(graph: Graph, pattern: Siblings) -> set[str]:
    roots = pattern.root_ops() or frozenset()
    return {n.name for n in graph.nodes if n.op in roots}


def strengths(graph: Graph, rounding: Rounding) -> dict[Value, Strength]:
    """The comparison strength of every value of ``graph``."""
    known = {n.name for n in graph.all_nodes()}
    named = rounding.rounded | rounding.fast | rounding.relaid
    everything = not named <= known
    rounding = _merged(graph, rounding)
    result: dict[Value, Strength] = {v: Strength.EXACT for n in graph.inputs for v in n.outputs}
    relaid: set[Value] = set()  # values whose memory layout differs from eager mode's
    for node in graph.nodes:
        upstream = max((result[v] for v in node.inputs), default=Strength.EXACT)
        moved = node.name in rounding.relaid or (
            node.op not in LAYOUT_RESETS and any(v in relaid for v in node.inputs))
        if moved:
            relaid.update(node.outputs)
        strength = upstream
        if node.name in rounding.fast:
            strength = Strength.UNCHECKED
        elif (moved or node.name in rounding.rounded) and _loop_dependent(node):
            strength = Strength.UNCHECKED
        elif node.op not in (Op.CONSTANT, Op.SCALAR) and (
                everything or node.name in rounding.rounded
                or (moved and node.op in LAYOUT_SENSITIVE)):
            near = node.op in SUMS or node.op in MAX_MIN
            strength = max(strength, Strength.NEAR if near else Strength.CLOSE)
        if Strength.CLOSE <= strength < Strength.UNCHECKED and _discontinuous(node, result):
            strength = Strength.UNCHECKED
        for v in node.outputs:
            result[v] = strength
    return result


def _loop_dependent(node: Node) -> bool:
    """ATen's vectorized and scalar loops of this op differ by more than rounding, so its
    values computed another way (another layout, a generated kernel) are not compared:
    * the erf form of GELU is NaN at inf vectorized (inf in the scalar loop), inf at 3.4e38,
      and 25% off at -5.0;
    * pow with a number exponent that is 0 or inf in the tensor's type: (-0.0) ** 1e-300 is
      1.0 vectorized (the exponent rounded to float32 first) and 0.0 in the scalar loop."""
    if node.op is Op.GELU:
        return node.attrs.approximate == "none"  # type: ignore[attr-defined]
    if node.op is Op.POW and node.inputs[1].node.op is Op.SCALAR:
        exponent = node.inputs[1].node.attrs.value  # type: ignore[attr-defined]
        dtype = node.inputs[0].type.dtype
        if dtype.is_floating and dtype is not DType.F64 and isinstance(exponent, float):
            narrow = torch.tensor(exponent, dtype=torch.float64).to(dtype.torch).item()
            return exponent != 0 and (narrow == 0 or math.isinf(narrow))
    return False


def _merged(graph: Graph, rounding: Rounding) -> Rounding:
    """``rounding`` with every node that common-subexpression elimination merges with a
    named one named too: the kernel computes the merged value for both."""
    first: dict[tuple[object, ...], Node] = {}
    members: dict[Node, set[str]] = {}
    same: dict[Node, Node] = {}  # node -> the first node structurally equal to it
    for node in graph.all_nodes():
        if node.op in (Op.INPUT, Op.CONSTANT) or not calls.is_pure(node):
            same[node] = node
            continue
        key = (node.op, tuple((same[v.node], v.index) for v in node.inputs), node.attrs,
               node.types)
        same[node] = first.setdefault(key, node)
        members.setdefault(same[node], set()).add(node.name)
    groups = [names for names in members.values() if len(names) > 1]
    if not groups:
        return rounding

    def widen(names: set[str]) -> set[str]:
        return names.union(*(g for g in groups if g & names))
    return Rounding(widen(rounding.rounded), widen(rounding.fast), widen(rounding.relaid))


def _discontinuous(node: Node, result: dict[Value, Strength]) -> bool:
    """Does a rounded float operand reach a discontinuity of the node?"""
    if node.op in (Op.BATCH_NORM, Op.LAYER_NORM) and node.attrs.eps == 0:  # type: ignore
        # a pole where the variance is 0: rsqrt(0) = inf times the rounding of x - mean,
        # so a 1-ulp change of x turns -inf into NaN (fuzz seed 5, graph 19699)
        return any(result[v] is not Strength.EXACT for v in node.inputs)
    if node.op not in DISCONTINUOUS:
        return False
    if node.op is Op.CAST:
        assert isinstance(node.attrs, A.CastAttrs)
        if node.attrs.dtype.is_floating:
            return False
    if node.op is Op.WHERE:  # the condition only; the branches are selected, not computed
        return result[node.inputs[0]] is not Strength.EXACT
    operands = node.inputs
    if node.op is Op.DIV and node.attrs.rounding_mode is None:  # type: ignore[attr-defined]
        operands = node.inputs[1:]  # the pole is in the divisor only
    rounded_operand = any(result[v] is not Strength.EXACT and v.type.dtype.is_floating
                          for v in operands)
    return rounded_operand or node.op.is_a(OpGroup.COMPARISON) and any(
        result[v] is not Strength.EXACT for v in node.inputs)
