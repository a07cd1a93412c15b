"""Builders of small lowered programs and an oracle check for the schedule tests."""

from __future__ import annotations

import torch

from kiln.ir import attrs as A
from kiln.ir.builder import GraphBuilder
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.tir.compact import compact_buffers
from kiln.tir.interp import run_torch
from kiln.tir.lower import Lowered, lower_chain

F32 = DType.F32


def mm(m: int = 10, n: int = 12, k: int = 6):
    b = GraphBuilder()
    x = b.input("A", TensorType((m, k), F32))
    y = b.input("B", TensorType((k, n), F32))
    out = b.op(Op.MM, x, y)
    return b.build(out), lower_chain([out.node])


def add_relu(m: int = 4, n: int = 6):
    b = GraphBuilder()
    x = b.input("x", TensorType((m, n), F32))
    y = b.input("y", TensorType((1, n), F32))
    s = b.op(Op.ADD, x, y)
    r = b.op(Op.RELU, s)
    return b.build(r), lower_chain([s.node, r.node], [r])


def row_sum(m: int = 5, n: int = 7):
    b = GraphBuilder()
    x = b.input("x", TensorType((m, n), F32))
    s = b.op(Op.SUM, x, attrs=A.ReduceAttrs((1,)))
    return b.build(s), lower_chain([s.node])


def check_same(graph, lowered: Lowered, func=None, seed: int = 0) -> None:
    """The (scheduled) function computes what kiln's ATen interpreter computes."""
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(n.type.shape, generator=gen) for n in graph.inputs]
    expected = interpret(graph, inputs)
    by_value = dict(zip([n.out() for n in graph.inputs], inputs))
    got = run_torch(compact_buffers(func or lowered.func), [by_value[v] for v in lowered.inputs])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
