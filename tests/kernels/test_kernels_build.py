"""Generated kernels for partition groups, run by the executor, against the interpreter.

Float32 kernels reassociate reductions (lane-wise partial sums), so results are compared with
a relative L2 tolerance, not bit for bit; every fallback path must give the library's answer.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

import kiln_test_support as support
from kiln.ir import Graph, parse_graph, verify
from kiln.kernels import build as K
from kiln.kernels import loops, validate
from kiln.kernels.outcome import SkipReason
from kiln.kernels.plan import Recipe
from kiln.options import Options
from kiln.passes.partition import gather, partition
from kiln.runtime import executor
from kiln.runtime.executor import KernelFallbackWarning, build_executor
from kiln.runtime.memory import plan_memory
from kiln.tir.printer import print_func

TOLERANCE = 1e-5


def _graph(kind: str, shape: tuple[int, ...]) -> Graph:
    """A hand-built graph whose one group is ``kind``, at ``shape`` (last axis: the row)."""
    n = shape[-1]
    t = f"f32{list(shape)}"
    stats = f"f32{[*shape[:-1], 1]}"
    mask = f"bool{[1] * (len(shape) - 2) + list(shape[-2:])}"
    body = {
        "add_layernorm": f"""\
  %s = add(%x, %h) : {t}
  %ln = layer_norm(%s, %g, %b) {{normalized_shape=({n},), eps=1e-05}} : ({t}, {stats}, {stats})
  %t = mul(%s, %ln#0) : {t}
  return %t""",
        "add_layernorm_no_residual": f"""\
  %s = add(%x, %h) : {t}
  %ln = layer_norm(%s, %g, %b) {{normalized_shape=({n},), eps=1e-05}} : ({t}, {stats}, {stats})
  return %ln#0""",
        "layernorm": f"""\
  %ln = layer_norm(%x, %g, %b) {{normalized_shape=({n},), eps=1e-05}} : ({t}, {stats}, {stats})
  return %ln#0""",
        "add_rmsnorm": f"""\
  %two = scalar {{value=2}} : i64[]
  %eps = scalar {{value=1e-06}} : f64[]
  %s = add(%x, %h) : {t}
  %p = pow(%s, %two) : {t}
  %m = mean(%p) {{dims=({len(shape) - 1},), keepdim=True}} : {stats}
  %e = add(%m, %eps) : {stats}
  %r = rsqrt(%e) : {stats}
  %n = mul(%s, %r) : {t}
  %y = mul(%g, %n) : {t}
  %z = add(%y, %s) : {t}
  return %z""",
        "rmsnorm_unweighted": f"""\
  %eps = scalar {{value=1e-05}} : f64[]
  %p = mul(%x, %x) : {t}
  %m = mean(%p) {{dims=(-1,), keepdim=True}} : {stats}
  %e = add(%eps, %m) : {stats}
  %r = rsqrt(%e) : {stats}
  %n = mul(%r, %x) : {t}
  return %n""",
        "scale_mask_softmax": f"""\
  %mask = constant {{name='mask'}} : {mask}
  %neg = constant {{name='neg'}} : f32[]
  %c = scalar {{value=0.125}} : f64[]
  %q = mul(%x, %c) : {t}
  %m = where(%mask, %neg, %q) : {t}
  %p = softmax(%m) {{dim={len(shape) - 1}}} : {t}
  return %p""",
        "scale_addmask_softmax": f"""\
  %addmask = constant {{name='addmask'}} : {mask.replace('bool', 'f32')}
  %c = scalar {{value=0.125}} : f64[]
  %q = mul(%x, %c) : {t}
  %m = add(%q, %addmask) : {t}
  %p = softmax(%m) {{dim={len(shape) - 1}}} : {t}
  return %p""",
        "scale_mask": f"""\
  %mask = constant {{name='mask'}} : {mask}
  %neg = constant {{name='neg'}} : f32[]
  %c = scalar {{value=0.125}} : f64[]
  %q = mul(%x, %c) : {t}
  %m = where(%mask, %neg, %q) : {t}
  return %m""",
        "bias_gelu_residual": f"""\
  %a = add(%x, %b) : {t}
  %y = gelu(%a) {{approximate='none'}} : {t}
  %z = add(%y, %h) : {t}
  return %z""",
    }[kind]
    head = f"graph(%x: {t}, %h: {t}) {{\n"
    head += f"  %g = constant {{name='g'}} : f32[{n}]\n  %b = constant {{name='b'}} : f32[{n}]\n"
    torch.manual_seed(0)
    weights = {"g": torch.randn(n), "b": torch.randn(n), "neg": torch.tensor(-1e9),
               "mask": torch.rand(*([1] * (len(shape) - 2)), *shape[-2:]) > 0.5}
    weights["addmask"] = torch.where(weights["mask"], -1e4, 0.0)
    graph = parse_graph(head + body + "\n}", weights)
    verify(graph)
    return graph


def _compiled(graph: Graph, options: Options):  # noqa: ANN202
    built = K.build_kernels(graph, partition(graph), options)
    moved = gather(graph, [k.group for k in built.kernels])
    run, source = build_executor(moved, plan_memory(moved), range(len(graph.inputs)),
                                 built.kernels)
    return built, run, source


def _check(run, graph: Graph, inputs: list[torch.Tensor]) -> None:  # noqa: ANN001
    with torch.no_grad():
        actual = run(list(inputs))
    expected = support.run_interpreter(graph, tuple(inputs))
    for a, e in zip(actual, expected, strict=True):
        assert support.relative_error(a, e) < TOLERANCE


CASES = [
    ("add_layernorm", (2, 7, 37)), ("add_layernorm", (1, 3, 768)),
    ("add_layernorm_no_residual", (5, 16)), ("layernorm", (3, 1)),
    ("scale_addmask_softmax", (1, 3, 9, 9)), ("scale_addmask_softmax", (2, 2, 17, 17)),
    ("scale_mask", (2, 3, 5, 5)), ("bias_gelu_residual", (3, 50)), ("bias_gelu_residual", (1, 1)),
    ("add_rmsnorm", (2, 7, 37)), ("add_rmsnorm", (3, 1)), ("rmsnorm_unweighted", (5, 129)),
    ("add_rmsnorm", (1, 65, 768)),
    # above kernels.GRAIN: parallel loops
    ("add_layernorm", (1, 65, 768)), ("scale_addmask_softmax", (1, 4, 97, 97)),
    ("bias_gelu_residual", (64, 1001)), ("scale_mask", (1, 4, 97, 97)),
]


@pytest.mark.parametrize(("kind", "shape"), CASES, ids=[f"{k}-{s}" for k, s in CASES])
def test_generated_kernels_match_the_interpreter(kernel_options: Options, kind: str,
                                                 shape: tuple[int, ...]) -> None:
    graph = _graph(kind, shape)
    built, run, source = _compiled(graph, kernel_options)
    assert len(built.kernels) == 1 and not built.skipped, built.skipped
    kernel = built.kernels[0]
    assert kernel.plan.recipe is (Recipe.ROWS if "softmax" in kind or "norm" in kind
                                  else Recipe.LOOPS)
    assert "KERNEL" in source and kernel.trace
    # the shipped kernel is its plan: replaying the trace and post-passes gives the same program
    assert print_func(kernel.plan.replayed()) == print_func(kernel.kernel.func)
    small = math.prod(shape) < K.GRAIN
    if small or kernel.plan.recipe is Recipe.ROWS:  # (the default schedule decides for loops)
        assert ("#pragma omp parallel" in kernel.source) != small
    for seed in range(2):
        _check(run, graph, support.random_inputs(graph, seed))


@pytest.mark.parametrize("shape", [(1, 2, 8, 8), (1, 2, 16, 16), (2, 3, 37, 37), (1, 4, 1, 1)])
def test_a_masked_softmax_is_one_row_kernel(kernel_options: Options,
                                            shape: tuple[int, ...]) -> None:
    # where(mask, -1e9, x * c) then softmax: the renderer reads x before the select (a blend)
    graph = _graph("scale_mask_softmax", shape)
    built, run, source = _compiled(graph, kernel_options)
    assert [[n.name for n in k.group.nodes] for k in built.kernels] == [["q", "m", "p"]]
    assert built.kernels[0].plan.recipe is Recipe.ROWS and "sch.rfactor" in built.kernels[0].trace
    assert "K_softmax" not in source.split("else:")[0]
    if shape[-1] % 16 == 0:
        assert "hoisted" in built.kernels[0].source
    for seed in range(2):
        _check(run, graph, support.random_inputs(graph, seed))


def test_intermediates_stay_in_registers_and_the_residual_is_written(
        kernel_options: Options) -> None:
    graph = _graph("add_layernorm", (2, 4, 16))
    built, run, source = _compiled(graph, kernel_options)
    kernel = built.kernels[0]
    assert [repr(v) for v in kernel.outputs] == ["%s", "%ln#0"]
    assert "K_add" not in source.split("else:")[0]  # the add runs in the kernel
    assert "K_layer_norm" not in source.split("else:")[0]


def test_a_strided_input_is_copied_dense_once_at_entry(kernel_options: Options) -> None:
    """A kernel is compiled for its inputs' contiguous layout: a strided graph input (one
    that torch.compile hands over permuted) is copied dense at entry, and the kernel runs
    on the copy, where its library ops used to run instead."""
    graph = _graph("add_layernorm", (2, 6, 16))
    _, run, source = _compiled(graph, kernel_options)
    assert ".is_contiguous() else " in source
    x, h = support.random_inputs(graph, 0)
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        _check(run, graph, [strided, h])


def test_a_strided_input_not_copied_at_entry_is_copied_for_the_kernel(
        kernel_options: Options, monkeypatch: pytest.MonkeyPatch) -> None:
    """An input that a library op reads too keeps its layout (no entry copy, stubbed out
    here): the kernel reads a dense copy of it, where it ran its library ops instead."""
    monkeypatch.setattr(executor, "_inputs_made_dense", lambda *args: [])  # (no entry copy)
    graph = _graph("add_layernorm", (2, 6, 16))
    _, run, source = _compiled(graph, kernel_options)
    assert "_dense = " in source and "is_contiguous()" not in source
    x, h = support.random_inputs(graph, 0)
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not strided.is_contiguous()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        _check(run, graph, [strided, h])


def test_missing_compiler_warns_and_keeps_library_calls(kernel_options: Options,
                                                        tmp_path) -> None:  # noqa: ANN001
    options = dataclasses.replace(kernel_options, c_compiler=str(tmp_path / "no-such-cc"))
    graph = _graph("scale_addmask_softmax", (1, 2, 8, 8))
    with pytest.warns(RuntimeWarning, match="could not find"):
        built, run, source = _compiled(graph, options)
    assert built.kernels == [] and built.skipped[0].reason is SkipReason.NO_COMPILER
    assert "KERNEL" not in source
    _check(run, graph, support.random_inputs(graph, 0))


def test_a_kernel_that_disagrees_with_the_library_is_not_used(
        kernel_options: Options, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validate, "CHECK_TOLERANCE", 0.0)  # no kernel can pass: the net catches it
    graph = _graph("bias_gelu_residual", (3, 20))
    with pytest.warns(RuntimeWarning, match="disagrees"):
        built, run, source = _compiled(graph, kernel_options)
    assert built.kernels == [] and "KERNEL" not in source
    _check(run, graph, support.random_inputs(graph, 0))


def test_an_op_without_a_loop_definition_stays_a_library_call(kernel_options: Options) -> None:
    graph = parse_graph("""\
graph(%x: f32[4, 16]) {
  %a = exp(%x) : f32[4, 16]
  %b = sin(%a) : f32[4, 16]
  %c = floor(%b) : f32[4, 16]
  return %c
}""")
    groups = partition(graph)
    assert len(groups) == 1
    built = K.build_kernels(graph, groups, kernel_options)
    assert len(built.kernels) + len(built.skipped) == 1  # generated or skipped, never raised
    _, run, _ = _compiled(graph, kernel_options)
    _check(run, graph, support.random_inputs(graph, 0))


def test_a_bug_in_lowering_costs_speed_not_the_model(kernel_options: Options,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("boom")
    monkeypatch.setattr(loops, "lower_chain", broken)
    graph = _graph("bias_gelu_residual", (3, 20))
    with pytest.warns(RuntimeWarning, match="boom"):
        built, run, source = _compiled(graph, kernel_options)
    assert built.kernels == [] and "KERNEL" not in source
    _check(run, graph, support.random_inputs(graph, 0))
    strict = dataclasses.replace(kernel_options, strict=True)
    with pytest.raises(RuntimeError, match="boom"):
        K.build_kernels(graph, partition(graph), strict)


class _ConvActConv(torch.nn.Module):
    """A convolution, an activation the convolution kernels do not take as an epilogue,
    another convolution: LeViT's stem (hardswish), MobileViT's and EfficientNet's SiLU."""

    def __init__(self, act: torch.nn.Module) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.act = act
        self.c2 = torch.nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(self.act(self.c1(x)))


@pytest.mark.parametrize("act", [torch.nn.Hardsigmoid(), torch.nn.SiLU()],
                         ids=["hardsigmoid", "silu"])  # (a hardswish runs in the conv's epilogue)
def test_an_activation_between_nhwc_convolutions_keeps_their_layout(
        kernel_options: Options, act: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """The activation's kernel reads and writes NHWC, so every kernel of the chain runs: it
    was compiled contiguous, found its operand NHWC at every call, and the library ran
    instead (and then the next convolution's kernel, given the library's layout). The
    layout pass's timed choice is pinned to NHWC: measured, it took NCHW on one CI run."""
    import warnings

    import kiln

    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model, x = _ConvActConv(act).eval(), torch.randn(1, 3, 32, 32)
    x[0, 1, 5, 7] = float("nan")
    compiled = kiln.compile(model, (x,), kernel_options)
    activation = [k for k in compiled.report.kernels if k.kind == "generated"
                  and "conv" not in "".join(k.ops) and "convolution" not in k.ops]
    assert activation and "sch.reorder(" in activation[0].trace
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4,
                                       equal_nan=True)
    assert compiled.report.graphs[0].details.fallbacks == {}


def test_the_check_compares_nonfinite_values_by_place_and_the_rest_by_relative_error() -> None:
    want = torch.tensor([[1.0, -float("inf"), 3.0], [float("nan"), 5.0, 6.0]])
    close = validate._close
    assert close(want.clone(), want)
    assert close(want.t().contiguous().t(), want)  # another layout, the same values
    moved = want.clone()
    moved[0, 1], moved[0, 2] = 3.0, -float("inf")  # the same values, the infinity elsewhere
    assert not close(moved, want)
    flipped = want.clone()
    flipped[0, 1] = float("inf")  # the sign of an infinity
    assert not close(flipped, want)
    nan_for_inf = want.clone()
    nan_for_inf[0, 1] = float("nan")
    assert not close(nan_for_inf, want)
    off = want.clone()
    off[1, 2] += 1e-3  # relative L2 ~1.2e-4 over the finite values
    assert not close(off, want)
    near = want.clone()
    near[1, 2] += 1e-5
    assert close(near, want)
    finite = torch.randn(64, 33)
    assert close(finite * (1 + 1e-7), finite)
    assert not close(finite * (1 + 1e-4), finite)


@pytest.mark.parametrize("eps", [1e-06, 0.0])
def test_rmsnorm_kernel_keeps_nan_inf_zero_and_overflowing_rows_as_aten_does(
        kernel_options: Options, eps: float) -> None:
    """One row kernel for the whole norm, with ATen's answers on rows holding NaN, +-inf,
    zeros (rsqrt(0) = inf with eps 0: 0 * inf is NaN) and squares that overflow (rsqrt(inf)
    = 0: finite x * 0 is 0, inf * 0 is NaN)."""
    graph = _graph("add_rmsnorm", (6, 37))
    if eps == 0.0:
        graph = parse_graph(str(graph).replace("value=1e-06", "value=0.0"),
                            dict(graph.constants))
    built, run, _ = _compiled(graph, kernel_options)
    assert [[n.op.text for n in k.group.nodes] for k in built.kernels] == [
        ["add", "pow", "mean", "add", "rsqrt", "mul", "mul"]]
    x, h = support.random_inputs(graph, 0)
    h = torch.zeros_like(h)
    x[1, 3], x[2, 0], x[3, 36] = math.nan, math.inf, -math.inf
    x[4] = 0.0
    x[5, :5] = 3e38
    with torch.no_grad():
        (actual,) = run([x, h])
    (expected,) = support.run_interpreter(graph, (x, h))
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert actual[4].isnan().all() == (eps == 0.0)


def test_a_lone_hardswish_is_a_kernel_bit_for_bit_atens(kernel_options: Options) -> None:
    """hardswish as `kiln.rules.idioms` makes it: a group of its own, whose C computes x
    times clamp(x + 3, 0, 6), divided by 6, as ATen's kernel does: every float the same,
    -0.0, ±inf and the clamp's corners included, and NaN where ATen's is NaN (a NaN's sign
    bit is not compared)."""
    graph = parse_graph("""graph(%x: f32[4, 1031]) {
  %y = hardswish(%x) : f32[4, 1031]
  return %y
}""", {})
    built, run, _ = _compiled(graph, kernel_options)
    assert len(built.kernels) == 1, built.skipped
    torch.manual_seed(0)
    x = torch.randn(4, 1031) * 4
    x[0, :8] = torch.tensor([-0.0, 0.0, -3.0, 3.0, float("inf"), -float("inf"), float("nan"),
                             -2.9999998])
    with torch.no_grad():
        (actual,) = run([x])
    expected = torch.nn.functional.hardswish(x)
    assert torch.equal(actual.isnan(), expected.isnan())
    numbers = ~expected.isnan()
    assert torch.equal(actual[numbers].view(torch.int32), expected[numbers].view(torch.int32))
