"""Every kiln op the pipeline can leave, written as ONNX and run in ONNX Runtime, against
kiln's reference interpreter (the ATen meaning of each op), on odd shapes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kiln.export.onnx import OnnxExportError, export_graph, run_onnxruntime  # noqa: E402
from kiln.export.onnx_graph import EMITTERS  # noqa: E402
from kiln.ir import DType, Graph, GraphBuilder, Op, OpGroup, TensorType, interpret  # noqa: E402
from kiln.ir import attrs as A  # noqa: E402

F32, I64, BOOL = DType.F32, DType.I64, DType.BOOL
Build = Callable[[GraphBuilder], tuple]
CASES: dict[str, Build] = {}


def case(name: str) -> Callable[[Build], Build]:
    def register(fn: Build) -> Build:
        CASES[name] = fn
        return fn
    return register


def x_in(b: GraphBuilder, shape: tuple[int, ...] = (3, 5, 7), dtype: DType = F32,
         name: str = "x"):
    return b.input(name, TensorType(shape, dtype))


def weight(b: GraphBuilder, name: str, *shape: int) -> object:
    return b.constant(name, torch.randn(shape, generator=torch.Generator().manual_seed(len(name))))


# -- elementwise -------------------------------------------------------------------------------

for _op in (Op.ABS, Op.NEG, Op.EXP, Op.SIN, Op.COS, Op.TANH, Op.SIGMOID, Op.ERF, Op.RELU,
            Op.FLOOR, Op.CEIL, Op.RECIPROCAL):
    CASES[_op.text] = lambda b, op=_op: (b.op(op, x_in(b)),)


@case("log_sqrt_rsqrt")
def _(b):
    positive = b.op(Op.EXP, x_in(b))
    return tuple(b.op(op, positive) for op in (Op.LOG, Op.SQRT, Op.RSQRT))


@case("gelu_leaky_clamp")
def _(b):
    x = x_in(b)
    return (b.op(Op.GELU, x, attrs=A.GeluAttrs("none")),
            b.op(Op.GELU, x, attrs=A.GeluAttrs("tanh")),
            b.op(Op.LEAKY_RELU, x, attrs=A.LeakyReluAttrs(0.2)),
            b.op(Op.HARDSWISH, x),
            b.op(Op.CLAMP, x, attrs=A.ClampAttrs(-0.5, None)),
            b.op(Op.CLAMP, x, attrs=A.ClampAttrs(-0.5, 0.25)))


@case("cast_logical")
def _(b):
    x, y = x_in(b), x_in(b, name="y")
    gt = b.op(Op.GT, x, b.scalar(0.1))
    lt = b.op(Op.LT, x, y)
    return (b.op(Op.CAST, x, attrs=A.CastAttrs(DType.I32)), b.op(Op.LOGICAL_NOT, gt),
            b.op(Op.LOGICAL_AND, gt, lt), b.op(Op.LOGICAL_OR, gt, lt),
            b.op(Op.LOGICAL_NOT, b.op(Op.CAST, x, attrs=A.CastAttrs(DType.I64))))


@case("arithmetic_promotion")
def _(b):
    x, y = x_in(b), x_in(b, (5, 1), name="y")
    n = x_in(b, (3, 1, 7), I64, name="n")
    return (b.op(Op.ADD, x, b.scalar(2)), b.op(Op.SUB, x, y), b.op(Op.MUL, x, n),
            b.op(Op.DIV, n, b.scalar(2), attrs=A.DivAttrs()), b.op(Op.POW, x, b.scalar(2)),
            b.op(Op.POW, b.op(Op.EXP, x), y), b.op(Op.MAXIMUM, x, y), b.op(Op.MINIMUM, x, y),
            b.op(Op.ADD, n, b.scalar(3)), b.op(Op.MUL, n, b.scalar(1.5)))


@case("division_modes")
def _(b):
    x, y = x_in(b), x_in(b, (5, 7), name="y")
    n, m = x_in(b, (3, 5, 7), I64, "n"), x_in(b, (5, 7), I64, "m")
    n = b.op(Op.SUB, n, b.scalar(4))  # negative numerators too
    m = b.op(Op.ADD, b.op(Op.MUL, m, b.scalar(2)), b.scalar(-7))  # odd, never zero
    return tuple(b.op(Op.DIV, p, q, attrs=A.DivAttrs(mode)) for p, q in ((x, y), (n, m))
                 for mode in ("trunc", "floor"))


@case("comparisons")
def _(b):
    x, y = x_in(b), x_in(b, (7,), name="y")
    n = x_in(b, (3, 5, 7), I64, "n")
    ops = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)
    return tuple(b.op(op, x, y) for op in ops) + (b.op(Op.EQ, n, b.scalar(3)),
                                                  b.op(Op.LT, n, b.scalar(2.5)))


@case("where")
def _(b):
    x, y = x_in(b), x_in(b, (5, 7), name="y")
    return (b.op(Op.WHERE, b.op(Op.GT, x, y), x, y),)


# -- reductions and normalizations -------------------------------------------------------------

@case("reductions")
def _(b):
    x, n = x_in(b), x_in(b, (3, 5, 7), I64, "n")
    return (b.op(Op.SUM, x, attrs=A.ReduceAttrs((1,), True)),
            b.op(Op.SUM, n, attrs=A.ReduceAttrs(None)),
            b.op(Op.MEAN, x, attrs=A.ReduceAttrs((0, -1))),
            b.op(Op.AMAX, x, attrs=A.ReduceAttrs((2,), True)),
            b.op(Op.AMIN, x, attrs=A.ReduceAttrs((0,))),
            b.op(Op.ARGMAX, x, attrs=A.ArgReduceAttrs(1)),
            b.op(Op.ARGMAX, x, attrs=A.ArgReduceAttrs(None)),
            b.op(Op.ARGMIN, x, attrs=A.ArgReduceAttrs(-1, True)),
            b.op(Op.VAR, x, attrs=A.VarAttrs((0, 2), 1)),
            b.op(Op.VAR, x, attrs=A.VarAttrs(None, 0, True)))


@case("softmax_norms")
def _(b):
    x = x_in(b)
    ln = b.node(Op.LAYER_NORM, x, weight(b, "ln.w", 5, 7), weight(b, "ln.b", 5, 7),
                attrs=A.LayerNormAttrs((5, 7), 1e-5))
    img = x_in(b, (2, 3, 5, 7), name="img")
    bn = b.op(Op.BATCH_NORM, img, weight(b, "bn.w", 3), weight(b, "bn.b", 3),
              weight(b, "bn.mean", 3), b.op(Op.EXP, weight(b, "bn.var", 3)),
              attrs=A.BatchNormAttrs(1e-3))
    return (b.op(Op.SOFTMAX, x, attrs=A.SoftmaxAttrs(-1)),
            b.op(Op.LOG_SOFTMAX, x, attrs=A.SoftmaxAttrs(1)), *ln.outputs, bn)


# -- movement ----------------------------------------------------------------------------------

@case("movement")
def _(b):
    x = x_in(b)
    return (b.op(Op.VIEW, x, attrs=A.ShapeAttrs((7, 15))),
            b.op(Op.PERMUTE, x, attrs=A.PermuteAttrs((2, 0, 1))),
            b.op(Op.EXPAND, x_in(b, (3, 1, 7), name="e"), attrs=A.ShapeAttrs((2, 3, 5, 7))),
            b.op(Op.SQUEEZE, x_in(b, (3, 1, 7, 1), name="s"), attrs=A.SqueezeAttrs((1, 2))),
            b.op(Op.UNSQUEEZE, x, attrs=A.DimAttrs(-1)),
            b.op(Op.SLICE, x, attrs=A.SliceAttrs(2, 1, 6, 2)),
            b.op(Op.SELECT, x, attrs=A.SelectAttrs(1, -2)),
            b.op(Op.CLONE, x), b.op(Op.TO_LAYOUT, x, attrs=A.LayoutAttrs(False)),
            b.op(Op.PAD, x, attrs=A.PadAttrs((1, -2, 0, 3), 0.5)))


@case("split_cat")
def _(b):
    x = x_in(b)
    pieces = b.node(Op.SPLIT, x, attrs=A.SplitAttrs((2, 4, 1), 2)).outputs
    empty = x_in(b, (0,), name="empty")
    return (*pieces, b.op(Op.CAT, pieces[2], pieces[0], empty, attrs=A.DimAttrs(-1)))


# -- contractions ------------------------------------------------------------------------------

@case("matmuls")
def _(b):
    x, y = x_in(b, (5, 7)), x_in(b, (7, 3), name="y")
    bias = weight(b, "bias", 3)
    return (b.op(Op.MM, x, y), b.op(Op.BMM, x_in(b, name="p"), x_in(b, (3, 7, 2), name="q")),
            b.op(Op.ADDMM, bias, x, y, attrs=A.AddmmAttrs(0.5, 2)),
            b.op(Op.ADDMM, x_in(b, (5, 3), name="c"), x, y, attrs=A.AddmmAttrs(0, 1)))


@case("addmm_act")
def _(b):
    x, w = x_in(b, (5, 7)), weight(b, "w", 7, 3)
    bias = weight(b, "bias", 3)
    acts = ((Op.RELU, ()), (Op.GELU, ("none",)), (Op.GELU, ("tanh",)), (Op.CLAMP, (0.0, 6.0)),
            (Op.LEAKY_RELU, (0.1,)), (Op.SIGMOID, ()), (Op.TANH, ()), (Op.HARDSWISH, ()))
    return tuple(b.op(Op.ADDMM_ACT, bias, x, w, attrs=A.AddmmActAttrs(act, args))
                 for act, args in acts)


@case("convolutions")
def _(b):
    x = x_in(b, (2, 4, 9, 7))
    w, w_group = weight(b, "w", 6, 4, 3, 2), weight(b, "wg", 6, 2, 3, 3)
    w_t, bias = weight(b, "wt", 4, 3, 3, 3), weight(b, "bias", 6)
    conv = A.ConvAttrs((2, 1), (1, 0), (1, 2), False, (0, 0), 1)
    grouped = A.ConvAttrs((1, 1), (1, 1), (1, 1), False, (0, 0), 2)
    transposed = A.ConvAttrs((2, 2), (1, 0), (1, 1), True, (1, 0), 1)
    return (b.op(Op.CONVOLUTION, x, w, bias, attrs=conv),
            b.op(Op.CONVOLUTION, x, w_group, attrs=grouped),
            b.op(Op.CONVOLUTION, x, w_t, attrs=transposed))


@case("conv_act")
def _(b):
    x, w, bias = x_in(b, (2, 4, 9, 7)), weight(b, "w", 4, 4, 3, 3), weight(b, "bias", 4)
    residual = x_in(b, (2, 4, 9, 7), name="r")

    def conv_act(act, args, has_bias=True, has_residual=True):
        attrs = A.ConvActAttrs((1, 1), (1, 1), (1, 1), 1, has_bias, has_residual, act, args)
        operands = [x, w] + ([bias] if has_bias else []) + ([residual] if has_residual else [])
        return b.op(Op.CONV_ACT, *operands, attrs=attrs)

    return (conv_act(Op.RELU, ()), conv_act(Op.CLAMP, (0.0, 6.0), has_residual=False),
            conv_act(None, (), has_bias=False), conv_act(Op.GELU, ("none",)),
            conv_act(Op.LEAKY_RELU, (0.3,), has_bias=False))


@case("embedding")
def _(b):
    return (b.op(Op.EMBEDDING, weight(b, "table", 11, 6), x_in(b, (3, 4), I64, "ids")),)


@case("index_select")
def _(b):
    table, ids = weight(b, "table", 11, 6), x_in(b, (4,), I64, "ids")
    call = A.CallAttrs(torch.ops.aten.index_select.default, (A.Operand(0), -2, A.Operand(1)))
    return (b.op(Op.CALL, table, ids, attrs=call),)


# -- pooling and creation ----------------------------------------------------------------------

@case("pooling")
def _(b):
    x = x_in(b, (2, 3, 9, 8))
    pooled = b.node(Op.MAX_POOL2D, x, attrs=A.MaxPoolAttrs((3, 2), (2, 2), (1, 1), (1, 1), True))
    return (*pooled.outputs,
            b.op(Op.MAX_POOL2D, x_in(b, (3, 7, 7), name="chw"),
                 attrs=A.MaxPoolAttrs((3, 3), (2, 2), (0, 0), (2, 1), False)),
            b.op(Op.AVG_POOL2D, x, attrs=A.AvgPoolAttrs((3, 3), (2, 2), (1, 1), True, True, None)),
            b.op(Op.AVG_POOL2D, x, attrs=A.AvgPoolAttrs((3, 2), (2, 3), (1, 1), True, False, None)),
            b.op(Op.AVG_POOL2D, x, attrs=A.AvgPoolAttrs((2, 2), (2, 2), (1, 0), True, True, 3)),
            b.op(Op.AVG_POOL2D, x, attrs=A.AvgPoolAttrs((3, 3), (1, 1), (1, 1), False, True, None)),
            b.op(Op.ADAPTIVE_AVG_POOL2D, x, attrs=A.AdaptivePoolAttrs((4, 3))),
            b.op(Op.ADAPTIVE_AVG_POOL2D, x, attrs=A.AdaptivePoolAttrs((3, 4))),
            b.op(Op.ADAPTIVE_AVG_POOL2D, x, attrs=A.AdaptivePoolAttrs((1, 1))))


@case("creation")
def _(b):
    x = x_in(b, (4, 5))
    full = b.op(Op.FULL, attrs=A.FullAttrs((4, 5), 2.5, F32))
    steps = b.op(Op.ARANGE, attrs=A.ArangeAttrs(1, 11, 2, F32))
    return (b.op(Op.ADD, x, full), b.op(Op.MUL, x, steps))


# -- the checks --------------------------------------------------------------------------------

def build(name: str) -> Graph:
    b = GraphBuilder()
    outputs = CASES[name](b)
    return b.build(*outputs)


def random_feeds(graph: Graph, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for node in graph.inputs:
        t = node.type
        if t.dtype.is_floating:
            tensors.append(torch.randn(t.shape, generator=generator).to(t.dtype.torch))
        else:
            tensors.append(torch.randint(0, 9, t.shape, generator=generator).to(t.dtype.torch))
    return tensors


def assert_matches(graph: Graph, model: onnx.ModelProto) -> None:
    inputs = random_feeds(graph)
    with torch.no_grad():
        expected = interpret(graph, inputs)
    feeds = {i.name: x.numpy() for i, x in zip(model.graph.input, inputs)}
    actual = run_onnxruntime(model, feeds)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        e = e.contiguous().numpy()
        assert a.dtype == e.dtype and a.shape == e.shape, f"output {i}"
        if np.issubdtype(e.dtype, np.floating):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"output {i}")


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("contrib", [False, True], ids=["standard", "contrib"])
def test_op_runs_in_onnxruntime_like_kiln(name: str, contrib: bool) -> None:
    graph = build(name)
    model = export_graph(graph, contrib_ops=contrib)  # includes onnx.checker's full check
    uses_contrib = any(n.domain == "com.microsoft" for n in model.graph.node)
    if not contrib:
        assert not uses_contrib
    assert_matches(graph, model)


def test_every_op_the_table_writes_has_a_case() -> None:
    covered = {node.op for name in CASES for node in build(name).nodes}
    assert set(EMITTERS) <= covered, sorted(op.text for op in set(EMITTERS) - covered)
    # every op but the sources and opaque calls has a row
    modeled = {op for op in Op if not op.is_a(OpGroup.SOURCE | OpGroup.OPAQUE)}
    assert modeled <= set(EMITTERS), sorted(op.text for op in modeled - set(EMITTERS))


def test_contrib_ops_replace_the_fused_sequences() -> None:
    model = export_graph(build("conv_act"), contrib_ops=True)
    types = [n.op_type for n in model.graph.node]
    assert types.count("FusedConv") == 3  # relu, clamp and leaky relu; gelu and none stay
    model = export_graph(build("addmm_act"), contrib_ops=True)
    types = [n.op_type for n in model.graph.node]
    assert types.count("FusedGemm") == 4 and "BiasGelu" in types and "FastGelu" in types


def test_an_opaque_aten_call_is_a_clear_error() -> None:
    b = GraphBuilder()
    x = x_in(b)
    call = A.CallAttrs(torch.ops.aten.cumsum.default, (A.Operand(0), 1))
    b.node(Op.CALL, x, attrs=call, types=(TensorType((3, 5, 7), F32),), name="running_total")
    graph = b.build(b.nodes[-1].out())
    with pytest.raises(OnnxExportError, match=r"running_total \(call\).*aten\.cumsum"):
        export_graph(graph)


def test_names_opset_and_outputs() -> None:
    b = GraphBuilder()
    x = x_in(b, (2, 3))
    y = b.op(Op.RELU, x)
    graph = b.build(y, x, y)  # an output twice, and an input as an output
    model = export_graph(graph, input_names=["pixels"], output_names=["a", "b", "c"])
    assert [i.name for i in model.graph.input] == ["pixels"]
    assert [o.name for o in model.graph.output] == ["a", "b", "c"]
    assert_matches(graph, model)
    with pytest.raises(OnnxExportError, match="opset"):
        export_graph(graph, opset=13)
    with pytest.raises(OnnxExportError, match="3 output"):
        export_graph(graph, output_names=["a"])
