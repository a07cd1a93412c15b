"""The generated executor computes what the reference interpreter computes, call after call.

It is called with the boxed argument list (which it empties) and writes planned values into a
per-thread arena; results handed to the caller must never be overwritten by a later call.
"""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

import kiln
import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.engine import compile_graph
from kiln.ir import Graph, GraphBuilder, Op, TensorType, parse_graph, verify
from kiln.ir import attrs as A
from kiln.ir.types import DType
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import plan_memory


def _executor(graph: Graph, planned: bool = True):
    run, source = build_executor(graph, plan_memory(graph) if planned else None,
                                 range(len(graph.inputs)))
    return run, source


def _call(run, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        return run(list(inputs))


def _weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"w": torch.randn(16, 16), "b": torch.randn(16), "g": torch.randn(16)}


GRAPHS = {
    "chain": """\
graph(%x: f32[16, 16]) {
  %a = exp(%x) : f32[16, 16]
  %b = tanh(%a) : f32[16, 16]
  %c = exp(%b) : f32[16, 16]
  %d = tanh(%c) : f32[16, 16]
  %e = sigmoid(%d) : f32[16, 16]
  return %e
}""",
    "views_and_outputs": """\
graph(%x: f32[16, 16]) {
  %w = constant {name='w'} : f32[16, 16]
  %b = constant {name='b'} : f32[16]
  %a = exp(%x) : f32[16, 16]
  %va = view(%a) {shape=(256,)} : f32[256]
  %t = permute(%w) {dims=(1, 0)} : f32[16, 16]
  %m = addmm(%b, %x, %t) {beta=1, alpha=1} : f32[16, 16]
  %s = sigmoid(%m) : f32[16, 16]
  %pm = permute(%s) {dims=(1, 0)} : f32[16, 16]
  %y = mm(%pm, %a) : f32[16, 16]
  %z = add(%y, %m) : f32[16, 16]
  %sm = softmax(%z) {dim=1} : f32[16, 16]
  %tc = call(%sm) {target=aten.t.default, args=(arg(0),), kwargs=()} : f32[16, 16]
  return %va, %tc, %w, %x, %x
}""",
    "multi_output_and_scalars": """\
graph(%x: f32[4, 16], %i: i64[4]) {
  %g = constant {name='g'} : f32[16]
  %b = constant {name='b'} : f32[16]
  %ln = layer_norm(%x, %g, %b) {normalized_shape=(16,), eps=1e-05} : (f32[4, 16], f32[4, 1], f32[4, 1])
  %parts = split(%ln#0) {sizes=(6, 10), dim=1} : (f32[4, 6], f32[4, 10])
  %c = scalar {value=-0.0} : f64[]
  %c_1 = scalar {value=inf} : f64[]
  %c_2 = scalar {value=nan} : f64[]
  %c_3 = scalar {value=2} : i64[]
  %c_4 = scalar {value=True} : bool[]
  %p = add(%parts#0, %c) : f32[4, 6]
  %q = mul(%parts#1, %c_1) : f32[4, 10]
  %r = mul(%parts#1, %c_2) : f32[4, 10]
  %s = pow(%p, %c_3) : f32[4, 6]
  %t = mul(%i, %c_4) : i64[4]
  %u = clamp(%p) {min=-0.0, max=None} : f32[4, 6]
  %f = full {shape=(3,), value=-0.0, dtype=f32} : f32[3]
  %k = call(%s) {target=aten.cumsum.default, args=(arg(0), 1), kwargs=(('dtype', torch.double),)} : f64[4, 6]
  %e = exp(%ln#1) : f32[4, 1]
  %v = add(%e, %ln#2) : f32[4, 1]
  %sum = sum(%ln#0) {dims=None, keepdim=False} : f32[]
  return %q, %r, %s, %t, %u, %f, %k, %v, %sum, %parts#0
}""",  # noqa: E501
}


@pytest.mark.parametrize("planned", [True, False], ids=["planned", "unplanned"])
@pytest.mark.parametrize("text", GRAPHS.values(), ids=GRAPHS.keys())
def test_matches_interpreter_on_hand_built_graphs(text: str, planned: bool) -> None:
    graph = parse_graph(text, _weights())
    verify(graph)
    run, source = _executor(graph, planned)
    assert source.startswith("def kiln_graph(args):")
    for seed in range(2):
        inputs = support.random_inputs(graph, seed)
        actual = _call(run, inputs)
        expected = support.run_interpreter(graph, tuple(inputs))
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            support.assert_identical(a, e)


def test_planned_chain_uses_the_arena() -> None:
    graph = parse_graph(GRAPHS["chain"])
    _, source = _executor(graph)
    assert "buf = buffers()" in source
    assert source.count("out=buf[") == 4


def test_takes_inputs_from_the_given_positions_and_empties_the_argument_list() -> None:
    graph = parse_graph("""\
graph(%x: f32[4], %y: f32[4]) {
  %s = sub(%x, %y) : f32[4]
  return %s
}""")
    run, _ = build_executor(graph, plan_memory(graph), [2, 0])
    x, y = torch.randn(4), torch.randn(4)
    args = [y, "not a graph input", x]
    (result,) = run(args)
    assert torch.equal(result, x - y)
    assert args == []


def test_constant_outputs_are_copies_the_caller_may_change() -> None:
    graph = parse_graph(GRAPHS["views_and_outputs"], _weights())
    run, _ = _executor(graph)
    x = torch.randn(16, 16)
    first = _call(run, [x])
    assert torch.equal(first[2], graph.constants["w"])
    first[2].zero_()
    assert not torch.equal(graph.constants["w"], first[2])
    second = _call(run, [x])
    assert torch.equal(second[2], graph.constants["w"])


@pytest.mark.parametrize("text", GRAPHS.values(), ids=GRAPHS.keys())
def test_second_call_leaves_first_results_intact(text: str) -> None:
    graph = parse_graph(text, _weights())
    run, _ = _executor(graph)
    first_inputs = support.random_inputs(graph, seed=1)
    first = _call(run, first_inputs)
    snapshot = [t.clone() for t in first]
    second = _call(run, support.random_inputs(graph, seed=2))
    for a, e in zip(first, snapshot):
        support.assert_identical(a, e)
    for a, b in zip(first, second):
        assert a.data_ptr() != b.data_ptr() or a.numel() == 0 or a is b


def test_zoo_executor_matches_interpreter_and_keeps_results(zoo_case) -> None:
    for graph in (zoo_case.graph, support.optimized(zoo_case.name)[0]):
        run, _ = _executor(graph)
        first = _call(run, zoo_case.inputs)
        snapshot = [t.clone() for t in first]
        expected = support.run_interpreter(graph, zoo_case.inputs)
        for a, e in zip(first, expected, strict=True):
            assert support.relative_error(a, e) < 1e-6
        for a, e in zip(first, zoo_case.expected, strict=True):
            assert support.relative_error(a, e) < 1e-4  # ieee rules round differently
        other = support.random_inputs(graph, seed=3)
        second = _call(run, other)
        for a, e in zip(second, support.run_interpreter(graph, tuple(other)), strict=True):
            assert support.relative_error(a, e) < 1e-6
        for a, e in zip(first, snapshot):
            support.assert_identical(a, e)


def _run_concurrently(run, per_thread_inputs, expected, rounds: int) -> list[str]:
    barrier = threading.Barrier(len(per_thread_inputs))
    failures: list[str] = []

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for _ in range(rounds):
                results = _call(run, per_thread_inputs[k])
                for a, e in zip(results, expected[k], strict=True):
                    if not torch.equal(a, e):
                        failures.append(f"thread {k}: wrong result")
                        return
        except Exception as err:  # noqa: BLE001 - reported to the main thread
            failures.append(f"thread {k}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(per_thread_inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return failures


def test_two_threads_share_one_executor() -> None:
    torch.manual_seed(0)
    b = GraphBuilder()
    x = b.input("x", TensorType((128, 128), DType.F32))
    w = b.constant("w", torch.randn(128, 128) / 16)
    h = x
    for _ in range(4):  # mm, add, tanh ... all planned, all reusing the same arena bytes
        h = b.op(Op.TANH, b.op(Op.ADD, b.op(Op.MM, h, w), x))
    y = b.op(Op.SOFTMAX, b.op(Op.MM, h, w), attrs=A.SoftmaxAttrs(1))
    graph = b.build(y, h)
    run, source = _executor(graph)
    assert source.count("out=buf[") >= 8
    inputs = [[torch.randn(128, 128)], [torch.randn(128, 128)]]
    expected = [support.run_interpreter(graph, tuple(i)) for i in inputs]
    assert _run_concurrently(run, inputs, expected, rounds=25) == []


def test_two_threads_share_a_zoo_executor() -> None:
    case = support.capture("bert")
    graph = support.optimized("bert")[0]
    run, _ = _executor(graph)
    inputs = [list(case.inputs), support.random_inputs(graph, seed=5)]
    expected = [_call(run, i) for i in inputs]
    assert _run_concurrently(run, inputs, expected, rounds=10) == []


def test_mean_over_all_dimensions_in_a_planned_graph() -> None:
    graph = parse_graph("""\
graph(%x: f32[4, 4]) {
  %e = exp(%x) : f32[4, 4]
  %m = mean(%e) {dims=None, keepdim=False} : f32[]
  %r = relu(%m) : f32[]
  return %r
}""")
    run, _ = _executor(graph)
    x = torch.randn(4, 4)
    support.assert_identical(_call(run, [x])[0], support.run_interpreter(graph, (x,))[0])


@pytest.mark.parametrize("rank", [0, 1, 4])
def test_views_run_as_tensor_methods_at_every_rank(rank: int) -> None:
    """Permute and view are emitted as Tensor methods; a 0-d permute has no dims to spread
    (the fuzzer found ``x.permute()`` raising)."""
    shape = (2, 3, 4, 5)[:rank]
    dims = tuple(reversed(range(rank)))
    flat = 1
    for d in shape:
        flat *= d
    text = f"""graph(%x: f32[{', '.join(map(str, shape))}]) {{
  %p = permute(%x) {{dims={dims!r}}} : f32[{', '.join(map(str, reversed(shape)))}]
  %v = view(%p) {{shape=({flat},)}} : f32[{flat}]
  return %v
}}"""
    graph = parse_graph(text)
    run, source = _executor(graph)
    assert ".permute" in source and ".reshape(" in source
    x = torch.randn(shape)
    support.assert_identical(_call(run, [x])[0], support.run_interpreter(graph, (x,))[0])


def test_names_differing_only_in_dot_and_underscore() -> None:
    graph = parse_graph("""\
graph(%x: f32[4]) {
  %a.b = exp(%x) : f32[4]
  %a_b = neg(%x) : f32[4]
  %s = add(%a.b, %a_b) : f32[4]
  return %s
}""")
    run, _ = _executor(graph, planned=False)
    x = torch.randn(4)
    support.assert_identical(_call(run, [x])[0], support.run_interpreter(graph, (x,))[0])


def test_multi_output_names_do_not_clash_with_other_nodes() -> None:
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 6), DType.F32))
    parts = b.node(Op.SPLIT, x, attrs=A.SplitAttrs((3, 3), 1), name="s")
    other = b.op(Op.NEG, parts.out(0), name="s")  # printed %s_1, like parts' output 1
    graph = b.build(b.op(Op.ADD, parts.out(1), other))
    run, _ = _executor(graph, planned=False)
    x_value = torch.randn(4, 6)
    support.assert_identical(_call(run, [x_value])[0],
                             support.run_interpreter(graph, (x_value,))[0])


def test_generated_kernels_follow_torch_thread_count(kernel_options) -> None:  # noqa: ANN001
    graph = parse_graph("""\
graph(%x: f32[64, 512], %y: f32[64, 512], %w: f32[512, 8]) {
  %s = add(%x, %y) : f32[64, 512]
  %r = relu(%s) : f32[64, 512]
  %o = mm(%r, %w) : f32[64, 8]
  return %o
}""")
    compiled = compile_graph(graph, kernel_options, range(3))
    assert "sync_threads()" in compiled.source
    kernels = compiled.run.__globals__["sync_threads"]._kernels  # add+relu, and the GEMM
    counts = [ctypes.c_int.in_dll(k.library.cdll, "kiln_num_threads") for k in kernels]
    x, y, w = torch.randn(64, 512), torch.randn(64, 512), torch.randn(512, 8)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.testing.assert_close(compiled([x, y, w])[0], torch.relu(x + y) @ w)
        assert counts and all(c.value == 1 for c in counts)
        torch.set_num_threads(2)
        compiled([x, y, w])
        assert all(c.value == 2 for c in counts)
    finally:
        torch.set_num_threads(before)


class _ScatteredScores(torch.nn.Module):
    """Funnel's relative attention: a slice_scatter of a transposed tensor (ATen clones it
    with its strides), sliced and viewed into the scores a softmax kernel reads."""

    def forward(self, scores: torch.Tensor, x: torch.Tensor, src: torch.Tensor
                ) -> torch.Tensor:
        shifted = torch.slice_scatter(x.transpose(2, 3), src, dim=2, start=2)
        rel = shifted[:, :, 2:, :].reshape(1, 4, 8, 30)[..., :16]
        return torch.softmax(scores * 0.25 + rel, dim=-1)


def test_an_opaque_calls_result_reaches_its_kernel_contiguous(kernel_options) -> None:
    """The kernel reading the call's result through views is compiled for a contiguous
    result; the executor makes it so after the call (it ran the library ops instead)."""
    import warnings

    import kiln
    from kiln.runtime.executor import KernelFallbackWarning

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 4, 8, 16, generator=gen), torch.randn(1, 4, 8, 32, generator=gen),
            torch.randn(1, 4, 30, 8, generator=gen))
    model = _ScatteredScores()
    compiled = kiln.compile(model, args, kernel_options)
    assert any(k.kind == "generated" and "softmax" in k.ops for k in compiled.report.kernels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        torch.testing.assert_close(compiled(*args), model(*args))
    assert compiled.report.graphs[0].details.fallbacks == {}


class _MergedOneByOnes(torch.nn.Module):
    """HF BiT's bottleneck: a downsampling 1x1 convolution and the first 1x1 read the same
    input (they merge into one GEMM, whose channel slice feeds the group norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(64, 256, 1, bias=False)
        self.conv1 = torch.nn.Conv2d(64, 64, 1, bias=False)
        self.gn = torch.nn.GroupNorm(32, 64)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(x)
        return self.down(h), self.gn(self.conv1(h))


class _UnfoldedPatches(torch.nn.Module):
    """MobileViT-v2: a group norm over a convolution's output unfolded into patches."""

    def __init__(self) -> None:
        super().__init__()
        self.kxk = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(32)
        self.conv = torch.nn.Conv2d(32, 64, 1, bias=False)
        self.norm = torch.nn.GroupNorm(1, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(torch.nn.functional.silu(self.bn(self.kxk(x))))
        patches = torch.nn.functional.unfold(y, kernel_size=(2, 2), stride=(2, 2))
        return self.norm(patches.reshape(x.shape[0], y.shape[1], 4, -1))


@pytest.mark.parametrize("model", [_MergedOneByOnes, _UnfoldedPatches])
def test_an_opaque_call_gets_an_operand_in_a_layout_it_takes(model):
    """aten.native_group_norm (an opaque call) raises on a tensor contiguous in no memory
    format; kiln's merged GEMMs and planned views made such operands (it ran at 2x2)."""
    torch.manual_seed(0)
    module = model().eval()
    x = torch.randn(1, 32 if model is _UnfoldedPatches else 64, 2, 2)
    compiled = kiln.compile(module, (x,), kiln.Options(measure_kernels=False))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)
    assert compiled.report.fallbacks == []
