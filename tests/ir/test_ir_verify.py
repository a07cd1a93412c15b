"""verify(): accepts every captured zoo graph, rejects malformed graphs with a clear message.

Malformed graphs cannot be written as IR text (the parser refuses most of them), so they are
built here from `Node` and `Graph` directly.
"""

from __future__ import annotations

import pytest
import torch

from kiln.ir import Graph, Node, Op, TensorType, VerificationError, parse_graph, verify
from kiln.ir import attrs as A
from kiln.ir.graph import make_constant, make_input, make_scalar
from kiln.ir.types import DType

F4 = TensorType((4,), DType.F32)


def _x() -> Node:
    return make_input(0, "x", F4)


def _relu(x: Node, types: tuple[TensorType, ...] = (F4,), name: str = "a") -> Node:
    return Node(Op.RELU, (x.out(),), A.NO_ATTRS, types, name)


def _problems(graph: Graph) -> list[str]:
    with pytest.raises(VerificationError) as info:
        verify(graph)
    assert str(info.value).startswith("malformed kiln graph:")
    for problem in info.value.problems:
        assert problem in str(info.value)
    return info.value.problems


def test_accepts_a_well_formed_graph() -> None:
    x = _x()
    w = make_constant("w", torch.zeros(4))
    c = make_scalar(2.0)
    a = _relu(x)
    b = Node(Op.MUL, (a.out(), c.out()), A.NO_ATTRS, (F4,), "b")
    s = Node(Op.ADD, (b.out(), w.out()), A.NO_ATTRS, (F4,), "s")
    assert verify(Graph([x], [w, c, a, b, s], [s.out(), x.out(), w.out()],
                        {"w": torch.zeros(4)})) is None


def test_accepts_every_zoo_graph(zoo_case) -> None:
    verify(zoo_case.graph)


def test_operand_used_before_defined() -> None:
    x = _x()
    a = _relu(x)
    b = Node(Op.NEG, (a.out(),), A.NO_ATTRS, (F4,), "b")
    assert _problems(Graph([x], [b, a], [b.out()])) == [
        "node %b (%b = neg(%a) : f32[4]): operand %a is not defined before it"]


def test_operand_missing_from_graph() -> None:
    x = _x()
    a = _relu(x)
    b = Node(Op.NEG, (a.out(),), A.NO_ATTRS, (F4,), "b")
    assert _problems(Graph([x], [b], [b.out()])) == [
        "node %b (%b = neg(%a) : f32[4]): operand %a is not defined before it"]


def test_operand_output_index_out_of_range() -> None:
    x = make_input(0, "x", TensorType((4, 2), DType.F32))
    halves = (TensorType((2, 2), DType.F32),) * 2
    s = Node(Op.SPLIT, (x.out(),), A.SplitAttrs((2, 2), 0), halves, "s")
    r = Node(Op.RELU, (s.out(2),), A.NO_ATTRS, halves[:1], "r")
    (problem,) = _problems(Graph([x], [s, r], [r.out()]))
    assert problem.endswith("operand %s#2 has no output 2")


@pytest.mark.parametrize("declared", [TensorType((5,), DType.F32), TensorType((4,), DType.F64),
                                      TensorType((4, 1), DType.F32)], ids=str)
def test_wrong_declared_type(declared: TensorType) -> None:
    x = _x()
    (problem,) = _problems(Graph([x], [_relu(x, (declared,))], []))
    assert problem == (f"node %a (%a = relu(%x) : {declared}): declared type does not match "
                       f"the op's result (f32[4])")


def test_wrong_number_of_declared_outputs() -> None:
    x = _x()
    s = Node(Op.SPLIT, (x.out(),), A.SplitAttrs((2, 2), 0), (TensorType((2,), DType.F32),), "s")
    (problem,) = _problems(Graph([x], [s], []))
    assert "declared type does not match the op's result (f32[2], f32[2])" in problem


def test_node_without_outputs() -> None:
    x = _x()
    (problem,) = _problems(Graph([x], [_relu(x, ())], []))
    assert problem.endswith(": has no outputs and no effect")


@pytest.mark.parametrize(("op", "attrs", "message"), [
    (Op.SOFTMAX, A.DimAttrs(0), "attributes are DimAttrs, softmax takes SoftmaxAttrs"),
    (Op.RELU, A.SoftmaxAttrs(0), "attributes are SoftmaxAttrs, relu takes NoAttrs"),
    (Op.SUM, A.VarAttrs(None), "attributes are VarAttrs, sum takes ReduceAttrs"),
], ids=["softmax", "relu", "sum"])
def test_wrong_attrs_class(op: Op, attrs: A.Attrs, message: str) -> None:
    x = _x()
    (problem,) = _problems(Graph([x], [Node(op, (x.out(),), attrs, (F4,), "n")], []))
    assert problem.endswith(message)


def test_missing_constant() -> None:
    w = make_constant("fc.weight", torch.zeros(4))
    assert _problems(Graph([], [w], [w.out()], {"other": torch.zeros(4)})) == [
        "node %fc.weight (%fc.weight = constant {name='fc.weight'} : f32[4]): weight "
        "'fc.weight' is missing from graph.constants"]


@pytest.mark.parametrize("tensor", [torch.zeros(5), torch.zeros(4, dtype=torch.float64),
                                    torch.zeros(())], ids=["shape", "dtype", "rank"])
def test_constant_with_wrong_type(tensor: torch.Tensor) -> None:
    w = make_constant("w", torch.zeros(4))
    (problem,) = _problems(Graph([], [w], [w.out()], {"w": tensor}))
    assert problem.endswith(f"weight 'w' is {TensorType.of(tensor)}")


def test_constant_with_operands() -> None:
    x = _x()
    w = Node(Op.CONSTANT, (x.out(),), A.ConstantAttrs("w"), (F4,), "w")
    (problem,) = _problems(Graph([x], [w], [], {"w": torch.zeros(4)}))
    assert problem.endswith("a constant takes no operands")


def test_scalar_with_wrong_type() -> None:
    c = Node(Op.SCALAR, (), A.ScalarAttrs(1.0), (TensorType((), DType.I64),), "c")
    assert _problems(Graph([], [c], [])) == [
        "node %c (%c = scalar {value=1.0} : i64[]): a scalar ScalarAttrs(value=1.0) has type "
        "f64[]"]


def test_input_index_mismatch() -> None:
    x = make_input(1, "x", F4)
    assert _problems(Graph([x], [], [x.out()])) == ["input %x is at position 0 but says 1"]


def test_graph_input_that_is_not_an_input_node() -> None:
    x = _x()
    assert _problems(Graph([_relu(x)], [], [])) == [
        "graph input 0 is a relu node, not an input"]


def test_input_node_in_the_body() -> None:
    x = _x()
    y = make_input(1, "y", F4)
    (problem,) = _problems(Graph([x], [y], [y.out()]))
    assert problem.endswith("inputs belong in the graph header, not the body")


def test_node_listed_twice() -> None:
    x = _x()
    a = _relu(x)
    (problem,) = _problems(Graph([x], [a, a], [a.out()]))
    assert problem.endswith("appears twice in the graph")


def test_output_not_in_graph() -> None:
    x = _x()
    a = _relu(x)
    assert _problems(Graph([x], [], [x.out(), a.out()])) == [
        "output 1 (%a) is not computed by the graph"]


def test_output_index_out_of_range() -> None:
    x = _x()
    a = _relu(x)
    (problem,) = _problems(Graph([x], [a], [a.out(1)]))
    assert problem.startswith("output 0:") and problem.endswith("has no output 1")


def test_every_problem_is_listed() -> None:
    x = make_input(3, "x", F4)
    a = _relu(x, (TensorType((4,), DType.F16),))
    w = make_constant("w", torch.zeros(4))
    assert len(_problems(Graph([x], [a, w], [a.out(5)]))) == 4


def test_check_types_false_skips_type_inference() -> None:
    x = _x()
    graph = Graph([x], [_relu(x, (TensorType((5,), DType.F32),))], [])
    verify(graph, check_types=False)
    with pytest.raises(VerificationError):
        verify(graph)


def test_parsed_call_with_wrong_dtype_is_rejected() -> None:
    graph = parse_graph("""\
graph(%x: f32[4]) {
  %y = call(%x) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=()} : f64[4]
  return %y
}""")
    (problem,) = _problems(graph)
    assert "declared type does not match the op's result (f32[4])" in problem


def test_parsed_call_with_wrong_shape_is_rejected() -> None:
    graph = parse_graph("""\
graph(%x: f32[4]) {
  %y = call(%x) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=()} : f32[5]
  return %y
}""")
    (problem,) = _problems(graph)
    assert "declared type does not match the op's result (f32[4])" in problem


def test_call_template_holding_a_tensor_does_not_crash_verify() -> None:
    x = _x()
    attrs = A.CallAttrs(torch.ops.aten.add.Tensor, (A.Operand(0), torch.ones(4)))
    call = Node(Op.CALL, (x.out(),), attrs, (F4,), "call")
    try:
        verify(Graph([x], [call], [call.out()]))
    except VerificationError:
        pass  # reporting the tensor as a problem is fine; any other exception is not
