"""compute_at, reverse_compute_at, compute_inline, caches, decompose_reduction."""

from __future__ import annotations

import pytest
import tir_cases as C

from kiln.tir.compact import compact_buffers
from kiln.tir.printer import print_func
from kiln.tir.schedule import Schedule, ScheduleError


def test_compute_inline_chain() -> None:
    graph, low = C.add_relu(3, 5)
    sch = Schedule(low.func)
    sch.compute_inline("add")
    assert print_func(sch.func) == """\
def add_relu(x: f32[3, 5], y: f32[1, 5], relu: f32[3, 5]):
  for i0_1 in range(3):
    for i1_1 in range(5):
      block relu(vi0_1: spatial[3] = i0_1, vi1_1: spatial[5] = i1_1):
        relu[vi0_1, vi1_1] = max(0.0, x[vi0_1, vi1_1] + y[0, vi1_1])
"""
    C.check_same(graph, low, sch.func)


def test_compute_inline_refusals() -> None:
    _, low = C.row_sum()
    with pytest.raises(ScheduleError, match="is a reduction"):
        Schedule(low.func).compute_inline("sum")
    _, low = C.add_relu()
    with pytest.raises(ScheduleError, match="function parameter"):
        Schedule(low.func).compute_inline("relu")


def test_compute_at_text_and_semantics() -> None:
    graph, low = C.add_relu(4, 3)
    sch = Schedule(low.func)
    sch.compute_at("add", "i0_1")
    assert print_func(sch.func) == """\
def add_relu(x: f32[4, 3], y: f32[1, 3], relu: f32[4, 3]):
  alloc add: f32[4, 3]:
    for i0_1 in range(4):
      for ax0 in range(1):
        for ax1 in range(3):
          block add(vi0: spatial[4] = i0_1 + ax0, vi1: spatial[3] = ax1):
            add[vi0, vi1] = x[vi0, vi1] + y[0, vi1]
      for i1_1 in range(3):
        block relu(vi0_1: spatial[4] = i0_1, vi1_1: spatial[3] = i1_1):
          relu[vi0_1, vi1_1] = max(0.0, add[vi0_1, vi1_1])
"""
    C.check_same(graph, low, sch.func)
    compacted = print_func(compact_buffers(sch.func))
    assert "alloc add: f32[1, 3]:" in compacted  # one row per iteration


def test_compute_at_refusals() -> None:
    _, low = C.add_relu()
    sch = Schedule(low.func)
    with pytest.raises(ScheduleError, match="no block reads relu"):
        sch.compute_at("relu", "i0")
    with pytest.raises(ScheduleError, match="already under that loop"):
        sch.compute_at("add", "i1")


def test_reverse_compute_at() -> None:
    graph, low = C.add_relu(4, 6)
    sch = Schedule(low.func)
    io, ii = sch.split("i1", [None, 4])
    sch.reverse_compute_at("relu", io)
    text = print_func(sch.func)
    assert "block relu(vi0_1: spatial[4] = i0 + ax0, vi1_1: spatial[6] = i1_0 * 4 + ax1) " \
           "where i1_0 * 4 + ax1 < 6:" in text
    C.check_same(graph, low, sch.func)
    with pytest.raises(ScheduleError, match="reads nothing written under the loop"):
        Schedule(low.func).reverse_compute_at("add", "i0_1")


def test_cache_write_and_decompose_reduction() -> None:
    graph, low = C.mm(5, 6, 4)
    sch = Schedule(low.func)
    wb = sch.cache_write("mm")
    init = sch.decompose_reduction("mm", "k0")
    assert (wb.name, init.name) == ("mm_local", "mm_init")
    assert print_func(sch.func) == """\
def mm(A: f32[5, 4], B: f32[4, 6], mm: f32[5, 6]):
  alloc mm_local: f32[5, 6] local:
    for i0 in range(5):
      for i1 in range(6):
        block mm_init(vi0_init: spatial[5] = i0, vi1_init: spatial[6] = i1):
          mm_local[vi0_init, vi1_init] = 0.0
        for k0 in range(4):
          block mm(vi0: spatial[5] = i0, vi1: spatial[6] = i1, vk0: reduce[4] = k0):
            mm_local[vi0, vi1] = mm_local[vi0, vi1] + A[vi0, vk0] * B[vk0, vi1]
    for ax0 in range(5):
      for ax1 in range(6):
        block mm_local(v_ax0: spatial[5] = ax0, v_ax1: spatial[6] = ax1):
          mm[v_ax0, v_ax1] = mm_local[v_ax0, v_ax1]
"""
    C.check_same(graph, low, sch.func)


def test_decompose_and_cache_refusals() -> None:
    _, low = C.mm()
    sch = Schedule(low.func)
    sch.reorder("k0", "i0", "i1")
    with pytest.raises(ScheduleError, match="reduction loop k0 is outside"):
        sch.decompose_reduction("mm", "i0")
    cached = Schedule(low.func)
    cached.cache_write("mm")
    with pytest.raises(ScheduleError, match="not under that loop"):
        cached.decompose_reduction("mm", "ax0")
    with pytest.raises(ScheduleError, match="has no init"):
        Schedule(C.add_relu()[1].func).decompose_reduction("add", "i0")
    with pytest.raises(ScheduleError, match="does not read C"):
        Schedule(low.func).cache_read("mm", "C")
    s2 = Schedule(low.func)
    s2.decompose_reduction("mm", "i0")
    with pytest.raises(ScheduleError, match="also writes mm"):
        s2.cache_write("mm")


def test_gemm_micro_kernel_schedule() -> None:
    """The shape the GEMM heuristic needs: register tile, local accumulator, packed B panel,
    unrolled and vectorized inner loops, parallel outer loop; sizes not multiples of tiles."""
    graph, low = C.mm(10, 20, 12)
    sch = Schedule(low.func)
    i, j, k = sch.get_loops("mm")
    io, jo, ii, ji = sch.tile([i, j], [4, 8])
    ko, ki = sch.split(k, [None, 4])
    sch.reorder(io, jo, ko, ki, ii, ji)
    acc = sch.cache_write("mm")
    sch.reverse_compute_at(acc, jo)
    pack = sch.cache_read("mm", "B")
    sch.compute_at(pack, jo)
    sch.decompose_reduction("mm", ko)
    sch.vectorize(ji)
    sch.unroll(ii)
    sch.parallel(io)
    final = compact_buffers(sch.func)
    text = print_func(final)
    assert "alloc mm_local: f32[4, 8] local:" in text
    assert "alloc B_local: f32[12, 8] local:" in text
    C.check_same(graph, low, sch.func)
