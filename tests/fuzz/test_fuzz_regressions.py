"""Bugs the fuzzer found, as the reproducers it shrank them to; each passes now."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.check import check_case, config_named
from kiln.fuzz.values import Layout, LayoutKind
from kiln.ir import parse_graph, verify
from kiln.ir.interp import interpret
from kiln.options import Options
from kiln.passes.layout import to_channels_last

DIV_BY_SUBNORMAL = """graph(%x0: f32[4]) {
  %c = scalar {value=1e-39} : f64[]
  %div = div(%x0, %c) {rounding_mode=None} : f32[4]
  return %div
}
"""

NEGATED_SUM = """graph(%x0: f32[4, 5], %x1: f32[5]) {
  %add = add(%x0, %x1) : f32[4, 5]
  %neg = neg(%add) : f32[4, 5]
  return %neg
}
"""

PADDED_CONV_INF_WEIGHT = (
    "graph(%x0: f32[2, 2, 1, 6], %w0: f32[3, 2, 1, 1], %w1: f32[2, 3, 3, 8]) {\n"
    "  %conv = conv_act(%x0, %w0, %w1) {stride=(1, 1), padding=(1, 1), dilation=(1, 2), "
    "groups=1, has_bias=False, has_residual=True, activation=op('sigmoid'), act_args=()} "
    ": f32[2, 3, 3, 8]\n"
    "  return %conv\n"
    "}\n")


def test_division_by_a_subnormal_number_is_not_a_multiplication_by_inf(tmp_path):
    # div-const turned x / 1e-39 into x * (1 / 1e-39): 1e39 is inf in float32, so 0 -> NaN
    graph = parse_graph(DIV_BY_SUBNORMAL)
    case = Case(graph, (FuzzInput(torch.tensor([0.0, 1e-5, -0.0, 3.0])),))
    for name in ("O1", "O2"):
        assert check_case(case, [config_named(name)], str(tmp_path)).ok


def test_a_negated_sum_runs_as_a_generated_kernel(tmp_path):
    # the C renderer wrote neg(add(a, b)) as -a + b; the kernel disagreed with the library
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    graph = parse_graph(NEGATED_SUM)
    case = Case(graph, (FuzzInput(torch.randn(4, 5)), FuzzInput(torch.randn(5))))
    outcome = check_case(case, [config_named("O2+kernels")], cache)
    assert outcome.ok
    assert outcome.stats["O2+kernels"].generated == 1


def test_a_padded_convolution_with_an_infinite_weight_keeps_its_layout():
    # NCHW convolutions multiply the padding by the weight (0 * -inf = NaN), NHWC ones skip it
    graph = parse_graph(PADDED_CONV_INF_WEIGHT)
    assert to_channels_last(graph, decide=True) is graph  # the weight is known only at run time
    w = torch.randn(3, 2, 1, 1)
    frozen = parse_graph(PADDED_CONV_INF_WEIGHT.replace(
        "%w0: f32[3, 2, 1, 1], ", "").replace("{\n", "{\n  %w0 = constant {name='w0'} : "
                                              "f32[3, 2, 1, 1]\n", 1), {"w0": w})
    assert to_channels_last(frozen, decide=True) is not frozen  # a finite constant: moves
    w[0, 1, 0, 0] = -math.inf
    assert to_channels_last(frozen, decide=True) is frozen


@pytest.mark.parametrize("activation", [
    "relu(%t)", "clamp(%t) {min=0.0, max=None}", "clamp(%t) {min=None, max=-0.0}",
    "clamp(%t) {min=nan, max=1.0}", "clamp(%t) {min=2.0, max=1.0}",
])
def test_generated_relu_and_clamp_keep_a_zeros_sign_as_aten_does(activation, tmp_path):
    # the kernels computed relu(-0.0) as max(-0.0, 0) = +0.0; ATen keeps x on a tie: -0.0
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    text = ("graph(%x0: f32[24]) {\n  %t = neg(%x0) : f32[24]\n"
            f"  %y = {activation} : f32[24]\n  return %y\n}}\n")
    x = torch.tensor([-0.0, 0.0, math.nan, 1.0, -1.0, math.inf, -math.inf, 2.0] * 3)
    outcome = check_case(Case(parse_graph(text), (FuzzInput(x),)),
                         [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].generated == 1


MM_PLUS_WIDER_BIAS = """graph(%x0: f32[1, 1], %x1: f32[1, 8], %x2: f32[8, 1]) {
  %mm = mm(%x0, %x1) : f32[1, 8]
  %add = add(%x2, %mm) : f32[8, 8]
  return %add
}
"""


MM_PLUS_WIDER_DTYPE = """graph(%x0: f32[8, 1], %x1: f32[1, 2], %x2: f64[2]) {
  %mm = mm(%x0, %x1) : f32[8, 2]
  %add = add(%mm, %x2) : f64[8, 2]
  return %add
}
"""


@pytest.mark.parametrize("text", [MM_PLUS_WIDER_BIAS, MM_PLUS_WIDER_DTYPE])
def test_a_bias_that_broadcasts_or_promotes_the_product_stays_an_add(text, tmp_path):
    # mm-add-to-addmm took the meta kernel's word for addmm(b[8, 1], x[1, 1], w[1, 8]) being
    # f32[8, 8] (and for a float64 bias on a float32 product); ATen's addmm expands the bias
    # to the product's shape and wants one dtype, and raised
    graph = parse_graph(text)
    verify(graph)
    inputs = tuple(FuzzInput(torch.randn(n.type.shape, dtype=n.type.dtype.torch))
                   for n in graph.inputs)
    outcome = check_case(Case(graph, inputs), [config_named("O1")], str(tmp_path))
    assert outcome.ok, outcome.failures


STRIDED_BIAS_CONV = """graph(%x2: f32[2, 3, 7, 6], %x3: f32[9]) {
  %w0 = constant {name='w0'} : f32[9, 1, 1, 2]
  %conv = convolution(%x2, %w0, %x3) {stride=(2, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=3} : f32[2, 9, 5, 7]
  return %conv
}
"""


def test_a_strided_run_time_bias_reaches_onednn_dense(tmp_path):
    # oneDNN read a run-time bias as dense whatever its strides: every other element of its
    # buffer (here the fuzzer's filler 12345.0) became the bias
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN")
    graph = parse_graph(STRIDED_BIAS_CONV, {"w0": torch.randn(9, 1, 1, 2)})
    bias = FuzzInput(torch.randn(9), Layout(LayoutKind.STRIDED, 0))
    case = Case(graph, (FuzzInput(torch.randn(2, 3, 7, 6)), bias))
    outcome = check_case(case, [config_named("O2+kernels")], str(tmp_path))
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].prepacked == 1


def test_a_convolution_with_an_infinite_weight_is_not_given_to_onednn():
    # oneDNN and ATen's NCHW convolution disagree on which outputs 0 * inf makes NaN
    from kiln.kernels.library import library_groups

    text = STRIDED_BIAS_CONV
    w = torch.randn(9, 1, 1, 2)
    assert library_groups(parse_graph(text, {"w0": w})) or \
        not torch.backends.mkldnn.is_available()
    w[3, 0, 0, 1] = -math.inf
    assert not library_groups(parse_graph(text, {"w0": w}))


CONV_THEN_CHAIN = """graph(%x: f32[2, 3, 6, 5]) {
  %w = constant {name='w'} : f32[4, 3, 3, 3]
  %conv = convolution(%x, %w) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=1} : f32[2, 4, 6, 5]
  %neg = neg(%conv) : f32[2, 4, 6, 5]
  %relu = relu(%neg) : f32[2, 4, 6, 5]
  return %relu
}
"""


def test_a_generated_kernel_does_not_read_a_library_kernels_nhwc_output_as_dense(
        tmp_path, monkeypatch):
    # the executor took every kernel's output for contiguous; a oneDNN convolution on NHWC
    # data returns NHWC, and the generated kernel after it read it in the wrong order
    import kiln.passes.layout

    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable) or \
            not torch.backends.mkldnn.is_available():
        pytest.skip("no C compiler or no oneDNN")
    monkeypatch.setattr(kiln.passes.layout, "_measured_faster", lambda *a, **k: True)
    # (the convolution is the library's here: kiln's own direct convolution would take this
    # short reduction, and the case is a library kernel's NHWC output)
    monkeypatch.setattr("kiln.kernels.conv.MAX_REDUCTION", 0)
    graph = parse_graph(CONV_THEN_CHAIN, {"w": torch.randn(4, 3, 3, 3)})
    case = Case(graph, (FuzzInput(torch.randn(2, 3, 6, 5)),))
    outcome = check_case(case, [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    stats = outcome.stats["O2+kernels"]
    assert stats.prepacked == 1 and stats.generated == 1


EMPTY_K_EPILOGUE = """graph(%x1: f32[3, 0], %x2: f32[0, 1], %w0: f32[1]) {
  %mm = addmm_act(%w0, %x1, %x2) {activation=op('tanh'), act_args=(), beta=1.0, alpha=1} \
: f32[3, 1]
  return %mm
}
"""


def test_a_gemm_with_an_epilogue_and_no_k_is_left_to_the_library(tmp_path):
    # plan_gemm raised ValueError ("an epilogue needs one K block") out of the compiler
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    graph = parse_graph(EMPTY_K_EPILOGUE)
    case = Case(graph, (FuzzInput(torch.empty(3, 0)), FuzzInput(torch.empty(0, 1)),
                        FuzzInput(torch.tensor([0.5]))))
    outcome = check_case(case, [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures


CONV_INTO_PADDED_CONV = """graph(%x: f32[1, 4, 5, 7], %w2: f32[8, 1, 1, 2]) {
  %w1 = constant {name='w1'} : f32[4, 1, 1, 3]
  %c1 = convolution(%x, %w1) {stride=(1, 1), padding=(0, 0), dilation=(2, 1), \
transposed=False, output_padding=(0, 0), groups=4} : f32[1, 4, 5, 5]
  %c2 = convolution(%c1, %w2) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=4} : f32[1, 8, 7, 6]
  return %c2
}
"""


def test_a_convolution_kept_nchw_also_reads_nchw(tmp_path, monkeypatch):
    # the padded convolution with a run-time weight stayed NCHW, but read the NHWC output of
    # the convolution before it, and ATen ran it NHWC all the same (padding skipped: 0*inf
    # was 0 instead of NaN)
    import kiln.passes.layout

    monkeypatch.setattr(kiln.passes.layout, "_measured_faster", lambda *a, **k: True)
    graph = parse_graph(CONV_INTO_PADDED_CONV, {"w1": torch.randn(4, 1, 1, 3)})
    moved = to_channels_last(graph, decide=True)
    c2 = [n for n in moved.nodes if n.name == "c2"][0]
    assert c2.inputs[0].node.op.text == "clone"  # back to NCHW first
    w2 = torch.randn(8, 1, 1, 2)
    w2[6, 0, 0, 0] = math.inf
    case = Case(graph, (FuzzInput(torch.randn(1, 4, 5, 7)), FuzzInput(w2)))
    outcome = check_case(case, [config_named("O2")], str(tmp_path))
    assert outcome.ok, outcome.failures


def test_generated_floor_division_follows_aten_at_infinities(tmp_path):
    # the kernels computed floor(a / b): 3 // -inf was -0 (ATen, like Python: -1) and
    # inf // 2 was inf (ATen: NaN, by way of fmod)
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    special = [3.0, -3.0, 0.0, -0.0, 7.5, -7.5, math.inf, -math.inf, math.nan, 1e-45, 2.0,
               1e30, 0.5]
    a = torch.tensor([x for x in special for _ in special])
    b = torch.tensor([y for _ in special for y in special])
    n = a.numel()
    text = (f"graph(%a: f32[{n}], %b: f32[{n}]) {{\n"
            f"  %d = div(%a, %b) {{rounding_mode='floor'}} : f32[{n}]\n"
            f"  %n = neg(%d) : f32[{n}]\n  return %n\n}}\n")
    outcome = check_case(Case(parse_graph(text), (FuzzInput(a), FuzzInput(b))),
                         [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].generated == 1


DILATED_ONE_WIDE_KERNEL = """
import torch
from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.check import check_case, config_named
from kiln.ir import parse_graph
import kiln.passes.layout

kiln.passes.layout._measured_faster = lambda *a, **k: True  # also time oneDNN's NHWC
text = '''graph(%x: f32[2, 1, 1, 1], %b: f32[3]) {
  %w = constant {name='w'} : f32[3, 1, 1, 1]
  %c = convolution(%x, %w, %b) {stride=(1, 2), padding=(0, 1), dilation=(1, 2), \\
transposed=False, output_padding=(0, 0), groups=1} : f32[2, 3, 1, 2]
  return %c
}
'''
case = Case(parse_graph(text, {"w": torch.randn(3, 1, 1, 1)}),
            (FuzzInput(torch.randn(2, 1, 1, 1)), FuzzInput(torch.randn(3))))
outcome = check_case(case, [config_named("O2+kernels")], CACHE)
assert outcome.ok, outcome.failures
print("ok", outcome.stats["O2+kernels"].prepacked)
"""


def test_a_dilated_one_wide_kernel_does_not_crash_onednn(tmp_path):
    # oneDNN's convolution segfaulted on a dilated 1-wide kernel over a padded 1-wide input
    # with stride 2 (the prepacked kernel's check killed the compiling process); run in a
    # child process, so that a regression fails this test instead of killing pytest
    import subprocess
    import sys

    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN")
    code = DILATED_ONE_WIDE_KERNEL.replace("CACHE", repr(str(tmp_path)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok" in done.stdout


ONE_HIGH_CONVS = """graph(%x: f32[3, 3, 1, 3], %w5: f32[9, 1, 1, 3]) {
  %w3 = constant {name='w3'} : f32[3, 1, 1, 1]
  %c1 = convolution(%x, %w3) {stride=(2, 1), padding=(0, 0), dilation=(2, 1), \
transposed=False, output_padding=(0, 0), groups=3} : f32[3, 3, 1, 3]
  %c2 = convolution(%c1, %w5) {stride=(1, 2), padding=(2, 2), dilation=(2, 1), \
transposed=False, output_padding=(0, 0), groups=3} : f32[3, 9, 5, 3]
  return %c2
}
"""


def test_a_prepacked_convolution_returns_nchw_for_nchw_input(tmp_path, monkeypatch):
    # oneDNN answered NHWC for a 1-high NCHW input (both layouts fit it); the padded
    # convolution after it then ran ATen's NHWC algorithm: 0 * inf in the padding was 0
    import kiln.passes.layout

    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN")
    monkeypatch.setattr(kiln.passes.layout, "_measured_faster", lambda *a, **k: False)
    graph = parse_graph(ONE_HIGH_CONVS, {"w3": torch.randn(3, 1, 1, 1)})
    w5 = torch.randn(9, 1, 1, 3)
    w5[4, 0, 0, 1] = math.inf
    case = Case(graph, (FuzzInput(torch.randn(3, 3, 1, 3)), FuzzInput(w5)))
    outcome = check_case(case, [config_named("O2+kernels")], str(tmp_path))
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].prepacked == 1


@pytest.mark.parametrize("op", ["exp", "tanh", "floor", "sin"])
def test_a_kernel_named_after_a_libm_function_compiles(op, tmp_path):
    # a group of two exps became the C function `exp`, which clashes with math.h's: the
    # compiler rejected the kernel and the group ran as library calls
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    text = (f"graph(%x: f32[4, 8]) {{\n  %a = {op}(%x) : f32[4, 8]\n"
            f"  %b = {op}(%a) : f32[4, 8]\n  return %b\n}}\n")
    case = Case(parse_graph(text), (FuzzInput(torch.rand(4, 8)),))
    outcome = check_case(case, [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    stats = outcome.stats["O2+kernels"]
    assert stats.generated == 1 and not stats.warnings, stats.warnings


NHWC_DILATED_ONE_WIDE = """
import torch
from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.check import check_case, config_named
from kiln.ir import parse_graph
import kiln.passes.layout as layout

text = '''graph(%x: f32[2, 8, 6, 1], %b: f32[8]) {
  %w = constant {name='w'} : f32[8, 2, 1, 1]
  %c = convolution(%x, %w, %b) {stride=(1, 2), padding=(0, 1), dilation=(1, 2), \\
transposed=False, output_padding=(0, 0), groups=4} : f32[2, 8, 6, 2]
  return %c
}
'''
graph = parse_graph(text, {"w": torch.randn(8, 2, 1, 1)})
(conv,) = [n for n in graph.nodes if n.op.text == "convolution"]
layout._conv_times(layout._signature(conv), True)  # the layout decision times both layouts
layout._measured_faster = lambda *a, **k: True
case = Case(graph, (FuzzInput(torch.randn(2, 8, 6, 1)), FuzzInput(torch.randn(8))))
outcome = check_case(case, [config_named("O2"), config_named("O2+kernels")], CACHE)
assert outcome.ok, outcome.failures
print("ok")
"""


def test_a_dilated_one_wide_kernel_does_not_crash_atens_nhwc_convolution(tmp_path):
    # ATen's NHWC convolution with a bias segfaults on a dilated 1-wide kernel (a PyTorch bug:
    # eager mode crashes on channels-last tensors too), when the layout pass timed it and
    # when it had moved it; kiln gives it dilation 1 now, the same convolution
    import subprocess
    import sys

    code = NHWC_DILATED_ONE_WIDE.replace("CACHE", repr(str(tmp_path)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok" in done.stdout


TRANSPOSED_CONV_OUTPUT_PADDING = """graph(%x1: f64[1, 4, 1, 4], %x2: f64[1], %x4: f64[1, 1, 4, 4, 4], %x5: f64[1, 3, 1, 3, 1], %w1: f64[3]) {
  %w0 = constant {name='w0'} : f64[1, 4, 2, 3]
  %conv_act5 = conv_act(%x1, %w0, %x2) {stride=(1, 1), padding=(2, 1), dilation=(1, 2), groups=1, has_bias=True, has_residual=False, activation=None, act_args=()} : f64[1, 1, 4, 2]
  %conv = convolution(%x4, %x5, %w1) {stride=(2, 2, 1), padding=(1, 1, 1), dilation=(2, 1, 2), transposed=True, output_padding=(1, 0, 1), groups=1} : f64[1, 3, 6, 7, 3]
  return %conv_act5, %conv
}
"""  # noqa: E501


def test_a_transposed_convolution_keeps_the_dilation_its_output_padding_needs(tmp_path):
    # the layout pass gave 1-wide kernels dilation 1; a transposed convolution's output
    # padding (1 on the last axis, stride 1) must be below its stride or dilation (2), so
    # the rewritten node was rejected by ATen at run time (fuzz seed 1, graph 35202)
    torch.manual_seed(0)
    graph = parse_graph(TRANSPOSED_CONV_OUTPUT_PADDING,
                        {"w0": torch.randn(1, 4, 2, 3, dtype=torch.float64)})
    shapes = [(1, 4, 1, 4), (1,), (1, 1, 4, 4, 4), (1, 3, 1, 3, 1), (3,)]
    inputs = [torch.randn(shape, dtype=torch.float64) for shape in shapes]
    moved = to_channels_last(graph, decide=True)  # whether it moves is measured: force it
    transposed = [n for n in moved.nodes if n.op.text == "convolution"]
    assert transposed and transposed[0].attrs.dilation == (1, 1, 2)  # 2 where it is needed
    want = interpret(graph, inputs)
    for got, expected in zip(interpret(moved, inputs), want):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("exponent", [0.5, -0.5, 2.0, 3.0, -1.0, -2.0, 0.25, 2])
def test_generated_power_by_a_number_gives_atens_bits(exponent, tmp_path):
    # seed 7 graph 74714: tanh((-0.0) ** 0.5) was +0.0 in a generated kernel (powf) and -0.0
    # in ATen, which computes x ** 0.5 as sqrt(x) (and 2, 3, -0.5, -1, -2 without pow too)
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    kind = "i64" if isinstance(exponent, int) else "f64"
    text = ("graph(%x0: f32[32]) {\n"
            f"  %c = scalar {{value={exponent!r}}} : {kind}[]\n"
            "  %p = pow(%x0, %c) : f32[32]\n  %t = tanh(%p) : f32[32]\n  return %t\n}\n")
    x = torch.tensor([-0.0, 0.0, math.nan, 1.0, -1.0, math.inf, -math.inf, 2.0,
                      1e-39, -1e-39, 3.5, -3.5, 1e30, -1e30, 0.1, -0.1] * 2)
    outcome = check_case(Case(parse_graph(text), (FuzzInput(x),)),
                         [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].generated == 1


def test_the_search_does_not_reassociate_a_sum_that_overflows_by_default(tmp_path):
    # seed 8 graph 7487: (x + c) + c with x = -inf and c = 3e38 is -inf; the search applied a
    # generated ieee reassociation, x + (c + c), and got NaN
    text = """graph(%x: f32[4], %c: f32[4]) {
  %a = add(%x, %c) : f32[4]
  %b = add(%a, %c) : f32[4]
  return %b
}
"""
    x = torch.tensor([-math.inf, 1.0, math.inf, -1.0])
    c = torch.full((4,), 3e38)
    outcome = check_case(Case(parse_graph(text), (FuzzInput(x), FuzzInput(c))),
                         [config_named("O2+search")], str(tmp_path))
    assert outcome.ok, outcome.failures


def test_a_convolution_with_one_input_channel_stays_nchw(tmp_path, monkeypatch):
    # seed 9 graph 55743: ATen's convolution of a one-channel input in real channels-last
    # strides, width stride 2, one-wide output, gives wrong values (-21.4 for -8.6)
    import kiln.passes.layout as layout

    monkeypatch.setattr(layout, "_measured_faster", lambda *args, **kwargs: True)
    text = ("graph(%x1: f32[2, 1, 3, 1], %w0: f32[2, 1, 7, 4], %w1: f32[1, 1, 3, 3], "
            "%w2: f32[1], %w3: f32[1, 1, 1, 1]) {\n"
            "  %c = conv_act(%w0, %w1, %w2, %x1) {stride=(1, 2), padding=(0, 0), "
            "dilation=(2, 1), groups=1, has_bias=True, has_residual=True, "
            "activation=op('leaky_relu'), act_args=(2.0,)} : f32[2, 1, 3, 1]\n"
            "  %d = convolution(%c, %w3) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), "
            "transposed=False, output_padding=(0, 0), groups=1} : f32[2, 1, 3, 1]\n"
            "  return %d\n}\n")
    graph = parse_graph(text)
    assert to_channels_last(graph, decide=True) is graph  # nothing to convert
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(FuzzInput(torch.randn(n.type.shape, generator=gen)) for n in graph.inputs)
    outcome = check_case(Case(graph, inputs), [config_named("O2+kernels")], str(tmp_path))
    assert outcome.ok, outcome.failures


def test_a_rounded_subnormal_divided_by_itself_is_not_compared(tmp_path):
    # seed 9 graph 56562: erf(1.4e-45) is one or two units of the smallest subnormal (the
    # generated kernel says 0), so erf(x) / x is anything from 0 to 2: past a division a
    # rounded subnormal's error is no longer relative
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    text = """graph(%x: f32[4, 8, 4]) {
  %e = erf(%x) : f32[4, 8, 4]
  %d = div(%e, %x) {rounding_mode=None} : f32[4, 8, 4]
  %p = adaptive_avg_pool2d(%d) {output_size=(3, 3)} : f32[4, 3, 3]
  return %p
}
"""
    x = torch.tensor([1.4013e-45, 5e-45, 0.5, -2.0] * 32).reshape(4, 8, 4)
    outcome = check_case(Case(parse_graph(text), (FuzzInput(x),)),
                         [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].generated == 1


def test_a_difference_of_two_huge_rounded_values_is_not_compared(tmp_path):
    # seed 10 graph 7786: m - (m + w) with m = b*w near 1.6e38 is 0 in ATen; the generated
    # kernel contracts b*w into an fma and gets another rounding of the huge terms; the
    # layer norm's mean of such a row then differs by w / 5
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    text = """graph(%b: f32[5, 1, 5], %w: f32[1], %g: f32[1, 5]) {
  %m = mul(%b, %w) : f32[5, 1, 5]
  %a = add(%m, %w) : f32[5, 1, 5]
  %s = sub(%m, %a) : f32[5, 1, 5]
  %n = layer_norm(%s, %g, %g) {normalized_shape=(1, 5), eps=0.1} : \
(f32[5, 1, 5], f32[5, 1, 1], f32[5, 1, 1])
  return %n#1
}
"""
    gen = torch.Generator().manual_seed(0)
    b = torch.rand(25, generator=gen) + 1.0
    b[[10, 11, 12, 13]] = torch.tensor([3.1e38, -3.1e38, 2.9e38, -2.7e38])
    inputs = (FuzzInput(b.reshape(5, 1, 5)), FuzzInput(torch.tensor([0.5041])),
              FuzzInput(torch.ones(1, 5)))
    outcome = check_case(Case(parse_graph(text), inputs), [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures


RMS_NORM_WEIGHT_FROM_PROLOGUE = """graph(%x0: f32[16], %x1: f32[1, 16, 1, 16]) {
  %exp1 = exp(%x0) : f32[16]
  %tanh9 = tanh(%exp1) : f32[16]
  %sub10 = sub(%tanh9, %x1) : f32[1, 16, 1, 16]
  %c = scalar {value=2} : i64[]
  %pow11 = pow(%sub10, %c) : f32[1, 16, 1, 16]
  %mean12 = mean(%pow11) {dims=(3,), keepdim=True} : f32[1, 16, 1, 1]
  %c_1 = scalar {value=0.0} : f64[]
  %add13 = add(%mean12, %c_1) : f32[1, 16, 1, 1]
  %rsqrt14 = rsqrt(%add13) : f32[1, 16, 1, 1]
  %mul15 = mul(%rsqrt14, %sub10) : f32[1, 16, 1, 16]
  %mul16 = mul(%tanh9, %mul15) : f32[1, 16, 1, 16]
  return %mul16
}
"""


def test_an_rms_norm_whose_weight_its_prologue_computes_runs(tmp_path):
    # the norm's row kernel took the group computing its weight as its prologue, and read the
    # weight, which that kernel never wrote: NameError at run time (seed 7 graph 4089 of a
    # run restricted to elementwise ops and mean)
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    graph = parse_graph(RMS_NORM_WEIGHT_FROM_PROLOGUE)
    case = Case(graph, (FuzzInput(torch.randn(16)), FuzzInput(torch.randn(1, 16, 1, 16))))
    outcome = check_case(case, [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].generated == 2


def test_a_batch_norm_that_overflows_is_not_compared_where_the_twin_cannot_run(tmp_path):
    # seed 55 graph 2227: w / sqrt(var + eps) is past the float range in channel 2, so ATen's
    # contiguous loop (x * a + c) gives NaN there and its strided one ((x - mean) * invstd * w
    # + b, the reference's permuted input) 4.8e37. The float64 twin cannot run the graph (tanh
    # of uint8 is float32 there too, and the batch norm mixes it with float64 weights), and
    # the overflow test was skipped with it: kiln's NaN (eager's, on a dense input) was
    # reported as a mismatch
    text = """graph(%x: u8[1, 4, 2, 3], %w: f32[4], %b: f32[4], %m: f32[4], %v: f32[4]) {
  %t = tanh(%x) : f32[1, 4, 2, 3]
  %n = batch_norm(%t, %w, %b, %m, %v) {eps=0.001} : f32[1, 4, 2, 3]
  return %n
}
"""
    x = torch.arange(24, dtype=torch.uint8).reshape(1, 4, 2, 3) % 5 + 1
    weights = (torch.tensor([-3.4028e38, 1.7014e38, 3.4028e38, 1.1755e-38]),
               torch.tensor([-2.2778e-26, 1.0614e-09, 4.0244e17, 2.3363e-35]),
               torch.tensor([0.16252, -0.058111, 0.8729, 2.9387e-39]),
               torch.tensor([1.0822, 0.2382, 0.7568, 0.1951]))
    inputs = (FuzzInput(x, Layout(LayoutKind.PERMUTED)), *map(FuzzInput, weights))
    outcome = check_case(Case(parse_graph(text), inputs), [config_named("O0")], str(tmp_path))
    assert outcome.ok, outcome.failures


ATTENTION_NAN_KEY = (
    "graph(%q: f32[2, 1, 1, 16], %v: f32[2, 1, 1, 16], %k: f32[2, 1, 1, 16]) {\n"
    "  %att = call(%q, %k, %v) {target=aten.scaled_dot_product_attention.default, "
    "args=(arg(0), arg(1), arg(2), None, 0.0, False), kwargs=(('scale', 0.5),)} "
    ": f32[2, 1, 1, 16]\n"
    "  return %att\n"
    "}\n")


def _attention_case(key: torch.Tensor) -> Case:
    gen = torch.Generator().manual_seed(0)
    q, v = torch.randn(2, 1, 1, 16, generator=gen), torch.randn(2, 1, 1, 16, generator=gen)
    return Case(parse_graph(ATTENTION_NAN_KEY),
                (FuzzInput(q), FuzzInput(v, Layout(LayoutKind.PERMUTED)), FuzzInput(key)))


def test_attention_over_a_nan_key_is_atens_answer_for_the_strides_it_gets(tmp_path):
    # fuzz seed 2, graph 50: ATen's flash kernel answers 0 for a row whose scores are all
    # NaN, its math path (which V's strides pick in eager mode) NaN; the compiled graph hands
    # the library a dense V, so its rerun where the kernel's output is not finite gave 0 and
    # the check reported a mismatch. Such a call's non-finite cases are not compared now.
    cache = str(tmp_path)
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    key = torch.randn(2, 1, 1, 16)
    key[1, 0, 0, 10] = math.nan
    case = _attention_case(key)
    q, v, k = case.materialize()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert sdpa(q, k, v, scale=0.5)[1].isnan().all()  # (the premise: V strided, math path)
    assert (sdpa(q, k, v.contiguous(), scale=0.5)[1] == 0).all()  # (dense V: flash)
    outcome = check_case(case, [config_named("O2+kernels")], cache)
    assert outcome.ok, outcome.failures
    assert outcome.stats["O2+kernels"].generated == 1


def test_attention_over_finite_operands_is_still_compared():
    from kiln.fuzz.check import reference
    from kiln.fuzz.compare import Strength

    for key, ill in ((torch.randn(2, 1, 1, 16), False),
                     (torch.full((2, 1, 1, 16), 1e38), True)):  # (scores past the range)
        case = _attention_case(key)
        expected = reference(case)
        call = case.graph.outputs[0]
        assert expected.ill_conditioned({call: Strength.NEAR}) == ({"att"} if ill else set())
