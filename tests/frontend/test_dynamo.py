"""torch.compile(backend="kiln"): entry point, options, freezing, shapes, training, fallbacks."""

import logging

import pytest
import torch
import torch.nn as nn

from kiln.frontend.dynamo import kiln_backend, weight_name


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_found_by_name_through_the_entry_point():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("kiln") is kiln_backend


def test_options_are_passed_through_torch_compile():
    model = _mlp()
    x = torch.randn(3, 8)
    fast = torch.compile(model, backend="kiln", options={"opt_level": 0, "debug": True})
    with torch.no_grad():
        assert _rel(fast(x), model(x)) < 1e-6


def test_unknown_option_is_a_clear_error():
    fast = torch.compile(_mlp(), backend="kiln", options={"opt_levle": 1})
    with pytest.raises(Exception, match="opt_levle"):
        fast(torch.randn(2, 8))


def test_weight_names_come_from_the_module_path():
    src = "L['self']._modules['layer1']._modules['0']._parameters['weight']"
    assert weight_name(src) == "layer1.0.weight"
    assert weight_name("L['x']") is None
    # how Dynamo names the members of some modules (HF Swin's blocks): the names lost
    # 'layernorm_before', and two weights of a block were both "...blocks.0.__dict__.weight"
    swin = ("L['s']._modules['m']._modules['blocks']._modules['0'].__dict__['_modules']"
            "['attention']._modules['k_proj']._parameters['bias']")
    assert weight_name(swin) == "m.blocks.0.attention.k_proj.bias"
    assert weight_name("L['s'].__dict__['_buffers']['running_mean']") == "running_mean"


def test_weights_whose_names_collide_keep_their_own_tensors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where two weights get one name, the second keeps its source's full name: the compile
    used to fail ("already bound to another tensor") and the model ran eagerly."""
    monkeypatch.setattr("kiln.frontend.dynamo.weight_name", lambda source: "same")
    torch._dynamo.reset()
    model = _mlp()
    fast = torch.compile(model, backend="kiln", options={"strict": True})
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert _rel(fast(x), model(x)) < 1e-6


def test_new_shapes_stay_correct():
    model = _mlp()
    fast = torch.compile(model, backend="kiln")
    with torch.no_grad():
        for batch in (2, 3, 5, 2, 9):
            x = torch.randn(batch, 8)
            assert _rel(fast(x), model(x)) < 1e-6


def test_weight_changed_in_place_is_picked_up():
    model = _mlp()
    fast = torch.compile(model, backend="kiln")
    x = torch.randn(4, 8)
    with torch.no_grad():
        before = fast(x)
        model[0].weight.mul_(2.0)
        after = fast(x)
        assert _rel(after, model(x)) < 1e-6
        assert not torch.allclose(before, after)


def test_training_graphs_compile_and_give_eager_gradients():
    model = _mlp()
    x = torch.randn(4, 8)
    torch.compile(model, backend="kiln")(x).sum().backward()
    compiled_grad = model[0].weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    assert torch.allclose(compiled_grad, model[0].weight.grad, rtol=1e-5, atol=1e-6)


def test_op_kiln_does_not_model_runs_as_itself():
    def f(x):
        return torch.cumsum(x, 0).flip(0) * 2 + torch.special.i0(x)

    x = torch.randn(6, 3)
    assert torch.allclose(torch.compile(f, backend="kiln")(x), f(x))


def test_complex_input_falls_back_with_one_warning(caplog):
    def f(z):
        return (z * z).real + 1

    z = torch.randn(4, dtype=torch.complex64)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        out = torch.compile(f, backend="kiln")(z)
    assert torch.equal(out, f(z))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "complex64" in warnings[0].getMessage() and "node" in warnings[0].getMessage()


def test_non_tensor_arguments_work():
    def f(x, scale: float, flag: bool):
        return x * scale if flag else x - scale

    x = torch.randn(5)
    fast = torch.compile(f, backend="kiln")
    assert torch.allclose(fast(x, 2.5, True), f(x, 2.5, True))
    assert torch.allclose(fast(x, 2.5, False), f(x, 2.5, False))


def test_graph_break_still_correct():
    def f(x):
        y = torch.relu(x) + 1
        print("graph break")  # Dynamo splits the function here
        return y * torch.sigmoid(x)

    x = torch.randn(7)
    assert torch.allclose(torch.compile(f, backend="kiln")(x), f(x))


def test_in_place_update_of_an_input_is_kept():
    def f(x, acc):
        acc.add_(x)
        return acc * 2

    x, acc, acc_ref = torch.randn(3), torch.zeros(3), torch.zeros(3)
    out = torch.compile(f, backend="kiln")(x, acc)
    ref = f(x, acc_ref)
    assert torch.equal(out, ref) and torch.equal(acc, acc_ref)


def test_outputs_are_not_overwritten_by_the_next_call():
    model = _mlp()
    fast = torch.compile(model, backend="kiln")
    with torch.no_grad():
        x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
        y1 = fast(x1)
        kept = y1.clone()
        fast(x2)
        assert torch.equal(y1, kept)


@pytest.mark.parametrize("split", [
    lambda x: torch.split(x, 5, 1),  # one piece: ATen still returns a list
    lambda x: torch.unsafe_split(x, 5, 1),
    lambda x: torch.chunk(x, 1, 0),
    lambda x: torch.split(x, 2, 1),
], ids=["split-one", "unsafe_split-one", "chunk-one", "split-three"])
def test_multi_output_op_with_one_output_returns_tensors(split):
    x = torch.randn(5, 5, 5)
    got = torch.compile(split, backend="kiln", options={"strict": True})(x)
    expected = split(x)
    assert type(got) is type(expected) and len(got) == len(expected)
    assert all(type(g) is torch.Tensor for g in got)
    torch.testing.assert_close(got, expected)


def test_op_with_an_effect_runs_in_the_graph_and_still_raises():
    """linalg.inv checks for a singular matrix through an effect token (with_effects)."""
    fast = torch.compile(lambda a: torch.linalg.inv(a) * 2, backend="kiln",
                         options={"strict": True, "debug": True})
    a = torch.randn(5, 5) + 5 * torch.eye(5)
    torch.testing.assert_close(fast(a), torch.linalg.inv(a) * 2)
    with pytest.raises(torch.linalg.LinAlgError, match="linalg.inv"):
        fast(torch.zeros(5, 5))


def test_dynamo_restarting_its_analysis_is_not_a_fallback():
    """Dynamo may restart its analysis from inside the backend (TensorifyScalarRestartAnalysis,
    seen on a 0-d float64 operand); kiln must let that through, not fall back to eager."""
    import functools

    from kiln.report import CompileReport

    report = CompileReport()
    backend = functools.partial(kiln_backend, report=report)
    fast = torch.compile(torch.nn.functional.relu, backend=backend)
    x = torch.tensor(-1.5, dtype=torch.float64)
    torch.testing.assert_close(fast(x), torch.relu(x))
    assert not report.fallbacks and report.graphs


class _Routed(nn.Module):
    """A layer with a graph break between its two halves (JetMoE's router reads the top-k
    experts' counts on the host): Dynamo captures each half once and hands the same graph
    over for every instance, with that instance's weights as inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4, bias=False)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        torch._dynamo.graph_break()
        return self.out(x) * logits.softmax(-1).sum(-1, keepdim=True) + logits.max()


def test_a_graph_shared_by_module_instances_uses_each_instances_weights():
    """JetMoE (both entry points) computed every layer's router with the first layer's
    weights, frozen at the first call: off by 1.36 of an output of 4.2."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Routed() for _ in range(3)]).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="kiln")(x)
        again = torch.compile(model, backend="kiln")(x + 1)
        want_again = model(x + 1)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(again, want_again)


def test_past_the_weight_sets_limit_weights_are_plain_inputs(monkeypatch):
    """Past MAX_WEIGHT_SETS other weight sets, one graph takes the weights as inputs and
    serves every further instance, still with its own weights."""
    monkeypatch.setattr("kiln.frontend.fx_compile.MAX_WEIGHT_SETS", 1)
    torch.manual_seed(1)
    model = nn.Sequential(*[_Routed() for _ in range(4)]).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="kiln")(x), model(x))


def test_a_strided_input_runs_the_generated_kernel_on_a_dense_copy():
    """A graph torch.compile compiles for a permuted input (a graph break hands one on):
    the kernel is compiled for contiguous operands, so the input is copied dense at entry;
    before, every call failed the kernel's layout check and ran its library ops, warning.
    An input the graph also returns is not copied: the caller gets its own tensor back."""
    import warnings

    from kiln.runtime.executor import KernelFallbackWarning

    def f(x, bias):
        return torch.softmax(x * 0.5 + bias, -1), x

    x, bias = torch.randn(64, 48).t(), torch.randn(64)  # (48, 64), column-major
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", KernelFallbackWarning)
        fast = torch.compile(f, backend="kiln")
        for _ in range(2):
            y, same = fast(x, bias)
            torch.testing.assert_close(y, f(x, bias)[0])
            assert same is x or same.data_ptr() == x.data_ptr()


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
def test_a_one_hots_bounds_check_runs_in_the_compiled_graph(entry, caplog):
    """F.one_hot checks its classes with ``_assert_async``, an op that returns nothing: the
    graph was refused whole ('result None is not a tensor') and ran eagerly (a Switch
    Transformers router). It now runs in the graph, and still raises out of range."""
    import kiln

    class Router(nn.Module):
        def forward(self, x, classes):
            mask = torch.nn.functional.one_hot(classes, num_classes=4)
            return x.softmax(-1) * mask

    model, x = Router(), torch.randn(6, 4)
    inside, outside = torch.tensor([0, 3, 1, 2, 2, 0]), torch.tensor([0, 4, 1, 2, 2, 0])
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln"):
        fast = kiln.compile(model, (x, inside)) if entry == "kiln.compile" else \
            torch.compile(model, backend="kiln")
        torch.testing.assert_close(fast(x, inside), model(x, inside))
        assert not [r for r in caplog.records if "eagerly" in r.getMessage()]
        if entry == "kiln.compile":
            assert not fast.report.fallbacks and len(fast.report.graphs) == 1
        with pytest.raises(RuntimeError, match="smaller than num_classes"):
            fast(x, outside)


def test_a_strided_input_a_library_op_reads_too_runs_the_kernel_on_a_copy(tmp_path):
    """BigBird-Pegasus through torch.compile: a graph break hands on key and value
    transposed, a generated bmm and a library gather both read one; it is not copied at
    entry (the gather gets it as eager mode does), and the bmm failed its layout check on
    every call and ran the library's (1.04x eager, against 1.96x through kiln.compile). The
    kernel now reads a dense copy of it."""
    import warnings

    from kiln.runtime.executor import KernelFallbackWarning

    index = torch.tensor([3, 1, 7, 0]).view(1, 1, 4, 1).expand(1, 2, 4, 64)

    def attend(p, v):
        return torch.matmul(p, v), torch.gather(v, 2, index)

    torch.manual_seed(0)
    p = torch.randn(1, 2, 16, 256).softmax(-1)
    v = torch.randn(1, 256, 2, 64).transpose(1, 2)  # strided
    options = {"measure_kernels": False, "kernel_cache_dir": str(tmp_path)}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", KernelFallbackWarning)
        fast = torch.compile(attend, backend="kiln", options=options)
        for given in (v, v, v.contiguous()):
            for got, want in zip(fast(p, given), attend(p, given)):
                torch.testing.assert_close(got, want)


def test_batch_norm_compiles_on_a_graph_with_symbolic_shapes(caplog):
    """A graph Dynamo hands over with symbolic shapes is retraced per shape, and the retrace
    keeps batch norm's unused statistics as getitems that nothing reads: the converter's
    None for them must still agree (it crashed formatting its debug message, and then kept
    every batch norm a library call)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    fast = torch.compile(model, backend="kiln", dynamic=True)
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        for batch in (1, 2):
            x = torch.randn(batch, 3, 12, 12)
            assert _rel(fast(x), model(x)) < 1e-5
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "batch_norm" in m or "runs eagerly" in m], messages


def test_a_kiln_bug_on_a_graph_costs_speed_not_the_call(monkeypatch, caplog):
    """An error inside kiln while compiling a graph (here, for the second shape of a graph
    with symbolic shapes, at call time) runs that graph as captured, with one warning that
    says it is kiln's bug; Options(strict=True) raises it."""
    def broken(*args, **kwargs):
        raise RuntimeError("an internal error")

    model = _mlp()
    with torch.no_grad():
        for strict in (False, True):
            torch._dynamo.reset()
            fast = torch.compile(model, backend="kiln", dynamic=True,
                                 options={"strict": strict})
            monkeypatch.setattr("kiln.frontend.fx_compile.compile_graph", broken)
            x = torch.randn(3, 8)
            if strict:
                with pytest.raises(Exception, match="an internal error"):
                    fast(x)
                continue
            with caplog.at_level(logging.WARNING, logger="kiln"):
                assert _rel(fast(x), model(x)) < 1e-6
            (warning,) = [r.getMessage() for r in caplog.records
                          if r.levelno == logging.WARNING]
            assert "an internal error" in warning and "a kiln bug" in warning


def test_a_division_of_two_numbers_stays_the_aten_call():
    """A graph retraced at a concrete shape divides numbers (Longformer: its padded length
    over its attention window, ``aten.div.Tensor_mode(512, 256)``); the converter took the
    first for a value, and the graph ran eagerly with a kiln-bug warning."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.frontend.fx_compile import FxGraphRunner
    from kiln.options import Options
    from kiln.report import CompileReport

    def f(x):
        return (x + torch.ops.aten.div.Tensor_mode(512, 256, rounding_mode="trunc")
                + torch.ops.aten.floor_divide.default(7, 2))

    gm = make_fx(f)(torch.randn(3))
    runner = FxGraphRunner(gm, {}, Options(strict=True), CompileReport(), torch.device("cpu"))
    x = torch.randn(3)
    (got,) = runner([x])
    assert torch.equal(got, f(x))


def test_a_graph_with_symbolic_shapes_keeps_its_most_recent_compiles(monkeypatch):
    """One compile per input shape, the `MAX_SHAPES` most recently called kept: an evicted
    shape compiles again when it comes back, a kept one does not."""
    import functools

    from kiln.frontend import fx_compile
    from kiln.frontend.dynamo import kiln_backend
    from kiln.report import CompileReport

    monkeypatch.setattr(fx_compile, "MAX_SHAPES", 2)
    report = CompileReport()
    model = _mlp()
    fast = torch.compile(model, backend=functools.partial(kiln_backend, report=report),
                         dynamic=True)
    compiles = []
    with torch.no_grad():
        for batch in (2, 3, 4, 3, 2, 4):
            x = torch.randn(batch, 8)
            assert _rel(fast(x), model(x)) < 1e-6
            compiles.append(len(report.graphs))
    # 2, 3, 4 compile (2 goes); 3 is kept; 2 compiles again (4 goes); 4 compiles again
    assert compiles == [1, 2, 3, 3, 4, 5]
