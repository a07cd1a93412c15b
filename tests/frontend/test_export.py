"""kiln.compile: ahead-of-time compile, report, and clear errors for wrong calls."""

import logging
import re
import warnings

import pytest
import torch
import torch.nn as nn
from torch.export import ExportedProgram

import kiln
from kiln.passes.pipeline import PIPELINE


class Branchy(nn.Module):
    """Data-dependent control flow: torch.export refuses it, Dynamo splits it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return torch.relu(y)
        return y * 2


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def test_compile_matches_eager_and_reports():
    model, x = _model(), torch.randn(3, 8)
    compiled = kiln.compile(model, (x,), options=kiln.Options(debug=True))
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    report = compiled.report
    assert len(report.graphs) == 1
    assert report.op_counts() == {"addmm": 1, "addmm_act": 1}  # the relu rides on the GEMM
    assert report.nodes_before >= report.nodes_after > 0
    assert [p.name for p in report.graphs[0].passes] == [p.name for p in PIPELINE
                                                         if p.min_level <= 2 and p.name != "pet"]
    assert 0 < report.planned_peak_bytes <= report.intermediate_bytes
    assert "kiln compile report" in str(report)


def test_a_single_tensor_is_accepted_as_example_inputs():
    model, x = _model(), torch.randn(2, 8)
    with torch.no_grad():
        assert torch.allclose(kiln.compile(model, x)(x), model(x), atol=1e-6)


def test_wrong_number_of_inputs_says_what_was_expected():
    model, x = _model(), torch.randn(3, 8)
    compiled = kiln.compile(model, (x,))
    with pytest.raises(TypeError, match=r"takes 1 tensor argument.*float32\[3, 8\].*2 given"):
        compiled(x, x)


def test_wrong_shape_says_expected_and_given():
    model, x = _model(), torch.randn(3, 8)
    compiled = kiln.compile(model, (x,))
    with pytest.raises(ValueError, match=r"expected float32\[3, 8\], got float32\[5, 8\]"):
        compiled(torch.randn(5, 8))


def test_wrong_dtype_is_rejected():
    model, x = _model(), torch.randn(3, 8)
    compiled = kiln.compile(model, (x,))
    with pytest.raises(ValueError, match="float64"):
        compiled(x.double())


def test_non_tensor_example_input_is_a_clear_error():
    with pytest.raises(TypeError, match="example input 1 is a int"):
        kiln.compile(_model(), (torch.randn(2, 8), 3))


class FailsOnlyInTheTrace(nn.Module):
    """A shape rule that raises under torch.export only (as Informer's attention does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_exporting():
            return torch.mm(x, x)  # a 1-d x: the fake kernel's shape check raises
        return x * 2


def test_a_failed_capture_is_reported_once_without_torchs_logged_traceback(caplog):
    torch._dynamo.reset()
    x = torch.randn(3)
    with caplog.at_level(logging.DEBUG):
        compiled = kiln.compile(FailsOnlyInTheTrace(), (x,))
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses")]
    assert any("torch.export could not capture" in f and "must be 2D" in f
               for f in compiled.report.fallbacks)
    assert torch.equal(compiled(x), x * 2)
    assert logging.getLogger("torch._subclasses.fake_tensor").level == logging.NOTSET


def test_model_export_cannot_capture_falls_back_to_dynamo(caplog):
    torch._dynamo.reset()
    model, x = Branchy().eval(), torch.randn(2, 4)
    compiled = kiln.compile(model, (x,))
    assert any("torch.export could not capture" in f for f in compiled.report.fallbacks)
    with torch.no_grad():
        for sample in (x, -x):
            assert torch.allclose(compiled(sample), model(sample), atol=1e-6)
    assert compiled.report.graphs, "the pieces Dynamo captured are compiled by kiln"


class Untraceable(nn.Module):
    """Runs eagerly, but torch.export cannot trace it."""

    def forward(self, x):
        if torch.compiler.is_compiling():
            raise RuntimeError("no tracer gets through this model")
        return x * 2 + 1


def test_a_model_no_tracer_captures_runs_eagerly_with_a_warning(caplog, monkeypatch):
    """Where Dynamo fails too (torch's own shape checks fail LongT5's transient-global
    attention under both tracers), the model runs eagerly, with a warning."""
    from kiln.frontend import export

    def dynamo_fails(*args):
        raise RuntimeError("Dynamo could not trace it either")

    monkeypatch.setattr(export, "_compile_dynamo", dynamo_fails)
    x = torch.randn(2, 4)
    with caplog.at_level("WARNING", logger="kiln"):
        compiled = kiln.compile(Untraceable(), (x,))
    assert any("it runs eagerly" in f and "either" in f for f in compiled.report.fallbacks)
    assert any("it runs eagerly" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    with pytest.raises(RuntimeError, match="no tracer"):  # strict: the tracer's error
        kiln.compile(Untraceable(), (x,), kiln.Options(strict=True))


class Broken(nn.Module):
    def forward(self, x):
        return x @ torch.ones(3, 3)  # (x is 2x4: the model's own error, in every mode)


def test_a_model_that_fails_eagerly_too_raises_its_own_error():
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        kiln.compile(Broken(), (torch.randn(2, 4),))


def test_strict_mode_raises_instead_of_falling_back():
    with pytest.raises(Exception):  # noqa: B017 - torch.export's own error type
        kiln.compile(Branchy().eval(), (torch.randn(2, 4),), kiln.Options(strict=True))


class CastsAndChecks(nn.Module):
    """``.to(dtype)`` on a float tensor: torch.export records aten._assert_tensor_metadata."""

    def forward(self, x):
        y = torch.softmax(x, dim=-1).to(torch.float32)
        return y * x.to(x.dtype)


def test_export_metadata_checks_are_verified_and_dropped():
    x = torch.randn(2, 5)
    exported = torch.export.export(CastsAndChecks(), (x,))
    targets = {n.target for n in exported.graph.nodes}
    assert torch.ops.aten._assert_tensor_metadata.default in targets  # what torch 2.13 emits
    compiled = kiln.compile(CastsAndChecks(), (x,), options=kiln.Options(strict=True))
    torch.testing.assert_close(compiled(x), CastsAndChecks()(x))
    assert not compiled.report.graphs[0].opaque_ops


def test_a_metadata_check_that_fails_statically_is_refused():
    from kiln.frontend.importer import UnsupportedGraph, import_fx

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    check = graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (x,),
                                {"dtype": torch.float64})
    check.meta["val"] = None
    graph.output((x,))
    with pytest.raises(UnsupportedGraph, match="metadata check fails"):
        import_fx(torch.fx.GraphModule({}, graph), {}, torch.device("cpu"))


def test_op_with_an_effect_keeps_its_check():
    """torch.export threads an effect token through linalg.inv's singular-matrix check."""
    class Inverse(nn.Module):
        def forward(self, a):
            return torch.linalg.inv(a) + 1

    a = torch.randn(4, 4) + 4 * torch.eye(4)
    compiled = kiln.compile(Inverse(), [a], kiln.Options(strict=True))
    torch.testing.assert_close(compiled(a), torch.linalg.inv(a) + 1)
    assert "aten._linalg_check_errors.default" in compiled.report.graphs[0].opaque_ops
    with pytest.raises(torch.linalg.LinAlgError):
        compiled(torch.zeros(4, 4))


class PositiveSum(nn.Module):
    """Boolean-mask indexing: the result's size (u0) is known only when it runs."""

    def forward(self, x):
        return torch.relu(x)[x > 0].sum() * 2 + x.mean()


def test_a_size_that_depends_on_the_data_goes_through_torch_compile():
    x = torch.randn(4, 8)
    exported = torch.export.export(PositiveSum(), (x,)).run_decompositions()
    targets = {n.target for n in exported.graph.nodes}
    assert torch.ops.aten._assert_scalar.default in targets  # 0 <= u0 <= 32, at run time
    torch._dynamo.reset()
    compiled = kiln.compile(PositiveSum(), (x,))
    (fallback,) = compiled.report.fallbacks
    assert re.search(r"u\d+ depends on the data at node 'index'", fallback)
    assert "compiling through torch.compile(backend='kiln') instead" in fallback
    assert compiled.report.graphs, "kiln compiles the graphs around the data-dependent op"
    for sample in (x, -x, torch.randn(4, 8)):
        torch.testing.assert_close(compiled(sample), PositiveSum()(sample))
    from kiln.frontend.importer import UnsupportedGraph

    with pytest.raises(UnsupportedGraph, match=r"sizes known before the run; u\d+ depends on"):
        kiln.compile(PositiveSum(), (x,), kiln.Options(strict=True))


class Rows(nn.Module):
    """Its batch size can be left symbolic; it branches on the parity of another size."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x, y):
        scale = 2.0 if y.shape[0] % 2 == 0 else 3.0
        return torch.softmax(self.fc(x), dim=-1).reshape(x.shape[0] * 2, 2) * scale + y.sum()


def test_dynamic_shapes_compile_once_per_shape():
    from torch.export import Dim

    model = Rows().eval()
    x, y = torch.randn(3, 8), torch.randn(4)
    compiled = kiln.compile(model, (x, y), kiln.Options(strict=True),
                            dynamic_shapes=({0: Dim("batch", max=64)}, {0: Dim.DYNAMIC}))
    assert len(compiled.report.graphs) == 1  # the example shapes, compiled at once
    assert re.fullmatch(r"<kiln CompiledModel Rows\(float32\[s\d+, 8\], float32\[s\d+\]\)>",
                        repr(compiled))
    with torch.no_grad():
        for batch, n in ((3, 4), (7, 2), (64, 6), (3, 4)):
            x, y = torch.randn(batch, 8), torch.randn(n)
            torch.testing.assert_close(compiled(x, y), model(x, y))
    assert len(compiled.report.graphs) == 3  # one graph per distinct shape, kept
    with pytest.raises(ValueError, match=r"does not take float32\[65, 8\].*size\(\)\[0\] <= 64"):
        compiled(torch.randn(65, 8), y)
    # torch.export traced the even branch: an odd size must be refused, not answered wrongly
    with pytest.raises(ValueError, match=r"Guard failed: y.size\(\)\[0\] % 2 == 0"):
        compiled(x, torch.randn(5))
    with pytest.raises(ValueError, match=r"expected float32\[s\d+, 8\], got float32\[3, 9\]"):
        compiled(torch.randn(3, 9), y)


def test_full_like_is_a_full():
    """T5's relative position buckets: ``torch.min(pos, torch.full_like(pos, n - 1))``."""
    def buckets(x):
        pos = (x * 10).to(torch.int64)
        return torch.min(pos, torch.full_like(pos, 15)) + torch.full_like(pos, 2.7), \
            torch.full_like(x, 7, dtype=torch.float64)

    x = torch.randn(4, 6)
    compiled = kiln.compile(_Function(buckets), (x,), kiln.Options(strict=True))
    for got, expected in zip(compiled(x), buckets(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)  # 2.7 truncates to 2, as ATen
    assert not compiled.report.graphs[0].opaque_ops


def test_and_and_or_of_bool_masks_are_logical_ops_and_of_integers_stay_calls():
    """HF's attention masks combine a causal and a padding mask with ``&``: on bools it is
    logical_and (no opaque call left); on integers it works on bits and stays ATen's call."""
    def masks(x, y, i, j):
        return (x > 0) & (y < 0.5), (x > 1) | (y < 0), i & j, i | j

    x, y = torch.randn(4, 6), torch.randn(4, 6)
    i, j = torch.randint(-9, 9, (4, 6)), torch.randint(-9, 9, (4, 6))
    compiled = kiln.compile(_Function(masks), (x, y, i, j), kiln.Options(strict=True))
    for got, expected in zip(compiled(x, y, i, j), masks(x, y, i, j)):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    opaque = compiled.report.graphs[0].opaque_ops
    assert sorted(opaque) == ["aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor"]


class _Function(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class Fills(nn.Module):
    """silu, masked_fill, zeros, ones and new_ones: ops the core-ATen table would rewrite,
    which kiln converts itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.silu(x).masked_fill(x > 0.5, -1.5)
        return y + torch.zeros(x.shape) + x.new_ones(x.shape) * torch.ones(x.shape[-1])


class HardSwish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.hardswish(x) * 2 + nn.functional.hardsigmoid(x - 1)


class Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.mish(x) * 2


def _count_decompositions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = ExportedProgram.run_decompositions

    def counted(self: ExportedProgram, *args: object, **kwargs: object) -> ExportedProgram:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ExportedProgram, "run_decompositions", counted)
    return calls


def test_capture_traces_once_where_kiln_converts_every_op(monkeypatch):
    calls = _count_decompositions(monkeypatch)
    x = torch.randn(3, 5)
    compiled = kiln.compile(Fills(), (x,))
    assert not calls and not compiled.report.fallbacks
    assert not any(g.opaque_ops for g in compiled.report.graphs)  # all converted, no calls
    torch.testing.assert_close(compiled(x), Fills()(x))


def test_capture_decomposes_an_op_kiln_has_no_converter_for(monkeypatch):
    calls = _count_decompositions(monkeypatch)
    x = torch.randn(3, 5) * 4
    compiled = kiln.compile(Mish(), (x,))
    assert calls == [1] and not compiled.report.fallbacks
    opaque = {op for g in compiled.report.graphs for op in g.opaque_ops}
    assert "aten.mish.default" not in opaque  # its parts (softplus a call of ATen's)
    torch.testing.assert_close(compiled(x), Mish()(x))


def test_hardswish_and_hardsigmoid_are_converted_in_one_trace(monkeypatch):
    calls = _count_decompositions(monkeypatch)
    x = torch.linspace(-5, 5, 40).reshape(4, 10)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    compiled = kiln.compile(HardSwish(), (x,))
    assert not calls and not compiled.report.fallbacks
    assert not any(g.opaque_ops for g in compiled.report.graphs)
    torch.testing.assert_close(compiled(x), HardSwish()(x), equal_nan=True)


class StackedAttention(nn.Module):
    """_safe_softmax (DETR's attention: a fully masked row gives zeros), stack, unbind,
    zeros_like and ones_like: ops the core-ATen table would rewrite, converted by kiln."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        probs = torch.ops.aten._safe_softmax(x.masked_fill(mask, float("-inf")), -1)
        a, b, c = torch.stack([x, x * 2, x + 1], dim=1).unbind(1)
        filled = torch.zeros_like(x) + torch.ones_like(x) * 3
        return probs + a * b - c + filled, torch.stack([x, probs], -1)


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
def test_safe_softmax_stack_and_unbind_are_converted_in_one_trace(monkeypatch, entry):
    calls = _count_decompositions(monkeypatch)
    x = torch.randn(2, 4, 5)
    x[1, 3, 0], x[0, 2, 1] = float("nan"), float("inf")
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[0, 1] = True  # a row of -inf: zeros, where softmax gives NaN
    mask[1, 2, :3] = True
    model = StackedAttention()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = kiln.compile(model, (x, mask)) if entry == "kiln.compile" else \
            torch.compile(model, backend="kiln")
        got, want = compiled(x, mask), model(x, mask)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert torch.equal(want[1][0, 1, :, 1], torch.zeros(5))  # (softmax's would be NaN)
    if entry == "kiln.compile":
        assert not calls and not compiled.report.fallbacks
        assert not any(g.opaque_ops for g in compiled.report.graphs)


class ReversedSubtractions(nn.Module):
    """``1.0 - mask`` (HF's extended attention masks), rsub of two tensors, an int rsub,
    floor_divide (MoE routers) and empty_like."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        empty = torch.empty_like(y).copy_(y) + y.new_empty(y.shape).fill_(2.0)
        return (1.0 - x) * 3, torch.rsub(x, y), 0.0 - x, 2 - x.int(), \
            torch.floor_divide(x, y) + empty, torch.floor_divide(7 - x.int(), 2)


def test_rsub_floor_divide_and_empty_like_are_converted_in_one_trace(monkeypatch):
    calls = _count_decompositions(monkeypatch)
    x = torch.tensor([0.0, -0.0, 1.0, float("inf"), -float("inf"), float("nan"), -2.5])
    y = torch.randn(7)
    compiled = kiln.compile(ReversedSubtractions(), (x, y))
    assert not calls and not compiled.report.fallbacks
    assert not any(g.opaque_ops for g in compiled.report.graphs)
    for got, want in zip(compiled(x, y), ReversedSubtractions()(x, y)):
        torch.testing.assert_close(got, want, equal_nan=True)
        assert got.dtype == want.dtype
        number = ~torch.isnan(want.float())  # (a NaN's sign means nothing)
        assert torch.equal(torch.signbit(got)[number], torch.signbit(want)[number])  # 0-0 = +0


class Baddbmm(nn.Module):
    def forward(self, bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        return (torch.baddbmm(bias, q, k, alpha=0.125), torch.baddbmm(bias, q, k),
                torch.baddbmm(bias, q, k, beta=0.5, alpha=2.0),
                torch.baddbmm(bias, q, k, beta=0.0))


def test_baddbmm_is_converted_in_one_trace(monkeypatch):
    calls = _count_decompositions(monkeypatch)
    bias, q, k = torch.randn(3, 5, 7), torch.randn(3, 5, 4), torch.randn(3, 4, 7)
    bias[0, 0, 0], q[1, 2, 3] = float("nan"), float("inf")
    compiled = kiln.compile(Baddbmm(), (bias, q, k))
    assert not calls and not compiled.report.fallbacks
    assert not any(g.opaque_ops for g in compiled.report.graphs)
    for got, want in zip(compiled(bias, q, k), Baddbmm()(bias, q, k)):
        torch.testing.assert_close(got, want, equal_nan=True)
    assert not torch.isnan(compiled(bias, q, k)[3][0, 0, 0])  # beta = 0 ignores the NaN


def test_capture_takes_torch_exports_path_where_the_one_trace_fails(monkeypatch):
    real = torch.export._trace._export

    def fails(*args: object, **kwargs: object) -> ExportedProgram:
        if kwargs.get("pre_dispatch") is False:  # kiln's one trace; torch.export's own call
            # of this function passes
            raise RuntimeError("mutating a non-functional tensor with a functional tensor")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.export._trace, "_export", fails)
    calls = _count_decompositions(monkeypatch)
    x = torch.randn(3, 5)
    compiled = kiln.compile(Fills(), (x,))
    assert calls == [1] and not compiled.report.fallbacks
    torch.testing.assert_close(compiled(x), Fills()(x))


class _CachesItsBias(torch.nn.Module):
    """LeViT's habit: in eval mode the first call stores a tensor in a dict attribute, later
    calls read it back; and a plain attribute set as it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "bias" not in self.cache:
            self.cache["bias"] = self.linear.bias * 2
        self.calls = getattr(self, "calls", 0) + 1
        return self.linear(x) + self.cache["bias"]


def test_capture_leaves_the_models_attributes_as_they_were() -> None:
    """torch.export's traced tensors do not stay in the user's model: its eager calls after
    the compile work (they raised "Attempting to use FunctionalTensor on its own")."""
    torch.manual_seed(0)
    model = _CachesItsBias().eval()
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (torch's "register them as buffers" is moot here)
        compiled = kiln.compile(model, (x,))
    assert model.cache == {} and not hasattr(model, "calls")
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(compiled(x), expected)
    assert model.calls == 1 and set(model.cache) == {"bias"}


def test_a_failure_after_capture_is_named_as_kiln_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback's message tells a torch.export refusal from a kiln bug (both said
    "torch.export could not capture"); strict raises the error itself."""
    def broken(program):  # noqa: ANN001, ANN202
        raise RuntimeError("a bug")

    monkeypatch.setattr("kiln.frontend.export._freeze", broken)
    model, x = _model(), torch.randn(3, 8)
    compiled = kiln.compile(model, (x,))
    (message,) = compiled.report.fallbacks
    assert "kiln failed on the graph torch.export captured" in message and "a bug" in message
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    with pytest.raises(RuntimeError, match="a bug"):
        kiln.compile(model, (x,), kiln.Options(strict=True))


def test_a_plain_function_compiles_ahead_of_time() -> None:
    """kiln.compile takes a function too (torch.export takes modules: kiln wraps it), and
    names it in the report."""
    weight = torch.randn(8, 4)

    def project(x):
        return torch.relu(x @ weight) + 1

    x = torch.randn(3, 8)
    compiled = kiln.compile(project, (x,))
    assert compiled.report.fallbacks == [] and len(compiled.report.graphs) == 1
    torch.testing.assert_close(compiled(x), project(x))


def test_slice_writes_compile_without_opaque_copies() -> None:
    """``out[:, i] = y`` is functionalized to copy + select_scatter; copy is src broadcast to
    the slot's shape in its dtype: kiln's cast and expand, not a library call."""
    def fill(x, a):
        out = torch.zeros(2, 3, 8, dtype=torch.float64)
        out[:, 0] = a * 2  # float32 into float64, broadcast over the batch
        out[:, 1] = x[:, 0]
        return out.relu()

    x, a = torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(8)
    compiled = kiln.compile(fill, (x, a))
    torch.testing.assert_close(compiled(x, a), fill(x, a), rtol=0, atol=0)
    assert not any("copy" in op for op in compiled.report.graphs[0].opaque_ops)


class _CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x * 2


def test_a_model_writing_its_buffers_is_named_so_not_a_kiln_bug() -> None:
    model, x = _CountsCalls(), torch.randn(4)
    compiled = kiln.compile(model, (x,))
    (message, *_) = compiled.report.fallbacks
    assert "writes into its buffers or inputs (calls)" in message and "bug" not in message
    torch.testing.assert_close(compiled(x), x * 2)


class _LiteralTensors(nn.Module):
    def forward(self, x):
        return x * torch.tensor([1.0, 2.0, 3.0]) + torch.tensor(0.5)


def test_tensors_made_in_forward_are_weights_not_calls() -> None:
    """torch.tensor(...) in forward is captured as lift_fresh_copy of a constant: the
    constant itself, not an opaque copy on every call (LLaMA's and OLMo-2's rotary code)."""
    model, x = _LiteralTensors(), torch.randn(4, 3)
    compiled = kiln.compile(model, (x,))
    torch.testing.assert_close(compiled(x), model(x))  # (mul + add may fuse to one rounding)
    assert compiled.report.graphs[0].opaque_ops == ()


class _PlainNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.LayerNorm(16, elementwise_affine=False)
        self.no_bias = nn.LayerNorm(16, bias=False)

    def forward(self, x):
        return self.no_bias(self.plain(x) * 2)


def test_layer_norms_without_affine_or_bias_are_kiln_layer_norms() -> None:
    """Their missing weight and bias are ones and zeros (data2vec-audio's positional
    convolutions: 5 opaque calls before); a constant row normalizes to +0, as in eager."""
    model, x = _PlainNorms(), torch.randn(4, 16)
    x[0] = 3.0
    with torch.no_grad():
        compiled = kiln.compile(model, (x,))
        got, expected = compiled(x), model(x)
    assert compiled.report.graphs[0].opaque_ops == ()
    torch.testing.assert_close(got, expected)
    assert torch.equal(torch.signbit(got[0]), torch.signbit(expected[0]))


class _ListIndexed(nn.Module):
    """Falcon's ``qkv[..., [-2], :]``, a stepped list, and lists that are no slice."""

    def __init__(self, index: list[int], dim: int) -> None:
        super().__init__()
        self.index, self.dim = index, dim

    def forward(self, x):
        where = [slice(None)] * x.dim()
        where[self.dim] = self.index
        return x[tuple(where)] * 2


@pytest.mark.parametrize("index,dim,sliced", [
    ([-2], 2, True), ([1, 3, 5], 1, True), ([0, 1, 2, 3], -1, True), ([4, 6], 2, True),
    ([2, 1], 1, False), ([0, 0], 2, False), ([0, 2, 3], 1, False)])
def test_a_constant_index_list_that_steps_evenly_is_a_slice(index, dim, sliced) -> None:
    model, x = _ListIndexed(index, dim), torch.randn(2, 6, 7, 4)
    compiled = kiln.compile(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    graph = compiled.report.graphs[0]
    assert (graph.opaque_ops == ()) is sliced, graph.opaque_ops


class CacheStep(nn.Module):
    """A decode step's KV cache as HF's DynamicCache grows it: the past keys concatenated
    onto an empty 1-D tensor (the layer's first update), then the new token's keys onto
    that."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.register_buffer("empty", torch.tensor([], dtype=dtype))

    def forward(self, past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([self.empty, past], dim=-2)
        return torch.cat([keys, new * 2], dim=-2)


def test_a_cat_drops_its_empty_1d_operands_and_reads_the_cache_itself():
    past, new = torch.randn(1, 4, 7, 8), torch.randn(1, 4, 1, 8)
    past[0, 1, 2, 3], new[0, 2, 0, 1] = float("nan"), float("-inf")
    model = CacheStep().eval()
    compiled = kiln.compile(model, (past, new))
    with torch.no_grad():
        torch.testing.assert_close(compiled(past, new), model(past, new), equal_nan=True)
    # one copy of the cache (the cat the new token joins), none into the empty tensor's cat
    counts = compiled.report.op_counts()
    assert counts.get("cat") == 1 and "clone" not in counts, counts


def test_an_empty_operand_that_decides_the_dtype_stays():
    """torch.cat promotes over the empty operand too: f32 with bf16 values is f32."""
    past, new = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16), torch.randn(1, 2, 1, 4)
    model = CacheStep().eval()
    compiled = kiln.compile(model, (past, new))
    with torch.no_grad():
        out, expected = compiled(past, new), model(past, new)
    assert out.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(out, expected)
