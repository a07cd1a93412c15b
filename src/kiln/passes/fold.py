"""Constant folding: compute at compile time what depends only on weights and literals.

    before                                          after
    %w = constant {name='fc.weight'} : f32[4, 16]   %w_t = constant {name='fold.permute'}
    %t = permute(%w) {dims=(1, 0)} : f32[16, 4]         : f32[16, 4]
    %y = mm(%x, %t) : f32[8, 4]                     %y = mm(%x, %w_t) : f32[8, 4]

Whole subgraphs fold, since a folded node is itself a constant for its users: a weight's
transpose becomes a constant the GEMM reads directly. Random ops are never folded; no view
is folded whose result would be much larger than what it is computed from (an expand of a
bias to a full activation stays an expand), and no computed result above 4 MiB.
A folded view keeps its strides: GEMM reads a transposed weight view at least as fast as a
transposed copy (measured: 64x784 @ 784x2048, 1.53 ms as a view vs 1.85 ms as a copy).
"""

from __future__ import annotations

import torch

from kiln.ir import calls
from kiln.ir.graph import Graph, Node, Value, make_constant, transform
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op, OpGroup
from kiln.ir.shared import shared
from kiln.options import Options

_MAX_GROWTH_BYTES = 1 << 16  # a folded view may exceed its sources by this much
# ... and a computed result (made on every call where it is not folded: HF T5's relative
# position buckets, 15 ops on [128, 128] before the bias's embedding; BERT's token-type
# embedding of a zeros buffer) up to this size
_MAX_COMPUTED_BYTES = 1 << 22


def _weight_only(value: Value) -> bool:
    """A constant, a number, or a view of them left unfolded (an expand that would grow):
    what an op reading it computes is still known at compile time (BEiT's relative position
    index: where(mask, expand(c), c') in a chain of 22, made on every call before)."""
    node = value.node
    if node.op in (Op.CONSTANT, Op.SCALAR):
        return True
    return node.op.is_a(OpGroup.VIEW) and calls.is_pure(node) and all(
        _weight_only(v) for v in node.inputs)


def _foldable(node: Node, inputs: tuple[Value, ...]) -> bool:
    if node.op.is_a(OpGroup.SOURCE):
        return False
    if not calls.is_pure(node) or not node.types:
        return False
    if not all(_weight_only(v) for v in inputs):
        return False
    if not any(v.node.op is Op.CONSTANT for v in inputs) and not node.op.is_a(OpGroup.CREATION):
        return False  # numbers only: ATen has no op on two Python numbers
    source_bytes = sum(v.type.nbytes for v in inputs if v.node.op is Op.CONSTANT)
    result_bytes = sum(t.nbytes for t in node.types)
    if result_bytes <= source_bytes + _MAX_GROWTH_BYTES:
        return True
    # a view costs nothing at run time and an expanded copy would (a bias expanded to an
    # activation's shape stays an expand); anything else computes its result on every call
    return not node.op.is_a(OpGroup.VIEW) and result_bytes <= _MAX_COMPUTED_BYTES


def fold_constants(graph: Graph, options: Options | None = None) -> Graph:
    constants = dict(graph.constants)

    def operand(value: Value) -> object:
        node = value.node
        if node.op is Op.SCALAR:
            return node.attrs.value  # type: ignore[attr-defined]
        if node.op is Op.CONSTANT:
            return constants[node.attrs.name]  # type: ignore[attr-defined]
        with torch.no_grad():  # an unfolded view of constants (`_weight_only`)
            return evaluate_node(node, [operand(v) for v in node.inputs], graph)[value.index]

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if not _foldable(node, inputs):
            return None
        args = [operand(v) for v in inputs]

        def evaluate() -> tuple[object, ...]:
            with torch.no_grad():
                return evaluate_node(node, args, graph)
        # (the tensors an earlier compile of the model folded, where made from the same
        # weights: a graph compiled once per input shape keeps one copy of them)
        results = shared((node.op, repr(node.attrs), node.types, graph.device), args, evaluate)
        folded = []
        for i, result in enumerate(results):
            name = _fresh(constants, f"fold.{node.name}" + (f".{i}" if len(results) > 1 else ""))
            constants[name] = result
            folded.append(make_constant(name, constants[name], label=node.name).out())
        return folded

    result = transform(graph, rewrite)
    if result is graph:
        return graph
    used = {n.attrs.name for n in result.nodes if n.op is Op.CONSTANT}  # type: ignore[attr-defined]
    return result.replace(constants={k: v for k, v in constants.items() if k in used})


def _fresh(taken: dict[str, object], name: str) -> str:
    candidate, k = name, 0
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    return candidate
