"""Default schedules on lowered kernels: compiled results against the interpreter."""

from __future__ import annotations

import pytest
import torch

from kiln.codegen.c import render_c
from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.ir import attrs as A
from kiln.ir.builder import GraphBuilder
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.kernels.loops_schedule import default_schedule
from kiln.options import Options
from kiln.tir.interp import run_torch
from kiln.tir.lower import lower_chain


def _lowered(types, build):  # noqa: ANN001, ANN202
    b = GraphBuilder()
    xs = [b.input(f"x{k}", TensorType(t, DType.F32)) for k, t in enumerate(types)]
    out = build(b, *xs)
    graph = b.build(out)
    body = [n for n in graph.nodes if n.op not in (Op.SCALAR, Op.CONSTANT)]
    return lower_chain(body, outputs=[out]).func


PROGRAMS = {
    "add_relu": ([(3, 37), (3, 37)],
                 lambda b, x, y: b.op(Op.RELU, b.op(Op.ADD, x, y))),
    "bias_gelu": ([(5, 70), (1, 70)],
                  lambda b, x, y: b.op(Op.GELU, b.op(Op.ADD, x, y), attrs=A.GeluAttrs("none"))),
    "long_1d": ([(1000,), (1000,)], lambda b, x, y: b.op(Op.MUL, x, y)),
    "softmax": ([(6, 33)], lambda b, x: b.op(Op.SOFTMAX, x, attrs=A.SoftmaxAttrs(-1))),
    "row_sum": ([(4, 19)], lambda b, x: b.op(Op.SUM, x, attrs=A.ReduceAttrs((1,)))),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_default_schedule_compiles_and_matches(options: Options, name: str) -> None:
    types, build = PROGRAMS[name]
    func = _lowered(types, build)
    scheduled, trace = default_schedule(func)
    text = render_c(scheduled)
    assert "#pragma omp" in text  # something was parallelized or vectorized
    kernel = compile_kernel(scheduled, options)
    assert isinstance(kernel, CompiledKernel)
    torch.manual_seed(0)
    inputs = [torch.randn(t) for t in types]
    outs = [torch.full(b.shape, float("nan")) for b in scheduled.outputs]
    kernel(*inputs, *outs)
    want = run_torch(func, inputs)  # the unscheduled program is the oracle
    for got, ref in zip(outs, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert trace.as_python()  # the schedule is a replayable trace


def test_a_view_input_is_read_with_its_run_time_strides(options: Options) -> None:
    """Rotary embeddings multiply a permute of q: the loops kernel reads the view where it
    lies (its buffer has the permute's strides), so the executor's layout check passes and
    the library calls do not run in its place."""
    from kiln.ir import parse_graph
    from kiln.passes.partition import partition
    from kiln.tune.space_groups import GroupSpace

    cos = torch.randn(1, 1, 8, 16)
    graph = parse_graph("""graph(%q: f32[8, 64]) {
  %cos = constant {name='cos'} : f32[1, 1, 8, 16]
  %v = view(%q) {shape=(1, 8, 4, 16)} : f32[1, 8, 4, 16]
  %t = permute(%v) {dims=(0, 2, 1, 3)} : f32[1, 4, 8, 16]
  %m = mul(%t, %cos) : f32[1, 4, 8, 16]
  %y = add(%m, %t) : f32[1, 4, 8, 16]
  return %y
}""", {"cos": cos})
    (group,) = partition(graph)
    space = GroupSpace.of(graph, group)
    plan, ins, _ = space.planned_in_source(space.default(), record=False)
    func = plan.build()
    (strided,) = [b for b, v in zip(func.inputs, ins) if v.node.op is not Op.CONSTANT]
    assert strided.strides == (512, 16, 64, 1)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    q = torch.randn(8, 64)
    t = q.view(1, 8, 4, 16).permute(0, 2, 1, 3)
    out = torch.empty(1, 4, 8, 16)
    kernel.run_unchecked(t.data_ptr(), cos.data_ptr(), out.data_ptr())
    torch.testing.assert_close(out, t * cos + t)


def test_a_batch_of_one_shares_its_rows_over_the_threads() -> None:
    """[1, S, H] at batch 1: the threads take the S loop, not the batch loop of one
    iteration (Llama's SiLU over [1, 128, 1376] ran on one thread)."""
    from kiln.tir.nodes import For, ForKind
    from kiln.tir.visit import iter_stmts

    func = _lowered([(1, 128, 1376), (1, 128, 1376)],
                    lambda b, x, y: b.op(Op.MUL, b.op(Op.SIGMOID, x), y))
    scheduled, _ = default_schedule(func)
    loops = [s for s in iter_stmts(scheduled.body) if isinstance(s, For)]
    assert [lp.extent for lp in loops if lp.kind is ForKind.PARALLEL] == [128]
    assert loops[0].extent == 1 and loops[0].kind is ForKind.SERIAL


def test_an_nhwc_output_puts_the_channel_loop_inside_and_vectorizes_it(
        options: Options) -> None:
    """A written buffer with NHWC strides: the loops in memory order (n, h, w, c), the
    channel loop vectorized, h on the threads; the values are the lowered chain's."""
    from kiln.kernels.loops import read_views_in_place
    from kiln.tir.nodes import For, ForKind, PrimFunc, channels_last_strides
    from kiln.tir.visit import iter_stmts

    shape = (1, 24, 6, 5)
    b = GraphBuilder()
    x = b.input("x", TensorType(shape, DType.F32))
    bias = b.input("bias", TensorType((24, 1, 1), DType.F32))
    y = b.op(Op.MUL, b.op(Op.SIGMOID, b.op(Op.ADD, x, bias)), x)
    graph = b.build(y)
    lowered = lower_chain(graph.nodes, outputs=graph.outputs)
    nhwc = channels_last_strides(shape)
    body, ins = read_views_in_place(lowered.func.body, lowered.func.inputs, lowered.inputs,
                                    {graph.inputs[0].out(): nhwc})
    body, outs = read_views_in_place(body, lowered.func.outputs, lowered.outputs,
                                     {graph.outputs[0]: nhwc})
    scheduled, trace = default_schedule(PrimFunc(lowered.func.name, ins, outs, body))
    loops = [s for s in iter_stmts(scheduled.body) if isinstance(s, For)]
    assert [lp.extent for lp in loops] == [1, 6, 5, 24]
    assert [lp.kind for lp in loops][1:] == [ForKind.PARALLEL, ForKind.SERIAL,
                                             ForKind.VECTORIZED]
    assert "sch.reorder(" in trace.as_python()
    kernel = compile_kernel(scheduled, options)
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last)
    xs[0, 3, 2, 1] = float("nan")
    xs[0, 5, 0, 0] = -float("inf")
    bs = torch.randn(24, 1, 1, generator=gen)
    out = torch.empty(shape).contiguous(memory_format=torch.channels_last)
    kernel.run_unchecked(xs.data_ptr(), bs.data_ptr(), out.data_ptr())
    torch.testing.assert_close(out, torch.sigmoid(xs + bs) * xs, equal_nan=True)
