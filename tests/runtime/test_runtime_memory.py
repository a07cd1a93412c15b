"""Static memory planning, checked against an independent model of lifetimes and aliasing.

The oracle below is written from the planner's contract, not from its code: a value is live
from its defining node to the last node that reads it or any view of it, and a graph output
(or anything an output views) belongs to the caller and is never planned.
"""

from __future__ import annotations

import itertools
import re
import warnings

import pytest
import torch

import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.engine import fused_call
from kiln.ir import Graph, Op, OpGroup, Value, parse_graph, verify
from kiln.kernels.build import build_kernels
from kiln.passes.partition import gather, partition
from kiln.runtime import executor
from kiln.runtime.executor import KernelFallbackWarning, build_executor
from kiln.runtime.memory import ALIGNMENT, OUT_VARIANTS, FusedCall, MemoryPlan, plan_memory


def _storage_sources(value: Value) -> set[Value]:
    """Every value whose storage ``value`` may share, itself included."""
    node = value.node
    sources = {value}
    if node.op.is_a(OpGroup.VIEW):
        sources |= _storage_sources(node.inputs[0])
    elif node.op is Op.CALL:
        returns = node.attrs.target._schema.returns
        if any(r.alias_info is not None for r in returns):
            for operand in node.inputs:
                sources |= _storage_sources(operand)
    return sources


def _live_ranges(graph: Graph) -> dict[Value, tuple[int, int]]:
    """[first, last] node index during which each body value's bytes must stay intact."""
    ranges = {v: (i, i) for i, node in enumerate(graph.nodes) for v in node.outputs}
    for i, node in enumerate(graph.nodes):
        for operand in node.inputs:
            for source in _storage_sources(operand):
                if source in ranges:
                    first, last = ranges[source]
                    ranges[source] = (first, max(last, i))
    return ranges


def _escaping(graph: Graph) -> set[Value]:
    escaped: set[Value] = set()
    for output in graph.outputs:
        escaped |= _storage_sources(output)
    return escaped


def check_plan(graph: Graph, plan: MemoryPlan) -> None:
    ranges = _live_ranges(graph)
    assert not set(plan.offsets) & _escaping(graph), "an output's storage was planned"
    for value, offset in plan.offsets.items():
        assert value.node.op in OUT_VARIANTS and len(value.node.types) == 1
        assert offset % ALIGNMENT == 0
        assert offset + value.type.nbytes <= plan.arena_bytes
    for a, b in itertools.combinations(plan.offsets, 2):
        (a_first, a_last), (b_first, b_last) = ranges[a], ranges[b]
        if a_first <= b_last and b_first <= a_last:  # both live at some node
            a_end = plan.offsets[a] + a.type.nbytes
            b_end = plan.offsets[b] + b.type.nbytes
            assert a_end <= plan.offsets[b] or b_end <= plan.offsets[a], (
                f"{a} and {b} are live together but share bytes")
    assert plan.planned_bytes >= sum(v.type.nbytes for v in plan.offsets)


@pytest.mark.parametrize("stage", ["captured", "optimized"])
def test_zoo_plan_never_overlaps_live_values(zoo_case, stage: str) -> None:
    graph = zoo_case.graph if stage == "captured" else support.optimized(zoo_case.name)[0]
    plan = plan_memory(graph)
    check_plan(graph, plan)
    assert plan.offsets, "every zoo model has plannable intermediates"
    assert plan.arena_bytes <= plan.planned_bytes <= plan.intermediate_bytes


CHAIN = """\
graph(%x: f32[64, 64]) {
  %a = exp(%x) : f32[64, 64]
  %b = tanh(%a) : f32[64, 64]
  %c = exp(%b) : f32[64, 64]
  %d = tanh(%c) : f32[64, 64]
  %e = sigmoid(%d) : f32[64, 64]
  return %e
}
"""


def test_chain_reuses_two_buffers() -> None:
    graph = parse_graph(CHAIN)
    plan = plan_memory(graph)
    check_plan(graph, plan)
    size = 64 * 64 * 4
    assert sorted(str(v) for v in plan.offsets) == ["%a", "%b", "%c", "%d"]
    assert plan.planned_bytes == 4 * size
    assert plan.arena_bytes == 2 * size < plan.planned_bytes
    assert plan.reuse_ratio == 2.0
    offsets = {str(v): off for v, off in plan.offsets.items()}
    assert offsets["%a"] == offsets["%c"] != offsets["%b"] == offsets["%d"]


def test_outputs_and_what_they_view_are_not_planned() -> None:
    graph = parse_graph("""\
graph(%x: f32[16, 16], %w: f32[16, 16]) {
  %a = exp(%x) : f32[16, 16]
  %va = view(%a) {shape=(256,)} : f32[256]
  %b = mm(%x, %w) : f32[16, 16]
  %pb = permute(%b) {dims=(1, 0)} : f32[16, 16]
  %vb = view(%pb) {shape=(16, 16)} : f32[16, 16]
  %c = tanh(%x) : f32[16, 16]
  %tc = call(%c) {target=aten.t.default, args=(arg(0),), kwargs=()} : f32[16, 16]
  %d = add(%x, %w) : f32[16, 16]
  %e = sigmoid(%d) : f32[16, 16]
  return %va, %tc, %e, %pb
}""")
    verify(graph)
    plan = plan_memory(graph)
    check_plan(graph, plan)
    assert sorted(str(v) for v in plan.offsets) == ["%d"]


def test_a_view_keeps_its_source_alive() -> None:
    graph = parse_graph("""\
graph(%x: f32[32, 32]) {
  %a = exp(%x) : f32[32, 32]
  %v = permute(%a) {dims=(1, 0)} : f32[32, 32]
  %b = tanh(%x) : f32[32, 32]
  %c = sigmoid(%x) : f32[32, 32]
  %d = add(%b, %c) : f32[32, 32]
  %e = mul(%v, %d) : f32[32, 32]
  return %e
}""")
    plan = plan_memory(graph)
    check_plan(graph, plan)
    assert {str(v) for v in plan.offsets} == {"%a", "%b", "%c", "%d"}
    offsets = {str(v): off for v, off in plan.offsets.items()}
    assert offsets["%a"] not in (offsets["%b"], offsets["%c"], offsets["%d"])


def test_only_ops_with_native_out_variants_and_tensor_operands_are_planned() -> None:
    graph = parse_graph("""\
graph(%x: f32[8, 8]) {
  %c = scalar {value=2.0} : f64[]
  %a = mul(%x, %c) : f32[8, 8]
  %r = relu(%x) : f32[8, 8]
  %s = sum(%r) {dims=None, keepdim=False} : f32[]
  %k = sum(%r) {dims=(1,), keepdim=True} : f32[8, 1]
  %l = layer_norm(%x, %x, %x) {normalized_shape=(8, 8), eps=1e-05} : (f32[8, 8], f32[1, 1], f32[1, 1])
  %e = exp(%a) : f32[8, 8]
  %y = add(%e, %k) : f32[8, 8]
  %z = add(%y, %s) : f32[8, 8]
  %o = add(%z, %l#0) : f32[8, 8]
  return %o
}""")  # noqa: E501
    verify(graph)
    plan = plan_memory(graph)
    check_plan(graph, plan)
    assert sorted(str(v) for v in plan.offsets) == ["%e", "%k", "%y", "%z"]


def test_graph_without_plannable_values_has_an_empty_arena() -> None:
    graph = parse_graph("""\
graph(%x: f32[4]) {
  %r = relu(%x) : f32[4]
  %n = neg(%r) : f32[4]
  return %n
}""")
    plan = plan_memory(graph)
    assert (plan.offsets, plan.arena_bytes, plan.planned_bytes) == ({}, 0, 0)
    assert plan.intermediate_bytes == 16
    assert plan.reuse_ratio == 1.0


def test_arena_never_exceeds_planned_bytes_for_small_tensors() -> None:
    graph = parse_graph("""\
graph(%x: f32[3]) {
  %a = exp(%x) : f32[3]
  %b = tanh(%a) : f32[3]
  return %b
}""")
    plan = plan_memory(graph)
    assert plan.arena_bytes <= plan.planned_bytes
    assert plan.reuse_ratio >= 1.0


def test_planned_buffers_do_not_alias_inputs_or_weights() -> None:
    graph = parse_graph("""\
graph(%x: f32[8]) {
  %w = constant {name='w'} : f32[8]
  %a = add(%x, %w) : f32[8]
  %b = mul(%a, %w) : f32[8]
  %c = relu(%b) : f32[8]
  return %c
}""", {"w": torch.ones(8)})
    plan = plan_memory(graph)
    check_plan(graph, plan)
    assert all(v.node.op not in (Op.INPUT, Op.CONSTANT, Op.SCALAR) for v in plan.offsets)


FUSED = """\
graph(%x: f32[32, 32], %y: f32[32, 32]) {
  %e = exp(%x) : f32[32, 32]
  %s = add(%e, %y) : f32[32, 32]
  %r = relu(%s) : f32[32, 32]
  %o = mul(%r, %r) : f32[32, 32]
  return %o
}
"""


def _fused_add_relu(graph: Graph) -> FusedCall:
    by_name = {n.name: n for n in graph.nodes}
    s, r = by_name["s"], by_name["r"]
    return FusedCall((s, r), (by_name["e"].out(), graph.inputs[1].out()), (r.out(),),
                     frozenset({s.out()}))


def test_a_kernel_output_is_planned_and_never_shares_bytes_with_its_inputs() -> None:
    graph = parse_graph(FUSED)
    alone = plan_memory(graph)
    assert sorted(str(v) for v in alone.offsets) == ["%e", "%s"]  # relu has no out= kernel
    plan = plan_memory(graph, [_fused_add_relu(graph)])
    assert sorted(str(v) for v in plan.offsets) == ["%e", "%r"]  # %s is never materialized
    e, r = (v for v in plan.offsets if str(v) in ("%e", "%r"))
    # %e's last library reader is %s, before %r's node, but the kernel reads %e while it
    # writes %r: the two must not overlap
    size = 32 * 32 * 4
    assert abs(plan.offsets[e] - plan.offsets[r]) >= size
    assert plan.intermediate_bytes == 2 * size  # %e and %r; %s never exists


def test_kernel_outputs_are_placed_in_the_arena_by_the_executor(
        kernel_options, monkeypatch) -> None:  # noqa: ANN001
    graph = parse_graph("""\
graph(%x: f32[8, 40], %y: f32[8, 40], %w: f32[40, 8]) {
  %s = add(%x, %y) : f32[8, 40]
  %r = relu(%s) : f32[8, 40]
  %o = mm(%r, %w) : f32[8, 8]
  return %o
}""")
    built = build_kernels(graph, partition(graph), kernel_options)
    assert [[n.name for n in k.group.nodes] for k in built.kernels] == [["s", "r"]]
    moved = gather(graph, [k.group for k in built.kernels])
    plan = plan_memory(moved, [fused_call(k) for k in built.kernels])
    assert "%r" in {str(v) for v in plan.offsets}
    # (no entry copy of the strided input: the kernel's own dense copy is tested)
    monkeypatch.setattr(executor, "_inputs_made_dense", lambda *args: [])
    run, source = build_executor(moved, plan, range(3), built.kernels)
    assert re.search(r"v\d+_r = buf\[\d+\]", source), source
    x, y, w = torch.randn(8, 40), torch.randn(8, 40), torch.randn(40, 8)
    expected = torch.relu(x + y) @ w
    for _ in range(2):  # the arena is reused across calls
        torch.testing.assert_close(run([x, y, w])[0], expected)
    strided = x.t().contiguous().t()  # the kernel reads a dense copy; same answer
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        torch.testing.assert_close(run([strided, y, w])[0], expected)
