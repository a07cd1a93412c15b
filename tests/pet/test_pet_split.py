"""Subprograms: multi-linear ops only, at most max_ops, convex, one contraction each."""

from __future__ import annotations

import torch

from kiln.ir.attrs import ConvActAttrs, SoftmaxAttrs
from kiln.ir.builder import GraphBuilder
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.pet.split import split_program


def _graph():
    """mm -> add -> mul -> softmax -> mm -> add, with a side read of the first add."""
    gen = torch.Generator().manual_seed(0)
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 8), DType.F32))
    w1 = b.constant("w1", torch.randn(8, 8, generator=gen))
    w2 = b.constant("w2", torch.randn(8, 8, generator=gen))
    h = b.op(Op.ADD, b.op(Op.MM, x, w1), x)
    scaled = b.op(Op.MUL, h, b.scalar(0.5))
    s = b.op(Op.SOFTMAX, scaled, attrs=SoftmaxAttrs(1))
    out = b.op(Op.ADD, b.op(Op.MM, s, w2), h)
    return b.build(out)


def test_subprograms_stop_at_non_linear_ops_and_keep_their_outside_readers():
    graph = _graph()
    subs = split_program(graph)
    assert [[n.op for n in s.nodes] for s in subs] == [[Op.MM, Op.ADD, Op.MUL],
                                                        [Op.MM, Op.ADD]]
    first = subs[0]
    # the add is read by the last add outside the subprogram: it is an output too
    assert [v.node.op for v in first.outputs] == [Op.ADD, Op.MUL]
    inputs = [torch.randn(4, 8)]
    env = interpret(graph.replace(outputs=[*first.outputs]), inputs)
    standalone = interpret(first.graph, [inputs[0] if v.node.op is Op.INPUT
                                         else graph.constant(v.node) for v in first.inputs])
    for a, b in zip(env, standalone):
        assert torch.equal(a, b)


def test_max_ops_bounds_a_subprogram():
    subs = split_program(_graph(), max_ops=2)
    assert all(len(s.nodes) <= 2 for s in subs)
    assert [n.op for n in subs[0].nodes] == [Op.MM, Op.ADD]


def test_a_fused_activation_closes_the_subprogram():
    gen = torch.Generator().manual_seed(0)
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 5, 5), DType.F32))
    w = b.constant("w", torch.randn(2, 2, 3, 3, generator=gen))
    attrs = ConvActAttrs((1, 1), (1, 1), (1, 1), 1, False, False, Op.RELU)
    y = b.op(Op.CONV_ACT, x, w, attrs=attrs)
    graph = b.build(b.op(Op.ADD, y, x))
    (sub,) = split_program(graph)
    assert [n.op for n in sub.nodes] == [Op.CONV_ACT]


def test_a_subprogram_never_wraps_around_an_outside_path():
    """mm -> add(mm, relu(mm)): taking the add would make the subprogram non-convex."""
    gen = torch.Generator().manual_seed(0)
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 8), DType.F32))
    y = b.op(Op.MM, x, b.constant("w", torch.randn(8, 8, generator=gen)))
    graph = b.build(b.op(Op.ADD, y, b.op(Op.RELU, y)))
    (sub,) = split_program(graph)
    assert [n.op for n in sub.nodes] == [Op.MM]
