"""The reference run of a case: the interpreter's value of every node, and a float64 twin.

* `trace_values` runs the graph as `kiln.ir.interp.interpret` does, keeping every value: the
  fuzzer needs the layout eager mode gives each intermediate (`kiln.fuzz.exactness`) and the
  shrinker cuts graphs at intermediates.
* `widened` is the same graph computed in float64 (float inputs, weights, fills and casts
  widened). Where the graph's own precision and float64 disagree on whether an element is
  NaN, infinite or finite, or by much, that element is ill-conditioned: it depends on how
  sums round and overflow, and any change of rounding may flip it (`kiln.fuzz.compare`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from kiln.ir import attrs as A
from kiln.ir.graph import Graph, Node, Value, make_input
from kiln.ir.infer import infer_types
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType

NARROW_FLOATS = frozenset({DType.F32, DType.F16, DType.BF16})


def trace_values(graph: Graph, inputs: Sequence[torch.Tensor]) -> dict[Value, Any]:
    """Every value of ``graph`` on ``inputs``, as the reference interpreter computes it."""
    env: dict[Value, Any] = {node.out(): x for node, x in zip(graph.inputs, inputs)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for node in graph.nodes:
            results = evaluate_node(node, [env[v] for v in node.inputs], graph)
            env.update(zip(node.outputs, results))
    return env


def widened(graph: Graph) -> Graph:
    """``graph`` with every narrow float type (f32, f16, bf16) made float64."""
    rebuilt: dict[Node, Node] = {}
    inputs = []
    for node in graph.inputs:
        new = make_input(node.attrs.index, node.name, _wide(node.type))  # type: ignore[attr-defined]
        rebuilt[node] = new
        inputs.append(new)
    nodes = []
    constants = {k: _wide_tensor(t) for k, t in graph.constants.items()}
    for node in graph.nodes:
        operands = tuple(Value(rebuilt[v.node], v.index) for v in node.inputs)
        attrs = _wide_attrs(node.attrs)
        if node.op in (Op.CONSTANT, Op.SCALAR):
            types = tuple(_wide(t) for t in node.types)
        else:
            types = infer_types(node.op, attrs, operands)
        new = Node(node.op, operands, attrs, types, node.name)
        rebuilt[node] = new
        nodes.append(new)
    outputs = [Value(rebuilt[v.node], v.index) for v in graph.outputs]
    return Graph(inputs, nodes, outputs, constants, graph.device)


def _wide(t: TensorType) -> TensorType:
    return TensorType(t.shape, DType.F64) if t.dtype in NARROW_FLOATS else t


def _wide_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def _wide_attrs(attrs: A.Attrs) -> A.Attrs:
    if isinstance(attrs, (A.CastAttrs, A.FullAttrs, A.ArangeAttrs)) \
            and attrs.dtype in NARROW_FLOATS:
        return dataclasses.replace(attrs, dtype=DType.F64)
    return attrs


def wide_values(graph: Graph, inputs: Sequence[torch.Tensor]) -> dict[Value, Any] | None:
    """The float64 twin's value of every value of ``graph`` (keyed by ``graph``'s values), or
    None where the twin cannot run."""
    try:
        wide = widened(graph)
        env = trace_values(wide, [_wide_tensor(x) for x in inputs])
    except Exception:  # noqa: BLE001 - no twin: every element counts as well-conditioned
        return None
    return {v: env[Value(w, v.index)] for n, w in zip(graph.all_nodes(), wide.all_nodes())
            for v in n.outputs}


def ill_conditioned(value: Any, wide: Any) -> bool:
    """Do the reference's value and its float64 twin's disagree anywhere on being NaN,
    infinite or finite (at the value's precision)? Then its float32 result already depends
    on rounding and overflow."""
    if not isinstance(value, torch.Tensor) or not isinstance(wide, torch.Tensor) or \
            not value.is_floating_point() or value.shape != wide.shape:
        return False
    rounded = wide.to(value.dtype)
    return not (torch.equal(value.isnan(), rounded.isnan())
                and torch.equal(value.isposinf(), rounded.isposinf())
                and torch.equal(value.isneginf(), rounded.isneginf()))


def type_gaps(graph: Graph, values: dict[Value, Any]) -> list[str]:
    """Values whose run-time type differs from the type the IR declares (which kiln infers
    with ATen's meta kernels): every pass and the memory plan trust the declared one."""
    gaps = []
    for node in graph.nodes:
        for v in node.outputs:
            if _known_gap(v):
                continue
            t = values.get(v)
            if isinstance(t, torch.Tensor) and (tuple(t.shape) != v.type.shape
                                                 or t.dtype != v.type.dtype.torch):
                actual = TensorType(tuple(t.shape), DType.from_torch(t.dtype))
                gaps.append(f"{v} ({node.op.text}) is declared {v.type}; the reference "
                            f"computes {actual}")
    return gaps


def _known_gap(v: Value) -> bool:
    """Excluded, reported: ATen's meta kernel says layer_norm's mean and rstd are float32
    for a half-precision input, its CPU kernel returns them in the input's type (the
    generator never reads them)."""
    node = v.node
    return node.op is Op.LAYER_NORM and v.index > 0 and \
        node.inputs[0].type.dtype in (DType.F16, DType.BF16)

