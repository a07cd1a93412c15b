"""Loop primitives: expected IR text, semantics by running, and every refusal."""

from __future__ import annotations

import pytest
import tir_cases as C

from kiln.tir.printer import print_func
from kiln.tir.schedule import Schedule, ScheduleError


def test_split_with_tail_text_and_semantics() -> None:
    graph, low = C.row_sum(5, 7)
    sch = Schedule(low.func)
    _, k = sch.get_loops("sum")
    sch.split(k, [None, 3])
    assert print_func(sch.func) == """\
def sum(x: f32[5, 7], sum: f32[5]):
  for i0 in range(5):
    for k0_0 in range(3):
      for k0_1 in range(3):
        block sum(vi0: spatial[5] = i0, vk0: reduce[7] = k0_0 * 3 + k0_1) where k0_0 * 3 + k0_1 < 7:
          init:
            sum[vi0] = 0.0
          sum[vi0] = sum[vi0] + x[vi0, vk0]
"""
    C.check_same(graph, low, sch.func)


def test_split_refusals() -> None:
    _, low = C.row_sum()
    sch = Schedule(low.func)
    with pytest.raises(ScheduleError, match="at most one None"):
        sch.split("k0", [None, None])
    with pytest.raises(ScheduleError, match="cover 4 of 7"):
        sch.split("k0", [2, 2])
    with pytest.raises(ScheduleError, match="no loop named"):
        sch.split("nope", [None, 2])
    assert len(sch.trace) == 0  # refusals leave no trace and no change


def test_fuse_and_reorder() -> None:
    graph, low = C.add_relu(3, 5)
    sch = Schedule(low.func)
    i, j = sch.get_loops("relu")
    sch.reorder(j, i)
    f = sch.fuse(j, i)
    assert print_func(sch.func).splitlines()[-3:] == [
        "    for i1_1_i0_1_fused in range(15):",
        "      block relu(vi0_1: spatial[3] = i1_1_i0_1_fused % 3, "
        "vi1_1: spatial[5] = i1_1_i0_1_fused // 3):",
        "        relu[vi0_1, vi1_1] = max(0.0, add[vi0_1, vi1_1])"]
    assert f.name == "i1_1_i0_1_fused"
    C.check_same(graph, low, sch.func)


def test_fuse_refuses_non_nested() -> None:
    _, low = C.mm()
    sch = Schedule(low.func)
    with pytest.raises(ScheduleError, match="directly nested"):
        sch.fuse("i0", "k0")


def test_reorder_refuses_dependence_and_imperfect_nest() -> None:
    _, low = C.add_relu()
    sch = Schedule(low.func)
    sch.compute_at("add", "i0_1")
    with pytest.raises(ScheduleError, match="not perfectly nested"):
        sch.reorder("i1_1", "i0_1")
    sch2 = Schedule(C.add_relu()[1].func)
    sch2.fusion("i0", "i0_1")
    with pytest.raises(ScheduleError, match="reads add written by block add"):
        sch2.reorder("i0")


def test_annotations() -> None:
    graph, low = C.mm(7, 9, 5)
    sch = Schedule(low.func)
    i, j, k = sch.get_loops("mm")
    jo, ji = sch.split(j, [None, 4])
    sch.reorder(i, jo, k, ji)
    sch.parallel(i)
    sch.vectorize(ji)
    sch.unroll(k)
    text = print_func(sch.func)
    assert "for i0 in parallel(7):" in text
    assert "for k0 in unrolled(5):" in text
    assert "for i1_1 in vectorized(4):" in text
    C.check_same(graph, low, sch.func)


def test_annotation_refusals() -> None:
    _, low = C.mm()
    sch = Schedule(low.func)
    with pytest.raises(ScheduleError, match="reduction axis of block mm"):
        sch.parallel("k0")
    with pytest.raises(ScheduleError, match="reduction axis"):
        sch.vectorize("k0")
    with pytest.raises(ScheduleError, match="only an innermost loop"):
        sch.vectorize("i0")
    sch.parallel("i0")
    with pytest.raises(ScheduleError, match="nested parallel"):
        sch.parallel("i1")
    with pytest.raises(ScheduleError, match="already parallel"):
        sch.unroll("i0")
    with pytest.raises(ScheduleError, match="split it before"):
        sch.split("i0", [None, 2])


def test_fission_and_fusion_roundtrip() -> None:
    graph, low = C.add_relu(4, 3)
    sch = Schedule(low.func)
    sch.fusion("i0", "i0_1")
    fused = print_func(sch.func)
    assert "for i0_1 in" not in fused
    C.check_same(graph, low, sch.func)
    sch.fission("i0", 1)
    assert print_func(sch.func) == print_func(low.func)  # the same names come back
    C.check_same(graph, low, sch.func)


def test_fusion_and_fission_refuse_cross_iteration_dependence() -> None:
    # relu reads add along the first axis; fuse over the second with a reordered producer
    _, low = C.add_relu(3, 3)
    sch = Schedule(low.func)
    sch.reorder("i1", "i0")  # add now loops columns outside: add's outer loop is i1
    with pytest.raises(ScheduleError, match="dependence crosses iterations"):
        sch.fusion("i1", "i0_1")
    with pytest.raises(ScheduleError, match="must directly follow"):
        sch.fusion("i0_1", "i1")
    other = Schedule(C.add_relu(3, 4)[1].func)
    other.reorder("i1", "i0")
    with pytest.raises(ScheduleError, match="extents 4 and 3"):
        other.fusion("i1", "i0_1")
