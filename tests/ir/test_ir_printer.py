"""IR text round trip: print -> parse -> print is the identity, and both graphs compute alike.

The texts below are in the printer's own form, so parsing then printing them must give them
back unchanged; they cover multi-output nodes, scalars (signed zeros, infinities, NaN, ints,
bools), opaque CALL nodes with argument templates, and weights.
"""

from __future__ import annotations

import pytest
import torch

import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.ir import Graph, GraphBuilder, Node, Op, TensorType, parse_graph, print_graph, verify
from kiln.ir import attrs as A
from kiln.ir.types import DType

MULTI_OUTPUT = """\
graph(%x: f32[4, 6], %img: f32[1, 2, 6, 6]) {
  %ln.weight = constant {name='ln.weight'} : f32[6]
  %ln.bias = constant {name='ln.bias'} : f32[6]
  %ln = layer_norm(%x, %ln.weight, %ln.bias) {normalized_shape=(6,), eps=1e-05} : (f32[4, 6], f32[4, 1], f32[4, 1])
  %parts = split(%ln#0) {sizes=(2, 4), dim=1} : (f32[4, 2], f32[4, 4])
  %r = relu(%parts#1) : f32[4, 4]
  %pool = max_pool2d(%img) {kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1), ceil_mode=False} : (f32[1, 2, 3, 3], i64[1, 2, 3, 3])
  return %parts#0, %r, %ln#1, %ln#2, %pool#0, %pool#1
}
"""  # noqa: E501

SCALARS = """\
graph(%x: f32[8], %i: i64[8]) {
  %c = scalar {value=-0.0} : f64[]
  %mul = mul(%x, %c) : f32[8]
  %c_1 = scalar {value=0.0} : f64[]
  %mul_1 = mul(%x, %c_1) : f32[8]
  %c_2 = scalar {value=inf} : f64[]
  %mul_2 = mul(%x, %c_2) : f32[8]
  %c_3 = scalar {value=-inf} : f64[]
  %mul_3 = mul(%x, %c_3) : f32[8]
  %c_4 = scalar {value=nan} : f64[]
  %mul_4 = mul(%x, %c_4) : f32[8]
  %c_5 = scalar {value=1} : i64[]
  %mul_5 = mul(%x, %c_5) : f32[8]
  %c_6 = scalar {value=1.0} : f64[]
  %mul_6 = mul(%x, %c_6) : f32[8]
  %c_7 = scalar {value=True} : bool[]
  %mul_7 = mul(%x, %c_7) : f32[8]
  %c_8 = scalar {value=4611686018427387904} : i64[]
  %mul_8 = mul(%i, %c_8) : i64[8]
  %c_9 = scalar {value=1e-300} : f64[]
  %mul_9 = mul(%x, %c_9) : f32[8]
  %add = add(%x, %c) : f32[8]
  %sub = sub(%x, %c_1) : f32[8]
  %c_10 = scalar {value=2} : i64[]
  %square = pow(%x, %c_10) : f32[8]
  %c_11 = scalar {value=2.0} : f64[]
  %exp2 = pow(%c_11, %x) : f32[8]
  %c_12 = scalar {value=1.5} : f64[]
  %imul = mul(%i, %c_12) : f32[8]
  %fdiv = div(%i, %c_10) {rounding_mode='floor'} : i64[8]
  %pos = gt(%x, %c_1) : bool[8]
  %clamp = clamp(%x) {min=-0.0, max=inf} : f32[8]
  %nans = full {shape=(2,), value=nan, dtype=f32} : f32[2]
  %zeros = full {shape=(2,), value=-0.0, dtype=f32} : f32[2]
  return %mul, %mul_1, %mul_2, %mul_3, %mul_4, %mul_5, %mul_6, %mul_7, %mul_8, %mul_9, %add, %sub, %square, %exp2, %imul, %fdiv, %pos, %clamp, %nans, %zeros
}
"""  # noqa: E501

CALLS = """\
graph(%x: f32[4, 6], %y: f32[6, 3]) {
  %cumsum = call(%x) {target=aten.cumsum.default, args=(arg(0), 1), kwargs=(('dtype', torch.double),)} : f64[4, 6]
  %einsum = call(%x, %y) {target=aten.einsum.default, args=('ij,jk->ik', (arg(0), arg(1))), kwargs=()} : f32[4, 3]
  %topk = call(%x) {target=aten.topk.default, args=(arg(0), 2), kwargs=()} : (f32[4, 2], i64[4, 2])
  %flip = call(%x) {target=aten.flip.default, args=(arg(0), (0, 1)), kwargs=()} : f32[4, 6]
  return %cumsum, %einsum, %topk#0, %topk#1, %flip
}
"""  # noqa: E501

WEIGHTS = """\
graph(%x: f32[2, 3, 8, 8]) {
  %conv.weight = constant {name='conv.weight'} : f32[4, 3, 3, 3]
  %conv.bias = constant {name='conv.bias'} : f32[4]
  %conv = convolution(%x, %conv.weight, %conv.bias) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[2, 4, 8, 8]
  %bn.mean = constant {name='bn.running_mean'} : f32[4]
  %bn.var = constant {name='bn.running_var'} : f32[4]
  %bn = batch_norm(%conv, %conv.bias, %conv.bias, %bn.mean, %bn.var) {eps=1e-05} : f32[2, 4, 8, 8]
  %gelu = gelu(%bn) {approximate='tanh'} : f32[2, 4, 8, 8]
  %avg = avg_pool2d(%gelu) {kernel=(2, 2), stride=(2, 2), padding=(0, 0), ceil_mode=False, count_include_pad=True, divisor_override=None} : f32[2, 4, 4, 4]
  %gap = adaptive_avg_pool2d(%avg) {output_size=(1, 1)} : f32[2, 4, 1, 1]
  %flat = view(%gap) {shape=(2, 4)} : f32[2, 4]
  %fc.weight = constant {name='fc.weight'} : f32[5, 4]
  %fc_t = permute(%fc.weight) {dims=(1, 0)} : f32[4, 5]
  %fc = mm(%flat, %fc_t) : f32[2, 5]
  %logp = log_softmax(%fc) {dim=1} : f32[2, 5]
  %idx = arange {start=0, end=5, step=1, dtype=i64} : i64[5]
  %idx_f = cast(%idx) {dtype=f32} : f32[5]
  %shifted = add(%logp, %idx_f) : f32[2, 5]
  %padded = pad(%shifted) {pad=(1, 2), value=-0.0} : f32[2, 8]
  %sl = slice(%padded) {dim=1, start=1, end=7, step=2} : f32[2, 3]
  %var = var(%sl) {dims=(1,), correction=0, keepdim=True} : f32[2, 1]
  %best = argmax(%padded) {dim=1, keepdim=False} : i64[2]
  %emb.weight = constant {name='emb.weight'} : f32[10, 3]
  %emb = embedding(%emb.weight, %best) : f32[2, 3]
  %cat = cat(%emb, %emb) {dim=0} : f32[4, 3]
  %lrelu = leaky_relu(%cat) {negative_slope=0.2} : f32[4, 3]
  %c = scalar {value=0.0} : f64[]
  %pos = gt(%lrelu, %c) : bool[4, 3]
  %neg = neg(%lrelu) : f32[4, 3]
  %abs = where(%pos, %lrelu, %neg) : f32[4, 3]
  return %var, %abs
}
"""  # noqa: E501


def _weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "ln.weight": torch.randn(6), "ln.bias": torch.randn(6),
        "conv.weight": torch.randn(4, 3, 3, 3), "conv.bias": torch.randn(4),
        "bn.running_mean": torch.randn(4), "bn.running_var": torch.rand(4) + 0.5,
        "fc.weight": torch.randn(5, 4), "emb.weight": torch.randn(10, 3),
    }


TEXTS = {"multi_output": MULTI_OUTPUT, "scalars": SCALARS, "calls": CALLS, "weights": WEIGHTS}


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_printer_text_round_trips_exactly(text: str) -> None:
    graph = parse_graph(text, _weights())
    verify(graph)
    assert print_graph(graph) == text
    again = parse_graph(print_graph(graph), graph.constants)
    assert print_graph(again) == text


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_reparsed_graph_computes_the_same(text: str) -> None:
    graph = parse_graph(text, _weights())
    again = parse_graph(print_graph(graph), graph.constants)
    for seed in range(3):
        inputs = support.random_inputs(graph, seed)
        expected = support.run_interpreter(graph, tuple(inputs))
        actual = support.run_interpreter(again, tuple(inputs))
        assert len(actual) == len(expected) == len(graph.outputs)
        for a, e in zip(actual, expected):
            support.assert_identical(a, e)


def test_scalars_keep_their_kind_and_sign_through_text() -> None:
    graph = parse_graph(SCALARS)
    values = [n.attrs.value for n in graph.nodes if n.op is Op.SCALAR]
    assert [type(v) for v in values[:9]] == [float, float, float, float, float, int, float,
                                             bool, int]
    assert str(values[0]) == "-0.0" and str(values[1]) == "0.0"
    assert values[2] == float("inf") and values[3] == float("-inf") and values[4] != values[4]
    x = torch.tensor([1.0, -1.0, 0.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    i = torch.arange(8)
    outputs = support.run_interpreter(graph, (x, i))
    support.assert_identical(outputs[0], x * -0.0)
    support.assert_identical(outputs[10], x + -0.0)
    support.assert_identical(outputs[-1], torch.full((2,), -0.0))


def test_builder_graph_round_trips() -> None:
    torch.manual_seed(0)
    b = GraphBuilder()
    x = b.input("x", TensorType((3, 4), DType.F32))
    w = b.constant("w", torch.randn(4, 4))
    sp = b.node(Op.SPLIT, b.op(Op.MM, x, w), attrs=A.SplitAttrs((1, 3), 1))
    neg_zero = b.scalar(-0.0)
    y = b.op(Op.ADD, sp.out(1), neg_zero)
    cum = b.node(Op.CALL, y, attrs=A.CallAttrs(torch.ops.aten.cumsum.default, (A.Operand(0), 0)))
    graph = b.build(sp.out(0), cum.out(), y)
    text = print_graph(graph)
    again = parse_graph(text, graph.constants)
    verify(again)
    assert print_graph(again) == text
    inputs = tuple(support.random_inputs(graph))
    for a, e in zip(support.run_interpreter(again, inputs), support.run_interpreter(graph, inputs)):
        support.assert_identical(a, e)


def test_clashing_labels_are_printed_unique_and_parse_back() -> None:
    """Labels are not unique (passes keep them); the printer makes them so."""
    b = GraphBuilder()
    x = b.input("x", TensorType((4,), DType.F32))
    a = b.op(Op.RELU, x, name="x")
    c = b.op(Op.NEG, a, name="x")
    d = b.op(Op.EXP, c, name="x_1")
    graph = b.build(d)
    text = print_graph(graph)
    assert text.splitlines()[1:4] == [
        "  %x_1 = relu(%x) : f32[4]",
        "  %x_2 = neg(%x_1) : f32[4]",
        "  %x_1_1 = exp(%x_2) : f32[4]",
    ]
    assert print_graph(parse_graph(text)) == text


def test_device_is_part_of_the_header() -> None:
    text = "graph(%x: f32[2]) on cuda:0 {\n  %y = relu(%x) : f32[2]\n  return %y\n}\n"
    graph = parse_graph(text)
    assert graph.device == torch.device("cuda:0")
    assert print_graph(graph) == text


def test_graph_without_inputs_or_outputs() -> None:
    text = "graph() {\n  %f = full {shape=(2,), value=1, dtype=i32} : i32[2]\n  return \n}\n"
    graph = parse_graph(text)
    assert (graph.inputs, graph.outputs) == ((), ())
    assert print_graph(graph) == text


def test_string_attribute_ending_in_backslash_round_trips() -> None:
    x = Node(Op.INPUT, (), A.InputAttrs(0), (TensorType((4,), DType.F32),), "x")
    attrs = A.CallAttrs(torch.ops.aten.div.Tensor_mode, (A.Operand(0), 2.0),
                        (("rounding_mode", "a\\"),))
    call = Node(Op.CALL, (x.out(),), attrs, (TensorType((4,), DType.F32),), "call")
    text = print_graph(Graph([x], [call], [call.out()]))
    assert print_graph(parse_graph(text)) == text


def test_zoo_graph_round_trips(zoo_case) -> None:
    graph = zoo_case.graph
    text = print_graph(graph)
    again = parse_graph(text, graph.constants)
    assert print_graph(again) == text
    verify(again)
    assert set(again.constants) == set(graph.constants)
    expected = support.run_interpreter(graph, zoo_case.inputs)
    for a, e in zip(support.run_interpreter(again, zoo_case.inputs), expected, strict=True):
        support.assert_identical(a, e)
