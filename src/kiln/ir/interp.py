"""The reference interpreter: runs a graph op by op on torch tensors.

It is deliberately simple (no memory planning, no fusion) because it is the oracle that every
optimized form of a graph is compared against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.semantics import lower_node, run_call


def evaluate_node(node: Node, operands: Sequence[Any], graph: Graph) -> tuple[Any, ...]:
    """The outputs of one non-input node, given its operands' values."""
    if node.op is Op.CONSTANT:
        return (graph.constant(node),)
    if node.op is Op.SCALAR:
        return (node.attrs.value,)  # type: ignore[attr-defined]
    return run_call(lower_node(node), operands, graph.device)


def interpret(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``graph`` on ``inputs``; returns the outputs in order."""
    if len(inputs) != len(graph.inputs):
        raise TypeError(f"graph takes {len(graph.inputs)} inputs, {len(inputs)} given")
    env: dict[Value, Any] = {node.out(): x for node, x in zip(graph.inputs, inputs)}
    for node in graph.nodes:
        results = evaluate_node(node, [env[v] for v in node.inputs], graph)
        for i, result in enumerate(results):
            env[node.out(i)] = result
    return [env[v] for v in graph.outputs]
