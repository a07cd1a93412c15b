"""kiln.compile compares the compiled model with the model on the example inputs: a capture
that differs from the model, or a wrong compiled graph, runs the model eagerly with a
warning that says which; random models are not compared; real models compare equal; the
comparison itself. (The suite turns the comparison off elsewhere: tests/conftest.py.)"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln import engine
from kiln.frontend import agreement
from kiln.frontend.agreement import Disagreement, disagreement, draws_random
from kiln.frontend.dynamo import kiln_backend
from kiln.frontend.export import capture
from kiln.models import build
from kiln.report import CompileReport

CHECKED = kiln.Options(check_outputs=True)


class CapturedOtherwise(nn.Module):
    """Computes one thing eagerly and another under torch.export, as Hugging Face's mask
    code does where it asks whether it is traced (AIMv2's text tower, transformers 5.24)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_exporting():
            return torch.tanh(x) * 2
        return torch.tanh(x)


def test_a_capture_that_differs_from_the_model_runs_it_eagerly(caplog) -> None:
    x = torch.randn(3, 8)
    with caplog.at_level("WARNING", logger="kiln"):
        compiled = kiln.compile(CapturedOtherwise(), (x,), CHECKED)
    torch.testing.assert_close(compiled(x), torch.tanh(x))
    (fallback,) = compiled.report.fallbacks
    assert "disagrees with the model on the example inputs" in fallback
    assert "the capture differs from the model" in fallback and "runs eagerly" in fallback
    assert any("runs eagerly" in r.getMessage() for r in caplog.records)
    with pytest.raises(Disagreement, match="CapturedOtherwise disagrees .* the capture differs"):
        kiln.compile(CapturedOtherwise(), (x,), kiln.Options(strict=True, check_outputs=True))


@pytest.fixture
def off_by_one(monkeypatch):  # noqa: ANN201
    """kiln's compiled graphs made wrong: each output one more than it should be."""
    real = engine.CompiledGraph.__call__

    def wrong(self, args):  # noqa: ANN001, ANN202
        return [y + 1 if isinstance(y, torch.Tensor) else y for y in real(self, args)]

    monkeypatch.setattr(engine.CompiledGraph, "__call__", wrong)


def test_a_wrong_compiled_graph_is_called_a_kiln_bug(off_by_one) -> None:  # noqa: ANN001
    """The captured program agrees with the model, kiln's graph does not: the model runs.
    With sizes left symbolic, each shape's first call also runs the captured graph, and that
    graph runs from then on."""
    x = torch.randn(3, 8)
    linear = nn.Linear(8, 4)
    compiled = kiln.compile(linear, (x,), CHECKED)
    (fallback,) = compiled.report.fallbacks
    assert "captured program agrees: a kiln bug" in fallback
    batch = {0: torch.export.Dim("batch", max=64)}
    symbolic = kiln.compile(linear, (x,), CHECKED, dynamic_shapes=(batch,))
    (fallback,) = symbolic.report.fallbacks
    assert "compiled graph disagrees with the graph it was given" in fallback
    with torch.no_grad():
        for rows in (3, 3, 7):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x) if rows == 3 else symbolic(x), linear(x))
            torch.testing.assert_close(symbolic(x), linear(x))
    assert len(symbolic.report.fallbacks) == 2  # (7 rows: another compile, checked too)
    with pytest.raises(Disagreement, match="a kiln bug"):
        kiln.compile(linear, (x,), kiln.Options(strict=True, check_outputs=True))


def test_torch_compile_checks_each_graph_s_first_call(off_by_one) -> None:  # noqa: ANN001
    """Through Dynamo, per graph and per input shape (a graph with symbolic shapes is
    compiled again for each)."""
    report = CompileReport()
    linear = nn.Linear(8, 4)
    fast = torch.compile(linear, backend=functools.partial(kiln_backend, report=report,
                                                           options=CHECKED), dynamic=True)
    with torch.no_grad():
        for rows in (3, 5, 5):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(fast(x), linear(x))
    assert len(report.fallbacks) == 2
    assert all("a kiln bug" in f for f in report.fallbacks)


def test_an_agreeing_model_costs_one_extra_call_and_no_fallback() -> None:
    calls = []

    class Counted(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not torch.compiler.is_exporting():
                calls.append(1)
            return F.gelu(x) * 3

    x = torch.randn(4, 16)
    checked = kiln.compile(Counted(), (x,), CHECKED)
    assert not checked.report.fallbacks and len(calls) == 1
    calls.clear()
    kiln.compile(Counted(), (x,), kiln.Options(check_outputs=False))
    assert not calls


def test_a_model_that_draws_random_numbers_is_not_compared() -> None:
    class Noisy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.rand_like(x)

    x = torch.zeros(2, 5)
    state = torch.get_rng_state()
    compiled = kiln.compile(Noisy(), (x,), CHECKED)
    assert not compiled.report.fallbacks
    assert torch.equal(torch.get_rng_state(), state)  # (no extra draw by the model)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "gpt2", "hf_bert",
                                  "hf_llama_decode"])
def test_real_models_agree(name: str) -> None:
    """No false alarm: the quick zoo and HF models compile to graphs that agree with them,
    generated kernels and all, through kiln.compile and torch.compile."""
    torch.manual_seed(0)
    model, inputs = build(name, quick=True, seed=0)
    with torch.no_grad():
        compiled = kiln.compile(model, inputs, CHECKED)
        assert not compiled.report.fallbacks
        report = CompileReport()
        torch._dynamo.reset()
        fast = torch.compile(model, backend=functools.partial(kiln_backend, report=report,
                                                               options=CHECKED))
        fast(*inputs)
        assert report.graphs and not report.fallbacks


def _graph(fn, *inputs: torch.Tensor) -> torch.fx.GraphModule:  # noqa: ANN001
    class Wrapped(nn.Module):
        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return fn(*args)

    with torch.no_grad():
        return capture(Wrapped(), inputs).graph_module


def test_draws_random_knows_a_dropout_that_is_told_not_to() -> None:
    x = torch.randn(1, 2, 6, 8)
    assert draws_random(_graph(lambda a: F.dropout(a, 0.5, training=True), x))
    assert draws_random(_graph(lambda a: a * torch.rand_like(a), x))
    assert not draws_random(_graph(lambda a: F.dropout(a, 0.5, training=False) + 1, x))
    # ATen's fused attention is tagged as drawing for its dropout; at 0 it draws nothing
    graph = _graph(lambda q: F.scaled_dot_product_attention(q, q, q), x)
    tagged = [n for n in graph.graph.nodes if n.op == "call_function"
              and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    assert tagged and not draws_random(graph)


def test_disagreement_of_floats_scales_with_the_output() -> None:
    ref = torch.randn(64, 64) * 1e3
    assert disagreement(ref, ref + 1e-4 * ref.abs().max()) is None  # summation-order noise
    why = disagreement(ref, ref + 3e-3 * ref.abs().max())
    assert why is not None and why.startswith("the output: largest difference")
    assert disagreement(ref, ref.double()) == "the output: float64[64, 64] where the model's " \
                                              "is float32[64, 64]"
    assert disagreement(ref, ref[:-1]) is not None
    # values at the top of float32: the difference overflows, and still disagrees
    top = torch.tensor([3e38, 1.0])
    assert "largest difference inf" in disagreement(top, -top)
    assert disagreement(top, top.clone()) is None
    # narrow floats are compared widened: bfloat16 steps of 1/128 near 1 are within 1e-3 of
    # a largest value of 100, a step near 100 is not
    wide = torch.tensor([1.0, 100.0], dtype=torch.bfloat16)
    assert disagreement(wide, wide + torch.tensor([2 ** -7, 0.0], dtype=torch.bfloat16)) is None
    assert disagreement(wide, wide + torch.tensor([0.0, 0.5], dtype=torch.bfloat16)) is not None
    # a transposed output, and an empty one
    assert disagreement(ref.t(), ref.t().contiguous()) is None
    assert disagreement(torch.empty(0, 3), torch.empty(0, 3)) is None


def test_disagreement_of_special_values_integers_and_structure() -> None:
    ref = torch.tensor([1.0, math.nan, math.inf, -math.inf, -0.0])
    assert disagreement(ref, ref.clone()) is None
    for broken in ([1.0, 0.0, math.inf, -math.inf, 0.0], [1.0, math.nan, -math.inf, -math.inf,
                                                         0.0], [math.nan, math.nan, math.inf,
                                                                -math.inf, 0.0]):
        assert "NaN or infinity at 1 of 5" in disagreement(ref, torch.tensor(broken))
    ints = torch.arange(6)
    assert disagreement(ints, ints.flip(0)) == "the output: 6 of 6 values differ"
    assert disagreement((ints, ref), (ints, ref.clone())) is None
    assert disagreement((ints, ref), (ints,)) == "the model returns 2 values, the compiled " \
                                                 "model 1"
    assert disagreement((ints, 3), (ints, 4)) == "output 1 is 4 where the model's is 3"
    assert disagreement({"a": ints}, [ints]) is not None  # (another structure)
    complex_ref = torch.randn(4, dtype=torch.complex64)
    assert disagreement(complex_ref, complex_ref * 1j) is not None
    assert disagreement(complex_ref.conj(), complex_ref.conj().clone()) is None  # (views)
    assert disagreement(complex_ref.conj(), complex_ref) is not None
    sparse = torch.eye(4).to_sparse()
    assert disagreement(sparse, torch.eye(4).to_sparse()) is None
    assert disagreement(sparse, (2 * torch.eye(4)).to_sparse()) is not None
    assert disagreement(sparse.to_sparse_csr(), sparse.to_sparse_csr()) is None
    assert agreement.RTOL < 1e-2
