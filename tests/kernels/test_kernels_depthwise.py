"""The generated depthwise convolution (channels-last, fp32): against eager torch at odd sizes,
every epilogue activation, non-finite inputs, on the portable path; what it refuses; and a
MobileNetV2-style block through kiln.compile."""

from __future__ import annotations

import dataclasses
import platform
import warnings

import pytest
import torch
from torch import nn

import kiln
from kiln.codegen.isa import Isa, target_isa
from kiln.codegen.kernel import compile_kernel, prebuild
from kiln.ir import parse_graph, verify
from kiln.ir.fused import apply_activation
from kiln.ir.ops import Op
from kiln.kernels.contractions import build_contraction_kernels, contraction_groups
from kiln.kernels.decide import Decisions
from kiln.kernels.depthwise import depthwise_groups, refusal
from kiln.kernels.depthwise_schedule import (
    DepthwiseConfig,
    DepthwiseShape,
    depthwise_plan,
    pack_depthwise_weight,
)
from kiln.kernels.plan import Epilogue, Recipe
from kiln.options import Options
from kiln.passes.partition import gather
from kiln.runtime.executor import KernelFallbackWarning, build_executor
from kiln.runtime.memory import plan_memory

CL = torch.channels_last

# (n, c, h, w, kernel, stride, padding, dilation, bias, activation, act_args)
CASES = [
    (1, 20, 9, 11, 3, 1, 1, 1, True, Op.RELU, ()),  # odd sizes, C not a multiple of 16
    (2, 17, 2, 3, 3, 2, 1, 1, True, Op.CLAMP, (0.0, 6.0)),  # H, W < kernel; stride 2; N = 2
    (1, 33, 15, 7, 5, 2, 2, 1, False, Op.GELU, ("tanh",)),  # 5x5, no bias
    (1, 16, 9, 8, 3, 1, 0, 2, True, Op.SIGMOID, ()),  # no padding, dilation 2
    (1, 7, 12, 13, 3, 1, 1, 1, True, Op.LEAKY_RELU, (0.1,)),  # fewer channels than a vector
    (1, 48, 14, 14, 3, 2, 1, 1, True, Op.TANH, ()),  # a MobileNet-like stride-2 layer
    (1, 3, 1, 1, 3, 1, 1, 1, True, Op.GELU, ("none",)),  # one pixel, all border
    (1, 64, 8, 29, 3, 1, 1, 1, True, None, ()),  # no activation; a tail pixel tile
]
IDS = [f"{c[1]}x{c[2]}x{c[3]}k{c[4]}s{c[5]}{c[9].text if c[9] else ''}" for c in CASES]


def _case(case: tuple, lanes: int = 16) -> tuple:
    n, c, h, w, k, s, p, d, bias, act, args = case
    shape = DepthwiseShape(n, c, h, w, (k, k), (s, s), (p, p), (d, d), bias)
    epilogue = Epilogue(act, args) if act is not None else None
    plan = depthwise_plan(shape, DepthwiseConfig.default(shape, lanes),
                          name=f"dw_test_{'_'.join(map(str, case[:8]))}_{lanes}", epilogue=epilogue)
    return shape, plan


def _operands(shape: DepthwiseShape, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape.n, shape.c, shape.h, shape.w, generator=gen).contiguous(
        memory_format=CL)
    weight = torch.randn(shape.c, 1, *shape.kernel, generator=gen)
    bias = torch.randn(shape.c, generator=gen)
    return x, weight, bias


def _eager(shape: DepthwiseShape, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
           act: Op | None, args: tuple) -> torch.Tensor:
    y = torch.nn.functional.conv2d(x, weight.contiguous(memory_format=CL),
                                   bias if shape.bias else None, shape.stride, shape.padding,
                                   shape.dilation, shape.c)
    apply_activation(y, act, args)
    return y


def _run(kernel, shape: DepthwiseShape, x: torch.Tensor, weight: torch.Tensor,  # noqa: ANN001
         bias: torch.Tensor) -> torch.Tensor:
    out = torch.full((shape.n, shape.c, *shape.out), float("nan")).contiguous(memory_format=CL)
    operands = [x, pack_depthwise_weight(weight)] + ([bias] if shape.bias else [])
    kernel(*operands, out)
    return out


@pytest.fixture(scope="module")
def built(kernel_options: Options) -> dict:
    """Every case's kernel, compiled in parallel (the compiler dominates this file's time)."""
    plans = {case: _case(case) for case in CASES}
    prebuild([plan.build() for _, plan in plans.values()], kernel_options)
    return {case: (shape, plan, compile_kernel(plan.build(), kernel_options))
            for case, (shape, plan) in plans.items()}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_depthwise_matches_eager(built: dict, case: tuple) -> None:
    shape, plan, kernel = built[case]
    x, weight, bias = _operands(shape, seed=len(IDS[CASES.index(case)]))
    got = _run(kernel, shape, x, weight, bias)
    want = _eager(shape, x, weight, bias, case[9], case[10])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=CL)
    assert plan.recipe is Recipe.DEPTHWISE
    assert plan.replayed() == plan.build()  # the trace is the shipped kernel


@pytest.mark.parametrize("case", [CASES[0], CASES[1]], ids=IDS[:2])
def test_depthwise_non_finite_inputs(built: dict, case: tuple) -> None:
    """NaN and +-inf inputs, in the interior and on the border, give what ATen's NHWC
    convolution gives: NaN and inf at the same places."""
    shape, _, kernel = built[case]
    x, weight, bias = _operands(shape, seed=3)
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, shape.h // 2, shape.w // 2] = float("inf")
    x[0, 2, -1, -1] = float("-inf")
    x[-1, -1, 0, -1] = float("inf")
    x[-1, -1, 1 % shape.h, -1] = float("-inf")  # inf - inf in one sum: NaN
    got = _run(kernel, shape, x, weight, bias)
    want = _eager(shape, x, weight, bias, case[9], case[10])
    assert not torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
def test_depthwise_portable_path(kernel_options: Options) -> None:
    """Compiled for plain SSE2 (a machine without AVX-512), 4 channels a vector: the same."""
    options = dataclasses.replace(kernel_options, c_flags=("-O3", "-march=x86-64", "-fopenmp"))
    assert target_isa(options) is Isa.VEC128
    case = CASES[1]
    shape, plan = _case(case, lanes=Isa.VEC128.f32_lanes)
    kernel = compile_kernel(plan.build(), options)
    x, weight, bias = _operands(shape, seed=5)
    got = _run(kernel, shape, x, weight, bias)
    torch.testing.assert_close(got, _eager(shape, x, weight, bias, case[9], case[10]),
                               rtol=1e-5, atol=1e-5)


GRAPH = """\
graph(%x: f32[1, {c}, 10, 9]) {{
  %w = constant {{name='w'}} : f32[{c}, 1, 3, 3]
  %b = constant {{name='b'}} : f32[{c}]
  %xl = to_layout(%x) {{channels_last=True}} : f32[1, {c}, 10, 9]
  %x_in = {source} : f32[1, {c}, 10, 9]
  %y = conv_act(%x_in, %w, %b{residual}) {{stride=(2, 2), padding=(1, 1), dilation=(1, 1), \
groups={c}, has_bias=True, has_residual={has_residual}, activation=op('clamp'), \
act_args=(0.0, 6.0)}} : f32[1, {c}, 5, 5]
  %z = clone(%y) : f32[1, {c}, 5, 5]
  return %z
}}"""


def _graph(c: int = 24, source: str = "relu(%xl)", residual: bool = False,
           weight: torch.Tensor | None = None, copy_out: bool = True):  # noqa: ANN202
    torch.manual_seed(0)
    w = weight if weight is not None else torch.randn(c, 1, 3, 3)
    text = GRAPH.format(c=c, source=source, residual=", %r" if residual else "",
                        has_residual=residual)
    if not copy_out:  # the convolution's result is the graph's, in the layout it has
        text = text.replace("return %z", "return %y")
    if residual:  # a second graph input
        text = text.replace(") {\n", f", %r: f32[1, {c}, 5, 5]) {{\n", 1)
    graph = parse_graph(text, {"w": w, "b": torch.randn(c)})
    verify(graph)
    return graph


def test_depthwise_candidate_in_the_contraction_stage(kernel_options: Options) -> None:
    """Offered beside oneDNN, checked against ATen on channels-last operands, and run by the
    executor on an NHWC input, giving NHWC; an NCHW input at run time takes the ATen call."""
    graph = _graph()
    groups = contraction_groups(graph)
    assert [g.last.name for g in depthwise_groups(graph)] == ["y"]
    built = build_contraction_kernels(graph, groups, kernel_options, Decisions(None, False))
    (kernel,) = built.kernels
    assert kernel.generated and kernel.plan.recipe is Recipe.DEPTHWISE  # type: ignore[union-attr]
    assert kernel.weight(graph, kernel.inputs[1]).shape == (3, 3, 24)  # packed [KH, KW, C]
    moved = gather(graph, [kernel.group])
    run, source = build_executor(moved, plan_memory(moved), [0], built.kernels)
    assert "memory_format=CHANNELS_LAST" in source
    x = torch.randn(1, 24, 10, 9)
    w = next(graph.constant(n) for n in graph.nodes if n.name == "w")
    b = next(graph.constant(n) for n in graph.nodes if n.name == "b")
    want = torch.nn.functional.conv2d(x.relu(), w, b, 2, 1, 1, 24).clamp(0.0, 6.0)
    (got,) = run([x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("why", ["nchw", "residual", "inf_weight", "one_channel"])
def test_depthwise_refuses(why: str) -> None:
    """Cases the kernel does not take stay with the library: an input that is NCHW at run
    time, a residual input, a non-finite weight, a single channel."""
    if why == "nchw":
        graph = _graph(source="relu(%x)")
    elif why == "residual":
        graph = _graph(residual=True)
    elif why == "inf_weight":
        w = torch.randn(24, 1, 3, 3)
        w[3, 0, 1, 1] = float("inf")
        graph = _graph(weight=w)
    else:
        graph = _graph(c=1)
    node = next(n for n in graph.nodes if n.name == "y")
    assert refusal(graph, node) is not None
    assert depthwise_groups(graph) == []


class _Block(nn.Module):
    """MobileNetV2's inverted residual: 1x1 expand, 3x3 depthwise, 1x1 project (+ x)."""

    def __init__(self, c: int, t: int, stride: int) -> None:
        super().__init__()
        h = c * t
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
        self.residual = stride == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


def test_mobilenet_block_through_kiln_compile(kernel_options: Options,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two inverted-residual blocks (stride 1 with residual, then stride 2) compiled at O2,
    channels-last forced: the depthwise convolutions run generated and match eager."""
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model = nn.Sequential(_Block(8, 3, 1), _Block(8, 3, 2)).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
            m.bias.data.uniform_(-1, 1)
    x = torch.randn(1, 8, 13, 15)
    compiled = kiln.compile(model, (x,), kernel_options)
    generated = [k for k in compiled.report.kernels if k.kind == "generated"
                 and "kiln_depthwise" in k.source]
    assert len(generated) == 2
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.is_contiguous()


def test_depthwise_input_not_channels_last_at_run_time(kernel_options: Options,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor checks the input's strides on every call: an NHWC input runs the kernel,
    an NCHW one (which the IR could not foresee) the node's ATen call; both match."""
    graph = _graph(source="relu(%x)", copy_out=False)
    x_in = next(n for n in graph.nodes if n.name == "x_in").out()
    monkeypatch.setattr("kiln.kernels.depthwise.channels_last_values", lambda g: {x_in})
    built = build_contraction_kernels(graph, depthwise_groups(graph), kernel_options,
                                      Decisions(None, False))
    (kernel,) = built.kernels
    assert kernel.generated
    moved = gather(graph, [kernel.group])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    w = next(graph.constant(n) for n in graph.nodes if n.name == "w")
    b = next(graph.constant(n) for n in graph.nodes if n.name == "b")
    for layout in (torch.contiguous_format, CL):
        x = torch.randn(1, 24, 10, 9).contiguous(memory_format=layout)
        want = torch.nn.functional.conv2d(x.relu(), w, b, 2, 1, 1, 24).clamp(0.0, 6.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (got,) = run([x])
        fell_back = [c for c in caught if c.category is KernelFallbackWarning]
        assert len(fell_back) == (layout is torch.contiguous_format)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # the kernel writes NHWC; ATen's call on an NCHW input gives NCHW
        assert got.is_contiguous(memory_format=layout)


# (padding before, padding after) per spatial dim: a pad node folded into the convolution
PADDED = [((0, 0), (1, 1), 2), ((1, 2), (0, 1), 1), ((2, 0), (3, 1), 2), ((0, 1), (0, 0), 1)]


@pytest.mark.parametrize("before,after,stride", PADDED, ids=[str(p) for p in PADDED])
def test_depthwise_with_padding_after_matches_a_pad_then_the_convolution(
        kernel_options: Options, before: tuple, after: tuple, stride: int) -> None:
    """Padding that differs before and after a spatial dim (TensorFlow's "same"): the kernel
    over the unpadded input equals ATen's pad, then the convolution without padding; NaN and
    inf on the border stay where ATen has them."""
    shape = DepthwiseShape(1, 19, 9, 12, (3, 3), (stride, stride), before, (1, 1), True,
                           padding_after=after)
    plan = depthwise_plan(shape, DepthwiseConfig.default(shape, 16),
                          name=f"dw_test_pad_{'_'.join(map(str, (*before, *after, stride)))}",
                          epilogue=Epilogue(Op.CLAMP, (0.0, 6.0)))
    kernel = compile_kernel(plan.build(), kernel_options)
    x, weight, bias = _operands(shape, seed=3)
    x[0, 2, 0, 0], x[0, 5, -1, -1] = float("nan"), float("inf")
    got = _run(kernel, shape, x, weight, bias)
    (top, left), (bottom, right) = before, after
    padded = torch.nn.functional.pad(x, (left, right, top, bottom))
    want = torch.nn.functional.conv2d(padded, weight, bias, shape.stride, 0, 1,
                                      shape.c).clamp(0.0, 6.0)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


class _SamePadded(nn.Module):
    """HF MobileNet's "same" padding before a strided depthwise convolution; ``shared``:
    the padded image is also returned (the pad then stays a call of its own)."""

    def __init__(self, c: int, value: float = 0.0, shared: bool = False) -> None:
        super().__init__()
        self.expand = nn.Conv2d(c, c, 1)  # (the image is channels-last from here on)
        self.conv = nn.Conv2d(c, c, 3, 2, 0, groups=c)
        self.value, self.shared = value, shared

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        padded = torch.nn.functional.pad(self.expand(x).relu(), (0, 1, 0, 1), value=self.value)
        y = torch.nn.functional.relu6(self.conv(padded))
        return (y, padded) if self.shared else y


@pytest.mark.parametrize("value,shared,folded", [(0.0, False, True), (1.0, False, False),
                                                  (0.0, True, False)],
                         ids=["zero", "nonzero-value", "pad-returned"])
def test_a_zero_pad_joins_its_depthwise_convolution(kernel_options: Options,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    value: float, shared: bool,
                                                    folded: bool) -> None:
    """A zero pad read only by the convolution runs inside its kernel (one generated kernel
    for both nodes); a pad of another value, or one whose result is also used, stays a call
    of its own. All match eager."""
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model = _SamePadded(24, value, shared).eval()
    x = torch.randn(1, 24, 14, 13).contiguous(memory_format=CL)
    compiled = kiln.compile(model, (x,), kernel_options)
    ops = [k.ops for k in compiled.report.kernels if k.kind == "generated"
           and "kiln_depthwise" in (k.source or "")]
    assert ops == ([("pad", "conv_act")] if folded else [("conv_act",)])
    with torch.no_grad():
        want, got = model(x), compiled(x)
    for w, g in zip(want if shared else [want], got if shared else [got], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
