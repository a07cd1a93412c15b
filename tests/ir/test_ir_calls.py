"""kiln.ir.calls: an opaque call with an effect survives the passes; a pure one may go."""

import pytest
import torch

from kiln.ir import attrs as A
from kiln.ir import calls
from kiln.ir.builder import GraphBuilder
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.ir.verify import verify
from kiln.passes.cse import eliminate_common_subexpressions
from kiln.passes.dce import eliminate_dead_code
from kiln.runtime.executor import build_executor

aten = torch.ops.aten


def _check_errors_graph():
    """y = x * 2, plus the singular-matrix check of an info tensor nobody reads."""
    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((3,), DType.F32))
    info = b.input("info", TensorType((), DType.I32))
    check = A.CallAttrs(aten._linalg_check_errors.default, (A.Operand(0), "linalg.inv"),
                        (("is_matrix", True),))
    effect = b.node(Op.CALL, info, attrs=check, types=())
    b.node(Op.CALL, info, attrs=check, types=())  # a second check is not a duplicate
    y = b.node(Op.MUL, x, b.scalar(2.0)).out()
    return b.build(y), effect


def test_effects_and_purity_are_read_from_the_op():
    graph, effect = _check_errors_graph()
    assert calls.has_effect(effect) and not calls.is_pure(effect)
    mul = graph.nodes[-1]
    assert not calls.has_effect(mul) and calls.is_pure(mul)
    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((3,), DType.F32))
    rand = b.node(Op.CALL, x, attrs=A.CallAttrs(aten.rand_like.default, (A.Operand(0),)))
    assert not calls.has_effect(rand) and not calls.is_pure(rand)  # random: never merged


def test_effect_without_outputs_verifies_and_outlives_cse_and_dce():
    graph, _ = _check_errors_graph()
    verify(graph)
    kept = eliminate_dead_code(eliminate_common_subexpressions(graph))
    assert [n.op for n in kept.nodes].count(Op.CALL) == 2


def test_effect_runs_in_the_executor():
    graph, _ = _check_errors_graph()
    run, _ = build_executor(graph, None, (0, 1), [])
    (y,) = run([torch.ones(3), torch.tensor(0, dtype=torch.int32)])
    torch.testing.assert_close(y, torch.full((3,), 2.0))
    with pytest.raises(torch.linalg.LinAlgError):
        run([torch.ones(3), torch.tensor(2, dtype=torch.int32)])


def test_an_op_that_returns_nothing_is_run_for_its_effect():
    """``_assert_async`` (one_hot's bounds check) is registered with no effect, but returns
    nothing: it exists to raise."""
    assert calls.target_has_effect(aten._assert_async.msg)
    assert calls.target_has_effect(aten._assert_async.default)
    assert not calls.target_has_effect(aten.any.default)


def test_a_substitution_keeps_an_effects_operands():
    """A rewrite elsewhere in the graph (here: y's mul) rebuilt the body without the nodes
    only an assertion read, which then read an undefined value."""
    from kiln.ir.graph import Node, substitute

    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((3,), DType.F32))
    ok = b.node(Op.GE, x, b.scalar(0.0)).out()
    cond = b.node(Op.CALL, ok, attrs=A.CallAttrs(aten.all.default, (A.Operand(0),)),
                  types=(TensorType((), DType.BOOL),)).out()
    b.node(Op.CALL, cond, attrs=A.CallAttrs(aten._assert_async.msg, (A.Operand(0), "x < 0")),
           types=())
    y = b.node(Op.MUL, x, b.scalar(2.0)).out()
    graph = b.build(y)
    negated = Node(Op.NEG, (graph.inputs[0].out(),), A.NO_ATTRS, (y.type,), "negated")
    rewritten = substitute(graph, {y: negated.out()})  # (y -> -x)
    verify(rewritten)
    assert [n.op for n in rewritten.nodes].count(Op.CALL) == 2  # all, and the assertion
    run, _ = build_executor(rewritten, None, (0,), [])
    torch.testing.assert_close(run([torch.ones(3)])[0], -torch.ones(3))
    with pytest.raises(RuntimeError, match="x < 0"):
        run([-torch.ones(3)])
