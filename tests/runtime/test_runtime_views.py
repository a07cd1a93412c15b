"""kiln.runtime.views: views of arena slots made once a thread, the executor reading them
as slots; views that would copy, and views of values not always in their slot, still run."""

from __future__ import annotations

import threading

import pytest
import torch

from kiln.engine import fused_call
from kiln.ir import parse_graph, verify
from kiln.ir.interp import interpret
from kiln.kernels.build import build_kernels
from kiln.passes.partition import gather, partition
from kiln.runtime import executor
from kiln.runtime.executor import KernelFallbackWarning, build_executor
from kiln.runtime.memory import plan_memory

# a merged QKV product split into heads (views of a planned mm result), a permute then a
# reshape that must copy, and a view of that copy
HEADS = """graph(%x: f32[6, 8], %w: f32[8, 24]) {
  %m = mm(%x, %w) : f32[6, 24]
  %parts = split(%m) {sizes=(8, 8, 8), dim=1} : (f32[6, 8], f32[6, 8], f32[6, 8])
  %q = view(%parts#0) {shape=(6, 2, 4)} : f32[6, 2, 4]
  %qt = permute(%q) {dims=(1, 0, 2)} : f32[2, 6, 4]
  %k = view(%parts#1) {shape=(6, 2, 4)} : f32[6, 2, 4]
  %kt = permute(%k) {dims=(1, 2, 0)} : f32[2, 4, 6]
  %s = bmm(%qt, %kt) : f32[2, 6, 6]
  %flat = view(%qt) {shape=(12, 4)} : f32[12, 4]
  %e = exp(%flat) : f32[12, 4]
  %v = view(%parts#2) {shape=(6, 2, 4)} : f32[6, 2, 4]
  %n = neg(%v) : f32[6, 2, 4]
  return %s, %e, %n
}"""


def test_views_of_a_slot_are_made_once_and_follow_its_values() -> None:
    """The split and the head views read the arena (no ATen call for them per call); the
    reshape of the permuted heads copies, so it runs; results match the interpreter on
    every call, with a NaN and an inf, and on another thread's arena."""
    graph = parse_graph(HEADS)
    verify(graph)
    run, source = build_executor(graph, plan_memory(graph), range(2))
    assert "split" not in source and ".permute(" not in source
    assert ".reshape((12, 4))" in source  # (a copy: it runs on every call)
    assert ".reshape((6, 2, 4))" not in source
    for seed in range(3):
        x, w = torch.randn(6, 8, generator=torch.Generator().manual_seed(seed)), torch.randn(8, 24)
        x[1, 2], w[3, 5] = float("nan"), float("inf")
        want = interpret(graph, [x, w])
        for got, expected in zip(run([x, w]), want, strict=True):
            torch.testing.assert_close(got, expected, equal_nan=True)
    found: list[list[torch.Tensor]] = []
    thread = threading.Thread(target=lambda: found.append(run([x, w])))
    thread.start()
    thread.join()
    for got, expected in zip(found[0], want, strict=True):
        torch.testing.assert_close(got, expected, equal_nan=True)


CHECKED = """graph(%x: f32[8, 40], %y: f32[1, 40], %w: f32[80, 3]) {
  %e = expand(%y) {shape=(8, 40)} : f32[8, 40]
  %s = add(%x, %e) : f32[8, 40]
  %r = relu(%s) : f32[8, 40]
  %v = view(%r) {shape=(4, 80)} : f32[4, 80]
  %c = mm(%v, %w) : f32[4, 3]
  return %c
}"""


def test_a_view_of_a_kernel_output_behind_a_layout_check_runs_every_call(
        kernel_options, monkeypatch) -> None:  # noqa: ANN001
    """The add + relu kernel reads an expanded view where it lies (a 0 stride, which no
    copy can have), behind a check of its strides, and may run its library ops instead,
    which allocate: its result is then not in its slot, so the view of it must run on
    every call (a view made once would read the slot's stale values)."""
    graph = parse_graph(CHECKED)
    built = build_kernels(graph, partition(graph), kernel_options)
    moved = gather(graph, [k.group for k in built.kernels])
    plan = plan_memory(moved, [fused_call(k) for k in built.kernels])
    # (no entry copy of the strided input: the fallback is tested)
    monkeypatch.setattr(executor, "_inputs_made_dense", lambda *args: [])
    run, source = build_executor(moved, plan, range(3), built.kernels)
    assert ".reshape((4, 80))" in source
    x, y, w = torch.randn(8, 40), torch.randn(1, 40), torch.randn(80, 3)
    torch.testing.assert_close(run([x, y, w])[0], torch.relu(x + y).reshape(4, 80) @ w)
    strided = (-torch.randn(1, 80))[:, ::2]  # other values, and a layout the kernel refuses
    with pytest.warns(KernelFallbackWarning):
        got = run([x, strided, w])[0]
    torch.testing.assert_close(got, torch.relu(x + strided).reshape(4, 80) @ w)
