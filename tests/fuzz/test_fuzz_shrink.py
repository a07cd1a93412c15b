"""The shrinker, on bugs planted in the engine: a pass that computes the wrong thing, and one
that crashes. The shrunk case is small, its IR text reloads, and it still fails (and passes
once the bug is gone)."""

from __future__ import annotations

import pytest
import torch
from planted_bugs import maximum_becomes_minimum, real_pipeline

import kiln.engine
from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.check import Failure, Kind, check_case, config_named, reference
from kiln.fuzz.generate import generate_case
from kiln.fuzz.repro import read_repro, write_repro
from kiln.fuzz.shrink import rebuild, shrink
from kiln.fuzz.values import Layout, LayoutKind
from kiln.ir import GraphBuilder, Op, TensorType, parse_graph, verify
from kiln.ir.graph import Node
from kiln.ir.types import DType

O1 = config_named("O1")


def crash_on_softmax(graph, options, *args, **kwargs):
    if any(n.op is Op.SOFTMAX for n in graph.nodes):
        raise IndexError("planted crash")
    return real_pipeline(graph, options, *args, **kwargs)


def first_failing(bug, monkeypatch, tmp_path, wanted: Op) -> tuple[Case, Failure]:
    monkeypatch.setattr(kiln.engine, "run_pipeline", bug)
    for index in range(400):
        case = generate_case(11, index)
        if not any(n.op is wanted for n in case.graph.nodes) or len(case.graph.nodes) < 4:
            continue
        outcome = check_case(case, [O1], str(tmp_path), stop_at_first=True)
        if outcome.failures:
            return case, outcome.failures[0]
    pytest.fail(f"no generated graph with {wanted.text} fails under the planted bug")


def computing(case: Case) -> list[Node]:
    return [n for n in case.graph.nodes if n.op not in (Op.CONSTANT, Op.SCALAR)]


def test_shrinks_a_wrong_answer_to_the_op_and_writes_a_reproducer(monkeypatch, tmp_path):
    case, failure = first_failing(maximum_becomes_minimum, monkeypatch, tmp_path, Op.MAXIMUM)
    assert failure.kind is Kind.MISMATCH
    small = shrink(case, failure, str(tmp_path))
    assert [n.op for n in computing(small)] == [Op.MAXIMUM], small.graph
    assert len(small.graph.nodes) < len(case.graph.nodes)
    verify(small.graph)

    kir = write_repro(small, tmp_path / "repro", str(failure))
    text = kir.read_text()
    assert parse_graph(text, small.graph.constants) is not None  # plain IR text
    loaded, note = read_repro(kir)
    assert note == str(failure)
    assert loaded.graph.num_ops() == 1
    for got, want in zip(loaded.materialize(), small.materialize()):
        assert torch.equal(got.isnan(), want.isnan())
    still = check_case(loaded, [O1], str(tmp_path)).failures
    assert still and still[0].same_bug(failure)

    monkeypatch.setattr(kiln.engine, "run_pipeline", real_pipeline)
    assert check_case(loaded, [O1], str(tmp_path)).ok  # the bug gone, the case passes


def test_shrinks_a_crash(monkeypatch, tmp_path):
    case, failure = first_failing(crash_on_softmax, monkeypatch, tmp_path, Op.SOFTMAX)
    assert failure.kind is Kind.CRASH and "IndexError" in failure.detail
    small = shrink(case, failure, str(tmp_path))
    assert [n.op for n in computing(small)] == [Op.SOFTMAX], small.graph


def test_a_failure_of_another_kind_is_not_the_same_bug():
    crash = Failure("O1", Kind.CRASH, "compile: IndexError: x")
    assert crash.same_bug(Failure("O1", Kind.CRASH, "compile: IndexError: y"))
    assert not crash.same_bug(Failure("O1", Kind.CRASH, "compile: KeyError: x"))
    assert not crash.same_bug(Failure("O2", Kind.CRASH, "compile: IndexError: x"))
    assert not crash.same_bug(Failure("O1", Kind.MISMATCH, "exact: values differ"))


def test_rebuild_cuts_a_node_into_an_input_and_keeps_aliases():
    b = GraphBuilder()
    t = TensorType((2, 3), DType.F32)
    x, y = b.input("x", t), b.input("y", t)
    e = b.op(Op.EXP, x)
    s = b.op(Op.ADD, e, y)
    graph = b.build(b.op(Op.NEG, s))
    values = torch.randn(2, 3)
    case = Case(graph, (FuzzInput(values), FuzzInput(values, Layout(LayoutKind.ALIAS, 0))))
    expected = reference(case).outputs[0]

    cut = rebuild(case, cut={s: -expected})  # the neg's operand becomes an input
    assert [n.op for n in cut.graph.nodes] == [Op.NEG]
    assert [n.name for n in cut.graph.inputs] == ["add"]
    assert torch.equal(reference(cut).outputs[0], expected)

    dropped = rebuild(case, cut={e: torch.exp(values)})  # x unused: y's alias of x resolves
    assert [n.name for n in dropped.graph.inputs] == ["y", "exp"]
    assert dropped.inputs[0].layout.kind is LayoutKind.CONTIGUOUS
    assert torch.equal(reference(dropped).outputs[0], expected)


def test_a_mismatch_stays_the_same_bug_only_with_the_same_kind_of_difference():
    nan = Failure("O1", Kind.MISMATCH, "exact: NaN positions differ at 3 of 9 elements, ...")
    assert nan.same_bug(Failure("O1", Kind.MISMATCH, "close: NaN positions differ at 1 of 2"))
    assert not nan.same_bug(Failure("O1", Kind.MISMATCH, "exact: values differ at 1 of 4"))
    dtype = Failure("O0", Kind.MISMATCH, "exact: got torch.float32 (4,), expected torch.bf16")
    assert dtype.same_bug(Failure("O0", Kind.MISMATCH, "exact: got torch.int64 (), expected"))
    assert not dtype.same_bug(Failure("O0", Kind.MISMATCH, "close: beyond rtol 0.0001 at 1"))


def test_a_type_the_ir_gets_wrong_is_a_failure_of_the_reference(tmp_path):
    # ATen's meta kernel says layer_norm's mean is float32 for a bfloat16 input; the CPU
    # kernel returns bfloat16 (a known gap, not reported itself, and the generator leaves
    # those outputs alone; a tanh reading one is wrong all the same)
    from kiln.fuzz.check import REFERENCE

    graph = parse_graph("""graph(%x: bf16[4, 3], %w: bf16[3]) {
  %ln = layer_norm(%x, %w, %w) {normalized_shape=(3,), eps=1e-05} \
: (bf16[4, 3], f32[4, 1], f32[4, 1])
  %t = tanh(%ln#1) : f32[4, 1]
  return %t
}
""")
    case = Case(graph, (FuzzInput(torch.randn(4, 3).bfloat16()),
                        FuzzInput(torch.randn(3).bfloat16())))
    outcome = check_case(case, [O1], str(tmp_path))
    (failure,) = outcome.failures
    assert failure.config == REFERENCE and failure.kind is Kind.WRONG_TYPE
    assert "%t (tanh)" in failure.detail and "bf16" in failure.detail
    small = shrink(case, failure, str(tmp_path))
    assert [n.op for n in computing(small)] == [Op.LAYER_NORM, Op.TANH]
