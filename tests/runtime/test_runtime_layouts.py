"""kiln.runtime.layouts: strides the IR fixes, and the views between generated kernels that
the executor does not run (the next kernel reads the source's pointer, unchecked)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from kiln.engine import fused_call
from kiln.ir import parse_graph
from kiln.kernels.build import build_kernels
from kiln.passes.partition import gather, partition
from kiln.runtime import executor
from kiln.runtime.executor import Fallbacks, KernelFallbackWarning, build_executor
from kiln.runtime.layouts import known_strides, views_read_in_place
from kiln.runtime.memory import plan_memory

# two elementwise kernels with a transpose and a reshape between them, and a view of the
# first kernel's result that a library call reads too
CHAIN = """\
graph(%x: f32[8, 40], %y: f32[8, 40], %w: f32[80, 3]) {
  %s = add(%x, %y) : f32[8, 40]
  %r = relu(%s) : f32[8, 40]
  %p = permute(%r) {dims=(1, 0)} : f32[40, 8]
  %e = exp(%p) : f32[40, 8]
  %t = tanh(%e) : f32[40, 8]
  %v = view(%r) {shape=(4, 80)} : f32[4, 80]
  %c = mm(%v, %w) : f32[4, 3]
  return %t, %c
}"""


def _compiled(kernel_options):  # noqa: ANN001, ANN202
    graph = parse_graph(CHAIN)
    built = build_kernels(graph, partition(graph), kernel_options)
    moved = gather(graph, [k.group for k in built.kernels])
    plan = plan_memory(moved, [fused_call(k) for k in built.kernels])
    return moved, plan, built.kernels


def test_a_transpose_between_two_kernels_is_read_through_its_source(kernel_options) -> None:  # noqa: ANN001
    graph, plan, kernels = _compiled(kernel_options)
    assert len(kernels) == 2 and all(k.generated for k in kernels)
    planned = [v for v in plan.offsets]
    known = known_strides(graph, kernels, planned, set())
    by_name = {n.name: n.out() for n in graph.nodes}
    assert known[by_name["r"]] == (40, 1) and known[by_name["p"]] == (1, 40)
    assert known[by_name["v"]] == (80, 1)  # a reshape of a contiguous value
    in_place = views_read_in_place(graph, kernels, known, set(graph.outputs))
    # %p feeds only the second kernel, whose buffer takes %r's memory transposed; %v feeds a
    # library call, which needs the tensor
    assert in_place == {by_name["p"]: by_name["r"]}
    run, source = build_executor(graph, plan, range(3), kernels)
    # no permute; the view of the first kernel's slot made once (no kernel falls back)
    assert ".permute(" not in source and re.search(r"v\d+_v = buf\[\d+\]", source), source
    second = next(line for line in source.splitlines() if "data_ptr()" in line
                  and re.search(r"v\d+_r\.data_ptr\(\), \w+\.data_ptr\(\)\)$", line.strip()))
    assert "is_contiguous" not in second
    x, y, w = torch.randn(8, 40), torch.randn(8, 40), torch.randn(80, 3)
    x[0, 0], y[1, 1] = float("nan"), float("inf")
    r = torch.relu(x + y)
    for _ in range(2):
        t, c = run([x, y, w])
        torch.testing.assert_close(t, torch.tanh(torch.exp(r.t())), equal_nan=True)
        torch.testing.assert_close(c, r.reshape(4, 80) @ w, equal_nan=True)


def test_a_strided_operand_is_read_from_a_dense_copy_not_the_library_ops(
        kernel_options, monkeypatch) -> None:  # noqa: ANN001
    """A graph input that comes strided (a transposed tensor) to a kernel compiled to read it
    dense: the kernel reads a dense copy; it failed its layout check on every call and ran
    its group's library ops (BigBird's key and value after a torch.compile graph break)."""
    graph, plan, kernels = _compiled(kernel_options)
    fallbacks = Fallbacks()
    monkeypatch.setattr(executor, "_inputs_made_dense", lambda *args: [])  # (no entry copy)
    run, source = build_executor(graph, plan, range(3), kernels, fallbacks=fallbacks)
    assert "is_contiguous" not in source
    x, y, w = torch.randn(40, 8).t(), torch.randn(8, 40), torch.randn(80, 3)
    r = torch.relu(x + y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        for inputs in ([x, y, w], [x.contiguous(), y, w]):
            t, c = run(inputs)
            torch.testing.assert_close(t, torch.tanh(torch.exp(r.t())))
            torch.testing.assert_close(c, r.reshape(4, 80) @ w)
    assert fallbacks.counts == {}


def test_a_view_read_in_place_given_other_strides_is_copied_as_the_kernel_reads_it(
        kernel_options, monkeypatch) -> None:  # noqa: ANN001
    """A row kernel reads a permuted view where it lies (its buffer has the view's strides):
    a view with other strides at run time (its source, a graph input, came transposed: BigBird's
    bmm operands after a torch.compile graph break) is copied with the kernel's strides; it
    failed the kernel's layout check and ran the group's library ops on every call."""
    graph = parse_graph("""\
graph(%x: f32[4, 8, 16], %y: f32[8, 4, 16]) {
  %p = permute(%y) {dims=(1, 0, 2)} : f32[4, 8, 16]
  %s = add(%x, %p) : f32[4, 8, 16]
  %m = softmax(%s) {dim=-1} : f32[4, 8, 16]
  return %m
}""")
    built = build_kernels(graph, partition(graph), kernel_options)
    moved = gather(graph, [k.group for k in built.kernels])
    plan = plan_memory(moved, [fused_call(k) for k in built.kernels])
    monkeypatch.setattr(executor, "_inputs_made_dense", lambda *args: [])  # (no entry copy)
    fallbacks = Fallbacks()
    run, source = build_executor(moved, plan, range(2), built.kernels, fallbacks=fallbacks)
    assert "RELAID" in source and "LAYOUT_OK" not in source
    x, y = torch.randn(4, 8, 16), torch.randn(16, 4, 8).permute(2, 1, 0)
    y[0, 0, 0], y[1, 2, 3] = float("nan"), -float("inf")
    want = torch.softmax(x + y.permute(1, 0, 2), -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        for given in (y, y.contiguous(), y):
            torch.testing.assert_close(run([x, given])[0], want, equal_nan=True)
    assert fallbacks.counts == {}


def test_disjoint_strides_are_those_a_copy_can_have() -> None:
    assert executor.disjoint((4, 8, 16), (16, 64, 1))  # a permutation
    assert executor.disjoint((2, 3), (8, 2))  # gaps
    assert executor.disjoint((1, 5), (0, 1))  # a 0 stride over one element
    assert not executor.disjoint((4, 5), (0, 1))  # an expanded view
    assert not executor.disjoint((4, 5), (3, 1))  # rows that overlap


def test_a_row_kernels_matrix_makes_its_value_row_major(kernel_options) -> None:  # noqa: ANN001
    """A layer norm over the last dim of a 4-d value runs as a row kernel on [rows, n]: the
    value is row-major, but the buffer's strides are not the value's (ConvNeXt permutes such a
    result back to NCHW; reading them as the value's raised an IndexError in the compile)."""
    graph = parse_graph("""\
graph(%x: f32[2, 4, 4, 8]) {
  %g = constant {name='g'} : f32[8]
  %b = constant {name='b'} : f32[8]
  %ln = layer_norm(%x, %g, %b) {normalized_shape=(8,), eps=1e-05} : (f32[2, 4, 4, 8], f32[2, 4, 4, 1], f32[2, 4, 4, 1])
  %p = permute(%ln#0) {dims=(0, 3, 1, 2)} : f32[2, 8, 4, 4]
  %e = exp(%p) : f32[2, 8, 4, 4]
  %t = tanh(%e) : f32[2, 8, 4, 4]
  return %t
}""", {"g": torch.randn(8), "b": torch.randn(8)})  # noqa: E501
    built = build_kernels(graph, partition(graph), kernel_options)
    assert len(built.kernels) == 2
    moved = gather(graph, [k.group for k in built.kernels])
    plan = plan_memory(moved, [fused_call(k) for k in built.kernels])
    ln = next(n for n in moved.nodes if n.name == "ln")
    known = known_strides(moved, built.kernels, plan.offsets, set())
    assert known[ln.outputs[0]] == (128, 32, 8, 1)
    p = next(n for n in moved.nodes if n.name == "p")
    assert known[p.out()] == (128, 1, 32, 8)
    run, _ = build_executor(moved, plan, range(1), built.kernels)
    x = torch.randn(2, 4, 4, 8)
    want = torch.tanh(torch.exp(torch.nn.functional.layer_norm(
        x, (8,), graph.constant(next(n for n in graph.nodes if n.name == "g")),
        graph.constant(next(n for n in graph.nodes if n.name == "b"))).permute(0, 3, 1, 2)))
    torch.testing.assert_close(run([x])[0], want, rtol=1e-4, atol=1e-4)


def _softmax_of_a_sum_with_a_view(kernel_options, x: tuple, y: tuple, dims: tuple):  # noqa: ANN001, ANN202
    """softmax(x + permute(y)) built as kernels and run by an executor: (its kernels, the
    executor's source, the output on random inputs, the output wanted)."""
    graph = parse_graph(f"""\
graph(%x: f32[{', '.join(map(str, x))}], %y: f32[{', '.join(map(str, y))}]) {{
  %p = permute(%y) {{dims={dims}}} : f32[{', '.join(map(str, x))}]
  %s = add(%x, %p) : f32[{', '.join(map(str, x))}]
  %m = softmax(%s) {{dim=-1}} : f32[{', '.join(map(str, x))}]
  return %m
}}""")
    built = build_kernels(graph, partition(graph), kernel_options)
    moved = gather(graph, [k.group for k in built.kernels])
    run, source = build_executor(moved, plan_memory(moved, [fused_call(k) for k in built.kernels]),
                                 range(2), built.kernels)
    a, b = torch.randn(x), torch.randn(y)
    return built.kernels, source, run([a, b])[0], torch.softmax(a + b.permute(dims), -1)


def test_a_view_read_dense_is_copied_once_before_its_kernel(kernel_options) -> None:  # noqa: ANN001
    """A row kernel's prologue reads a permuted view (T5's position bias) dense: the
    executor copies it dense and calls the kernel; it checked the view's layout, found it
    strided on every call and ran the library ops instead."""
    kernels, source, got, want = _softmax_of_a_sum_with_a_view(
        kernel_options, (4, 16, 16), (16, 16, 4), (2, 0, 1))
    assert [[n.name for n in k.group.nodes] for k in kernels] == [["s", "m"]]
    assert re.search(r"v\d+_p_dense = v\d+_p\.contiguous\(\)", source), source
    assert not re.search(r"_p\.is_contiguous", source)  # (x, an input, is still checked)
    torch.testing.assert_close(got, want)


def test_a_view_along_the_rows_is_read_where_it_lies(kernel_options) -> None:  # noqa: ANN001
    """A permuted view whose rows stay contiguous: the row kernel reads it in place (its
    buffer has the view's strides), no copy."""
    kernels, source, got, want = _softmax_of_a_sum_with_a_view(
        kernel_options, (4, 8, 16), (8, 4, 16), (1, 0, 2))
    (kernel,) = kernels
    assert (16, 64, 1) in [b.elem_strides for b in kernel.kernel.func.inputs]
    assert "_dense" not in source
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
def test_a_library_result_atens_strides_made_dense_for_the_kernel_reading_it(entry) -> None:
    """ATen keeps a strided operand's layout in its result (an average pool of a transposed
    projection: SEW-D's front end); the kernel after it, compiled for a contiguous operand,
    failed its layout check on every call and ran its library ops. The result is now made
    dense where a generated kernel reads it."""
    import kiln

    class Front(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(32, 48)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.proj(x).transpose(1, 2)  # [1, 48, 20], a transposed view
            pooled = torch.nn.functional.avg_pool1d(h, 2)  # ATen keeps the transposition
            return (pooled + torch.nn.functional.gelu(pooled * 3.0)).transpose(1, 2)

    torch.manual_seed(0)
    model, x = Front().eval(), torch.randn(1, 20, 32)
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        fast = kiln.compile(model, (x,)) if entry == "kiln.compile" else \
            torch.compile(model, backend="kiln")
        for _ in range(2):
            torch.testing.assert_close(fast(x), model(x))


def test_a_library_op_reads_a_strided_input_as_eager_mode_does(kernel_options) -> None:  # noqa: ANN001
    """A strided input that a kernel and a library op both read is not copied dense for the
    kernel: ATen's erf-form GELU is inf at inf in its scalar loop (a strided input) and NaN
    vectorized (a dense one), so the library op must see eager's layout (fuzz seed 0, graph
    402, after strided inputs were first made dense for the kernels)."""
    from kiln.engine import compile_graph

    graph = parse_graph("""\
graph(%x: f32[9], %b: f32[9], %w: f32[17, 9]) {
  %ln = layer_norm(%w, %x, %b) {normalized_shape=(9,), eps=1e-12} : (f32[17, 9], f32[17, 1], f32[17, 1])
  %g = gelu(%b) {approximate='none'} : f32[9]
  return %ln#0, %g
}""")  # noqa: E501
    x, w = torch.randn(9), torch.randn(17, 9)
    b = torch.randn(18)[::2]  # every other element of a buffer twice as large
    b[6] = float("inf")
    compiled = compile_graph(graph, kernel_options, range(3))
    assert any(k.kind == "generated" for k in compiled.report.kernels)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelFallbackWarning)
        ln, g = compiled([x, b, w])
    torch.testing.assert_close(g, torch.nn.functional.gelu(b), equal_nan=True)
    torch.testing.assert_close(ln, torch.nn.functional.layer_norm(w, (9,), x, b, 1e-12))
