"""Every lowering against kiln's reference interpreter (ATen), on random and awkward shapes."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import attrs as A
from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Value
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.tir.interp import run_torch
from kiln.tir.lower import NotLowerable, lower_chain, lower_node

F32 = DType.F32


def _random(t: TensorType, gen: torch.Generator) -> torch.Tensor:
    if t.dtype.is_floating:
        return torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype.torch)
    if t.dtype is DType.BOOL:
        return torch.rand(t.shape, generator=gen) > 0.5
    return torch.randint(-5, 6, t.shape, generator=gen, dtype=t.dtype.torch)


def check(types: list[TensorType], build, chain: bool = False, seed: int = 0,
          atol: float = 1e-5) -> None:
    """Build a graph on inputs of ``types``; lower its last node (or every body node) and
    compare the loop interpreter against kiln's ATen interpreter."""
    b = GraphBuilder()
    xs = [b.input(f"x{k}", t) for k, t in enumerate(types)]
    out = build(b, *xs)
    outs = out if isinstance(out, tuple) else (out,)
    graph = b.build(*outs)
    gen = torch.Generator().manual_seed(seed)
    inputs = [_random(t, gen) for t in types]
    expected = interpret(graph, inputs)
    env = {node.out(): x for node, x in zip(graph.inputs, inputs)}
    if chain:
        body = [n for n in graph.nodes if n.op not in (Op.SCALAR, Op.CONSTANT)]
        lowered = lower_chain(body, outputs=list(outs))
    else:
        lowered = lower_node(outs[0].node, outputs=list(outs))
    if not chain:  # operands of the node come from the ATen interpreter
        full = interpret(graph.replace(outputs=[v for n in graph.nodes for v in n.outputs]),
                         inputs)
        env.update(zip([v for n in graph.nodes for v in n.outputs], full))
    got = run_torch(lowered.func, [env[v] for v in lowered.inputs])
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=atol, rtol=1e-5, equal_nan=True)


def T(*shape: int, dtype: DType = F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


SHAPES = [(3, 5), (1, 7), (0, 4), (2, 1, 3), ()]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", [Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.SIN, Op.COS, Op.TANH,
                                Op.SIGMOID, Op.ERF, Op.ABS, Op.NEG, Op.RELU, Op.RECIPROCAL,
                                Op.FLOOR, Op.CEIL])
def test_unary(op: Op, shape: tuple[int, ...]) -> None:
    check([T(*shape)], lambda b, x: b.op(op, x))


@pytest.mark.parametrize("attrs", [A.GeluAttrs("none"), A.GeluAttrs("tanh")])
def test_gelu(attrs: A.GeluAttrs) -> None:
    check([T(4, 7)], lambda b, x: b.op(Op.GELU, x, attrs=attrs))


def test_leaky_relu_hardswish_clamp_cast_not() -> None:
    check([T(5, 3)], lambda b, x: b.op(Op.LEAKY_RELU, x, attrs=A.LeakyReluAttrs(0.2)))
    check([T(5, 3)], lambda b, x: b.op(Op.HARDSWISH, x))
    check([T(5, 3)], lambda b, x: b.op(Op.CLAMP, x, attrs=A.ClampAttrs(-0.5, 0.5)))
    check([T(5, 3)], lambda b, x: b.op(Op.CLAMP, x, attrs=A.ClampAttrs(None, 0.0)))
    check([T(5, 3)], lambda b, x: b.op(Op.CAST, x, attrs=A.CastAttrs(DType.I32)))
    check([T(5, 3, dtype=DType.I64)], lambda b, x: b.op(Op.CAST, x, attrs=A.CastAttrs(F32)))
    check([T(5, 3, dtype=DType.BOOL)], lambda b, x: b.op(Op.LOGICAL_NOT, x))


BROADCASTS = [((3, 5), (3, 5)), ((3, 5), (1, 5)), ((4, 1, 3), (2, 1)), ((0, 3), (1, 3)),
              ((), (2, 3))]


@pytest.mark.parametrize("shapes", BROADCASTS)
@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAXIMUM, Op.MINIMUM,
                                Op.LT, Op.GE, Op.EQ])
def test_binary_broadcast(op: Op, shapes) -> None:
    attrs = A.DivAttrs() if op is Op.DIV else A.NO_ATTRS
    check([T(*shapes[0]), T(*shapes[1])], lambda b, x, y: b.op(op, x, y, attrs=attrs))


def test_binary_mixed_dtypes_and_scalars() -> None:
    check([T(3, 4, dtype=DType.I32), T(3, 4)], lambda b, x, y: b.op(Op.ADD, x, y))
    check([T(3, 4, dtype=DType.I64)], lambda b, x: b.op(Op.DIV, x, b.scalar(2),
                                                         attrs=A.DivAttrs()))
    check([T(3, 4)], lambda b, x: b.op(Op.MUL, x, b.scalar(0.5)))
    check([T(3, 4, dtype=DType.I64)], lambda b, x: b.op(Op.GT, x, b.scalar(1.5)))
    check([T(3, 4)], lambda b, x: b.op(Op.POW, x, b.scalar(2)))
    check([T(3, 4)], lambda b, x: b.op(Op.DIV, x, b.scalar(0.7),
                                       attrs=A.DivAttrs("floor")))
    check([T(3, 4)], lambda b, x: b.op(Op.DIV, x, b.scalar(0.7),
                                       attrs=A.DivAttrs("trunc")))
    check([T(3, 4, dtype=DType.BOOL), T(1, 4, dtype=DType.BOOL)],
          lambda b, x, y: b.op(Op.LOGICAL_OR, x, y))


def test_where() -> None:
    check([T(3, 1, dtype=DType.BOOL), T(3, 4), T(4)], lambda b, c, x, y: b.op(Op.WHERE, c, x, y))


@pytest.mark.parametrize("shape", [(3, 5), (2, 0, 3), (1, 1), (4, 3, 2)])
@pytest.mark.parametrize("op", [Op.SUM, Op.MEAN, Op.AMAX, Op.AMIN])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(op: Op, shape, keepdim: bool) -> None:
    if op in (Op.AMAX, Op.AMIN) and 0 in shape:
        pytest.skip("ATen refuses max of an empty dimension")
    check([T(*shape)], lambda b, x: b.op(op, x, attrs=A.ReduceAttrs((-1,), keepdim)))
    if op not in (Op.AMAX, Op.AMIN) or 0 not in shape:
        check([T(*shape)], lambda b, x: b.op(op, x, attrs=A.ReduceAttrs((0,), keepdim)))


def test_reduce_all_and_int_sum() -> None:
    check([T(3, 4)], lambda b, x: b.op(Op.SUM, x, attrs=A.ReduceAttrs(None)))
    check([T(3, 4, dtype=DType.I32)], lambda b, x: b.op(Op.SUM, x, attrs=A.ReduceAttrs((1,))))
    check([T(3, 5)], lambda b, x: b.op(Op.VAR, x, attrs=A.VarAttrs((1,), 1, True)))


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 1), (4, 0), (1, 7)])
@pytest.mark.parametrize("op", [Op.SOFTMAX, Op.LOG_SOFTMAX])
def test_softmax(op: Op, shape) -> None:
    check([T(*shape)], lambda b, x: b.op(op, x, attrs=A.SoftmaxAttrs(-1)))
    check([T(*shape)], lambda b, x: b.op(op, x, attrs=A.SoftmaxAttrs(0)))


@pytest.mark.parametrize("shape", [(3, 6), (2, 3, 5), (1, 1)])
def test_layer_norm(shape) -> None:
    n = shape[-1]

    def build(b, x, w, bias):
        node = b.node(Op.LAYER_NORM, x, w, bias, attrs=A.LayerNormAttrs((n,), 1e-5))
        return node.out(0), node.out(1), node.out(2)
    check([T(*shape), T(n), T(n)], build, atol=1e-4)


def test_batch_norm() -> None:
    check([T(2, 3, 4, 5), T(3), T(3), T(3), T(3)],
          lambda b, x, w, bi, m, v: b.op(Op.BATCH_NORM, x, w, bi, m, b.op(Op.ABS, v),
                                         attrs=A.BatchNormAttrs(1e-5)))


@pytest.mark.parametrize("mnk", [(3, 5, 4), (1, 1, 1), (0, 3, 2), (3, 2, 0), (7, 9, 5)])
def test_matmul(mnk) -> None:
    m, n, k = mnk
    check([T(m, k), T(k, n)], lambda b, x, y: b.op(Op.MM, x, y))
    check([T(2, m, k), T(2, k, n)], lambda b, x, y: b.op(Op.BMM, x, y))
    check([T(n), T(m, k), T(k, n)], lambda b, c, x, y: b.op(Op.ADDMM, c, x, y,
                                                             attrs=A.AddmmAttrs()))
    check([T(m, 1), T(m, k), T(k, n)], lambda b, c, x, y: b.op(
        Op.ADDMM, c, x, y, attrs=A.AddmmAttrs(beta=0.5, alpha=2.0)))


@pytest.mark.parametrize("cfg", [
    # (N, C, H, W, Cout, K, stride, padding, dilation, groups, bias)
    (1, 3, 5, 6, 4, 3, 1, 1, 1, 1, True),
    (2, 4, 7, 5, 6, 3, 2, 0, 1, 2, False),
    (1, 2, 6, 6, 2, 2, 1, 2, 2, 2, True),
    (1, 1, 1, 1, 1, 1, 1, 0, 1, 1, False),
])
def test_conv2d(cfg) -> None:
    n, c, h, w, co, k, s, p, d, g, bias = cfg
    attrs = A.ConvAttrs((s, s), (p, p), (d, d), False, (0, 0), g)
    types = [T(n, c, h, w), T(co, c // g, k, k)] + ([T(co)] if bias else [])
    check(types, lambda b, *xs: b.op(Op.CONVOLUTION, *xs, attrs=attrs), atol=1e-4)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_pooling(ceil_mode: bool) -> None:
    mp = A.MaxPoolAttrs((3, 3), (2, 2), (1, 1), (1, 1), ceil_mode)
    check([T(1, 2, 7, 6)], lambda b, x: b.node(Op.MAX_POOL2D, x, attrs=mp).out(0))
    for include in (False, True):
        ap = A.AvgPoolAttrs((3, 2), (2, 2), (1, 1), ceil_mode, include, None)
        check([T(2, 1, 7, 5)], lambda b, x, ap=ap: b.op(Op.AVG_POOL2D, x, attrs=ap))
    check([T(2, 3, 7, 5)], lambda b, x: b.op(Op.ADAPTIVE_AVG_POOL2D, x,
                                             attrs=A.AdaptivePoolAttrs((3, 2))))
    check([T(1, 3, 4, 4)], lambda b, x: b.op(Op.ADAPTIVE_AVG_POOL2D, x,
                                             attrs=A.AdaptivePoolAttrs((1, 1))))


def test_max_pool_indices_are_not_lowerable() -> None:
    b = GraphBuilder()
    x = b.input("x", T(1, 1, 4, 4))
    node = b.node(Op.MAX_POOL2D, x, attrs=A.MaxPoolAttrs((2, 2), (2, 2), (0, 0), (1, 1), False))
    with pytest.raises(NotLowerable, match="indices"):
        lower_node(node)


def test_movement() -> None:
    check([T(2, 3, 4)], lambda b, x: b.op(Op.PERMUTE, x, attrs=A.PermuteAttrs((2, 0, 1))))
    check([T(2, 3, 4)], lambda b, x: b.op(Op.VIEW, x, attrs=A.ShapeAttrs((4, 6))))
    check([T(2, 1, 4)], lambda b, x: b.op(Op.SQUEEZE, x, attrs=A.SqueezeAttrs((1,))))
    check([T(2, 4)], lambda b, x: b.op(Op.UNSQUEEZE, x, attrs=A.DimAttrs(1)))
    check([T(3, 1)], lambda b, x: b.op(Op.EXPAND, x, attrs=A.ShapeAttrs((2, 3, 5))))
    check([T(7, 3)], lambda b, x: b.op(Op.SLICE, x, attrs=A.SliceAttrs(0, 1, 6, 2)))
    check([T(7, 3)], lambda b, x: b.op(Op.SLICE, x, attrs=A.SliceAttrs(0, -3, 100, 1)))
    check([T(7, 3)], lambda b, x: b.op(Op.SELECT, x, attrs=A.SelectAttrs(1, -1)))
    check([T(2, 3), T(2, 0), T(2, 4)],
          lambda b, x, y, z: b.op(Op.CAT, x, y, z, attrs=A.DimAttrs(1)))
    check([T(3, 4)], lambda b, x: b.op(Op.PAD, x, attrs=A.PadAttrs((1, 2, 0, 1), 0.5)))
    check([T(3, 4)], lambda b, x: b.op(Op.PAD, x, attrs=A.PadAttrs((-1, 1))))
    check([T(3, 4)], lambda b, x: b.op(Op.CLONE, x))
    check([T(5, 2)], lambda b, x: b.node(Op.SPLIT, x, attrs=A.SplitAttrs((2, 3), 0)).out(1))


def test_embedding() -> None:
    def build(b, w):
        idx = b.op(Op.CAST, b.op(Op.ABS, b.input("i", T(2, 3, dtype=DType.I64))),
                   attrs=A.CastAttrs(DType.I64))
        return b.op(Op.EMBEDDING, w, idx)
    b = GraphBuilder()
    w = b.input("w", T(6, 4))
    i = b.input("i", T(2, 3, dtype=DType.I64))
    y = b.op(Op.EMBEDDING, w, i)
    graph = b.build(y)
    weights, idx = torch.randn(6, 4), torch.tensor([[0, 5, 2], [1, 1, 3]])
    lowered = lower_node(y.node)
    got = run_torch(lowered.func, [weights, idx])[0]
    torch.testing.assert_close(got, interpret(graph, [weights, idx])[0])


def test_chain_with_intermediates() -> None:
    def build(b, x, y):
        s = b.op(Op.ADD, x, y)
        r = b.op(Op.RELU, s)
        return b.op(Op.SUM, b.op(Op.MUL, r, b.scalar(2.0)), attrs=A.ReduceAttrs((1,)))
    check([T(4, 6), T(1, 6)], build, chain=True)


def test_chain_inputs_and_names() -> None:
    b = GraphBuilder()
    x = b.input("x", T(2, 3))
    s = b.op(Op.ADD, x, x)
    r = b.op(Op.RELU, s)
    lowered = lower_chain([s.node, r.node], outputs=[s, r])
    assert lowered.inputs == (x,)
    assert [p.name for p in lowered.func.params] == ["x", "add", "relu"]


def test_not_lowerable() -> None:
    b = GraphBuilder()
    x = b.input("x", T(3, 4))
    y = b.op(Op.ARGMAX, x, attrs=A.ArgReduceAttrs(1))
    with pytest.raises(NotLowerable, match="argmax"):
        lower_node(y.node)
    z = b.op(Op.DIV, b.input("i", T(3, dtype=DType.I64)), b.scalar(2),
             attrs=A.DivAttrs("trunc"))
    with pytest.raises(NotLowerable, match="rounding mode trunc"):
        lower_node(z.node)


def test_outputs_must_come_from_chain() -> None:
    b = GraphBuilder()
    x = b.input("x", T(3))
    y = b.op(Op.RELU, x)
    with pytest.raises(ValueError, match="not produced"):
        lower_chain([y.node], outputs=[x])


def _unused(v: Value) -> Value:
    return v
