"""The reference interpreter against eager PyTorch: hand-built graphs and every quick zoo model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.ir import GraphBuilder, Op, TensorType, interpret, verify
from kiln.ir import attrs as A
from kiln.ir.types import DType

aten = torch.ops.aten
F32 = DType.F32


def _t(*shape: int, dtype: DType = F32) -> TensorType:
    return TensorType(shape, dtype)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert support.relative_error(actual, expected) < 1e-6


def test_linear_layer_norm_softmax() -> None:
    torch.manual_seed(0)
    w, bias = torch.randn(8, 16), torch.randn(8)
    gamma, beta = torch.randn(8), torch.randn(8)
    b = GraphBuilder()
    x = b.input("x", _t(4, 16))
    t = b.op(Op.PERMUTE, b.constant("fc.weight", w), attrs=A.PermuteAttrs((1, 0)))
    y = b.op(Op.ADDMM, b.constant("fc.bias", bias), x, t, attrs=A.AddmmAttrs())
    ln = b.node(Op.LAYER_NORM, y, b.constant("g", gamma), b.constant("b", beta),
                attrs=A.LayerNormAttrs((8,), 1e-5))
    act = b.op(Op.GELU, ln.out(0), attrs=A.GeluAttrs("tanh"))
    parts = b.node(Op.SPLIT, act, attrs=A.SplitAttrs((3, 5), 1))
    sm = b.op(Op.SOFTMAX, parts.out(1), attrs=A.SoftmaxAttrs(1))
    graph = b.build(parts.out(0), sm, ln.out(1), ln.out(2))
    verify(graph)

    xv = torch.randn(4, 16)
    h = F.linear(xv, w, bias)
    ref = F.gelu(F.layer_norm(h, (8,), gamma, beta, 1e-5), approximate="tanh")
    mean = h.mean(1, keepdim=True)
    rstd = torch.rsqrt(h.var(1, correction=0, keepdim=True) + 1e-5)
    out = interpret(graph, [xv])
    _close(out[0], ref[:, :3])
    _close(out[1], torch.softmax(ref[:, 3:], 1))
    _close(out[2], mean)
    _close(out[3], rstd)


def test_convolution_block() -> None:
    torch.manual_seed(0)
    w, cb = torch.randn(4, 3, 3, 3), torch.randn(4)
    stats = [torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4) + 0.5]
    b = GraphBuilder()
    x = b.input("x", _t(2, 3, 8, 8))
    conv = b.op(Op.CONVOLUTION, x, b.constant("w", w), b.constant("cb", cb),
                attrs=A.ConvAttrs((1, 1), (1, 1), (1, 1), False, (0, 0), 1))
    bn_w, bn_b, mean, var = (b.constant(f"bn{i}", s) for i, s in enumerate(stats))
    bn = b.op(Op.BATCH_NORM, conv, bn_w, bn_b, mean, var, attrs=A.BatchNormAttrs(1e-5))
    r = b.op(Op.CLAMP, bn, attrs=A.ClampAttrs(0.0, 6.0))
    pool = b.node(Op.MAX_POOL2D, r, attrs=A.MaxPoolAttrs((2, 2), (2, 2), (0, 0), (1, 1), False))
    avg = b.op(Op.AVG_POOL2D, r, attrs=A.AvgPoolAttrs((3, 3), (2, 2), (1, 1), True, False, None))
    gap = b.op(Op.ADAPTIVE_AVG_POOL2D, pool.out(0), attrs=A.AdaptivePoolAttrs((1, 1)))
    flat = b.op(Op.VIEW, gap, attrs=A.ShapeAttrs((2, 4)))
    graph = b.build(flat, pool.out(1), avg)
    verify(graph)

    xv = torch.randn(2, 3, 8, 8)
    h = F.batch_norm(F.conv2d(xv, w, cb, padding=1), stats[2], stats[3], stats[0], stats[1],
                     training=False, eps=1e-5).clamp(0.0, 6.0)
    values, indices = F.max_pool2d(h, 2, 2, return_indices=True)
    out = interpret(graph, [xv])
    _close(out[0], F.adaptive_avg_pool2d(values, 1).view(2, 4))
    assert torch.equal(out[1], indices)
    _close(out[2], F.avg_pool2d(h, 3, 2, 1, ceil_mode=True, count_include_pad=False))


def test_scalars_follow_aten_promotion_and_ieee_rules() -> None:
    b = GraphBuilder()
    x = b.input("x", _t(6))
    i = b.input("i", _t(6, dtype=DType.I64))
    outs = [
        b.op(Op.ADD, x, b.scalar(-0.0)),
        b.op(Op.MUL, x, b.scalar(math.inf)),
        b.op(Op.MUL, x, b.scalar(math.nan)),
        b.op(Op.POW, x, b.scalar(2)),  # aten.pow.Tensor_Scalar
        b.op(Op.POW, b.scalar(2.0), x),  # aten.pow.Scalar
        b.op(Op.MUL, i, b.scalar(1.5)),  # int tensor * float number -> f32
        b.op(Op.MUL, i, b.scalar(3)),  # stays i64
        b.op(Op.DIV, i, b.scalar(4), attrs=A.DivAttrs("floor")),
        b.op(Op.GE, x, b.scalar(0.0)),
        b.op(Op.FULL, attrs=A.FullAttrs((3,), -0.0, F32)),
        b.op(Op.ARANGE, attrs=A.ArangeAttrs(1, 7, 2, DType.I32)),
    ]
    graph = b.build(*outs)
    verify(graph)
    xv = torch.tensor([-0.0, 0.0, -1.5, 2.0, math.inf, -3.0])
    iv = torch.tensor([-7, -1, 0, 1, 5, 9])
    expected = [xv + -0.0, xv * math.inf, xv * math.nan, xv ** 2, 2.0 ** xv, iv * 1.5, iv * 3,
                torch.div(iv, 4, rounding_mode="floor"), xv >= 0.0, torch.full((3,), -0.0),
                torch.arange(1, 7, 2, dtype=torch.int32)]
    for actual, e in zip(interpret(graph, [xv, iv]), expected, strict=True):
        support.assert_identical(actual, e)


def test_opaque_calls_run_the_original_aten_op() -> None:
    b = GraphBuilder()
    x = b.input("x", _t(4, 6))
    y = b.input("y", _t(6, 3))

    def call(target: object, *args: object, **kwargs: object) -> A.CallAttrs:
        return A.CallAttrs(target, args, tuple(kwargs.items()))

    cum = b.op(Op.CALL, x, attrs=call(aten.cumsum.default, A.Operand(0), 1, dtype=torch.float64))
    ein = b.op(Op.CALL, x, y, attrs=call(aten.einsum.default, "ij,jk->ik",
                                         (A.Operand(0), A.Operand(1))))
    topk = b.node(Op.CALL, x, attrs=call(aten.topk.default, A.Operand(0), 2))
    graph = b.build(cum, ein, topk.out(0), topk.out(1))
    verify(graph)
    xv, yv = torch.randn(4, 6), torch.randn(6, 3)
    values, indices = torch.topk(xv, 2)
    expected = [torch.cumsum(xv, 1, dtype=torch.float64), torch.einsum("ij,jk->ik", xv, yv),
                values, indices]
    for actual, e in zip(interpret(graph, [xv, yv]), expected, strict=True):
        support.assert_identical(actual, e)


def test_movement_and_indexing_ops() -> None:
    torch.manual_seed(0)
    table = torch.randn(10, 3)
    b = GraphBuilder()
    x = b.input("x", _t(2, 5))
    ids = b.input("ids", _t(2, 4, dtype=DType.I64))
    pad = b.op(Op.PAD, x, attrs=A.PadAttrs((1, 2), -0.0))
    sl = b.op(Op.SLICE, pad, attrs=A.SliceAttrs(1, 1, 7, 2))
    var = b.op(Op.VAR, sl, attrs=A.VarAttrs((1,), 0, True))
    emb = b.op(Op.EMBEDDING, b.constant("table", table), ids)
    sel = b.op(Op.SELECT, emb, attrs=A.SelectAttrs(1, 2))
    cat = b.op(Op.CAT, sel, sel, attrs=A.DimAttrs(0))
    exp = b.op(Op.EXPAND, b.op(Op.UNSQUEEZE, var, attrs=A.DimAttrs(0)),
               attrs=A.ShapeAttrs((3, 2, 1)))
    pos = b.op(Op.GT, cat, b.scalar(0.0))
    where = b.op(Op.WHERE, pos, cat, b.op(Op.NEG, cat))
    am = b.op(Op.ARGMAX, x, attrs=A.ArgReduceAttrs(1, True))
    s = b.op(Op.SUM, x, attrs=A.ReduceAttrs(None))
    m = b.op(Op.MEAN, x, attrs=A.ReduceAttrs((0,), True))
    graph = b.build(sl, var, where, exp, am, s, m)
    verify(graph)

    xv = torch.randn(2, 5)
    iv = torch.randint(0, 10, (2, 4))
    padded = F.pad(xv, (1, 2), value=-0.0)
    v = padded[:, 1:7:2].var(1, correction=0, keepdim=True)
    sel_ref = F.embedding(iv, table)[:, 2]
    cat_ref = torch.cat([sel_ref, sel_ref])
    expected = [padded[:, 1:7:2], v, cat_ref.abs(), v.unsqueeze(0).expand(3, 2, 1),
                xv.argmax(1, keepdim=True), xv.sum(), xv.mean(0, keepdim=True)]
    for actual, e in zip(interpret(graph, [xv, iv]), expected, strict=True):
        support.assert_identical(actual, e)


def test_wrong_number_of_inputs_is_a_type_error() -> None:
    b = GraphBuilder()
    x = b.input("x", _t(2))
    graph = b.build(b.op(Op.RELU, x))
    with pytest.raises(TypeError, match="graph takes 1 inputs, 2 given"):
        interpret(graph, [torch.zeros(2), torch.zeros(2)])


def test_zoo_graph_matches_eager_model(zoo_case) -> None:
    actual = support.run_interpreter(zoo_case.graph, zoo_case.inputs)
    assert len(actual) == len(zoo_case.expected)
    for a, e in zip(actual, zoo_case.expected):
        assert support.relative_error(a, e) < 1e-5
