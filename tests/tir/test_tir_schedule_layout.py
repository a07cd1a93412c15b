"""transform_layout and cache_inplace (the GEMM's packing and accumulator primitives), and the
lowering steps after compaction: index simplification, padded tiles, tail versioning."""

from __future__ import annotations

import numpy as np
import pytest
import tir_cases as C
import torch

from kiln.ir.interp import interpret
from kiln.tir.compact import compact_buffers
from kiln.tir.indices import simplify_indices
from kiln.tir.interp import run, run_torch
from kiln.tir.printer import print_func
from kiln.tir.schedule import Schedule, ScheduleError
from kiln.tir.tails import drop_dead_guards, version_tails
from kiln.tir.trace import Trace

PANELS = [(1, "//", 4), (0, "", 0), (1, "%", 4)]  # (k, n) -> (n // 4, k, n % 4)


def check_lowered(graph, low, func) -> None:  # noqa: ANN001
    """Like tir_cases.check_same, for a program already compacted and lowered further."""
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(n.type.shape, generator=gen) for n in graph.inputs]
    by_value = dict(zip([n.out() for n in graph.inputs], inputs))
    got = run_torch(func, [by_value[v] for v in low.inputs])
    for g, e in zip(got, interpret(graph, inputs)):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_transform_layout_text_and_semantics() -> None:
    graph, low = C.mm(4, 6, 3)
    sch = Schedule(low.func)
    sch.cache_read("mm", "B")
    sch.transform_layout("mm", "B_local", PANELS)
    assert print_func(sch.func) == """\
def mm(A: f32[4, 3], B: f32[3, 6], mm: f32[4, 6]):
  alloc B_local: f32[2, 3, 4] local:
    for ax0 in range(3):
      for ax1 in range(6):
        block B_local(v_ax0: spatial[3] = ax0, v_ax1: spatial[6] = ax1):
          B_local[v_ax1 // 4, v_ax0, v_ax1 % 4] = B[v_ax0, v_ax1]
    for i0 in range(4):
      for i1 in range(6):
        for k0 in range(3):
          block mm(vi0: spatial[4] = i0, vi1: spatial[6] = i1, vk0: reduce[3] = k0):
            init:
              mm[vi0, vi1] = 0.0
            mm[vi0, vi1] = mm[vi0, vi1] + A[vi0, vk0] * B_local[vi1 // 4, vk0, vi1 % 4]
"""
    C.check_same(graph, low, sch.func)
    assert ("sch.transform_layout(b_mm, buffer='B_local', "
            "index_map=[[1, '//', 4], [0, '', 0], [1, '%', 4]])") in sch.trace.as_python()


def test_transform_layout_of_a_packed_panel_compacts() -> None:
    graph, low = C.mm(8, 12, 5)
    sch = Schedule(low.func)
    i, j, k = sch.get_loops("mm")
    jo, ji = sch.split(j, [None, 8])
    sch.reorder(jo, i, k, ji)
    b = sch.cache_read("mm", "B")
    sch.compute_at(b, jo)
    sch.transform_layout("mm", "B_local", PANELS)
    func = simplify_indices(compact_buffers(sch.func))
    text = print_func(func)
    assert "alloc B_local: f32[2, 5, 4] local:" in text  # one 8-column panel pair per jo
    assert "B_local[i1_1 // 4, k0, i1_1 % 4]" in text  # in loop vars, the jo offset gone
    C.check_same(graph, low, func)


def test_transform_layout_refusals() -> None:
    _, low = C.mm(4, 6, 3)
    sch = Schedule(low.func)
    with pytest.raises(ScheduleError, match="is a function parameter"):
        sch.transform_layout("mm", "B", PANELS)
    with pytest.raises(ScheduleError, match="does not access C"):
        sch.transform_layout("mm", "C", PANELS)
    sch.cache_read("mm", "B")
    for bad, why in [([(0, "", 0), (1, "//", 4)], "not a bijection"),
                     ([(0, "", 0), (0, "", 0), (1, "", 0)], "not a bijection"),
                     ([(1, "//", 4), (0, "", 0), (1, "%", 2)], "not a bijection"),
                     ([(0, "", 0)], "not a bijection"),
                     ([(2, "", 0), (0, "", 0)], "uses x2 of a rank-2 buffer"),
                     ([(1, "*", 4), (0, "", 0)], "unknown operation"),
                     ([(1, "//", 0), (0, "", 0), (1, "%", 0)], "must be positive")]:
        with pytest.raises(ScheduleError, match=why):
            sch.transform_layout("mm", "B_local", bad)
    assert len(sch.trace) == 1  # refusals leave no instruction behind


def test_cache_inplace_text_and_semantics() -> None:
    graph, low = C.mm(4, 6, 3)
    sch = Schedule(low.func)
    i, _, _ = sch.get_loops("mm")
    sch.decompose_reduction("mm", i)
    load, store = sch.cache_inplace("mm", "mm")
    assert (load.name, store.name) == ("mm_local", "mm_local_1")
    C.check_same(graph, low, sch.func)
    sch.reverse_compute_at(store, i)  # write-back first: the load still runs before the loop
    sch.compute_at(load, i)
    assert print_func(sch.func) == """\
def mm(A: f32[4, 3], B: f32[3, 6], mm: f32[4, 6]):
  alloc mm_local: f32[4, 6] local:
    for i0_init in range(4):
      for i1_init in range(6):
        block mm_init(vi0_init: spatial[4] = i0_init, vi1_init: spatial[6] = i1_init):
          mm[vi0_init, vi1_init] = 0.0
    for i0 in range(4):
      for ax0_1 in range(1):
        for ax1_1 in range(6):
          block mm_local(v_ax0: spatial[4] = i0 + ax0_1, v_ax1: spatial[6] = ax1_1):
            mm_local[v_ax0, v_ax1] = mm[v_ax0, v_ax1]
      for i1 in range(6):
        for k0 in range(3):
          block mm(vi0: spatial[4] = i0, vi1: spatial[6] = i1, vk0: reduce[3] = k0):
            mm_local[vi0, vi1] = mm_local[vi0, vi1] + A[vi0, vk0] * B[vk0, vi1]
      for ax0_2 in range(1):
        for ax1_2 in range(6):
          block mm_local_1(v_ax0_1: spatial[4] = i0 + ax0_2, v_ax1_1: spatial[6] = ax1_2):
            mm[v_ax0_1, v_ax1_1] = mm_local[v_ax0_1, v_ax1_1]
"""
    C.check_same(graph, low, sch.func)
    assert "alloc mm_local: f32[1, 6] local:" in print_func(compact_buffers(sch.func))
    assert "b_mm_local, b_mm_local_1 = sch.cache_inplace(b_mm, buffer='mm', scope='local')" \
        in sch.trace.as_python()


def test_cache_inplace_refusals() -> None:
    _, low = C.mm(4, 6, 3)
    sch = Schedule(low.func)
    with pytest.raises(ScheduleError, match="has an init; decompose_reduction first"):
        sch.cache_inplace("mm", "mm")
    with pytest.raises(ScheduleError, match="does not both read and write A"):
        sch.cache_inplace("mm", "A")
    i, _, _ = sch.get_loops("mm")
    io, ii = sch.split(i, [None, 2])
    sch.decompose_reduction("mm", ii)  # the init, and so the copies, run inside io
    _, store = sch.cache_inplace("mm", "mm")
    with pytest.raises(ScheduleError, match="written outside it, by block mm_local, not once "
                                            "before it"):
        sch.reverse_compute_at(store, ii)


def test_new_verbs_replay_from_json() -> None:
    graph, low = C.mm(8, 12, 5)
    sch = Schedule(low.func)
    i, j, k = sch.get_loops("mm")
    sch.decompose_reduction("mm", i)
    load, store = sch.cache_inplace("mm", "mm")
    sch.reverse_compute_at(store, i)
    sch.compute_at(load, i)
    sch.cache_read("mm", "B")
    sch.transform_layout("mm", "B_local", PANELS)
    again = Trace.from_json(sch.trace.to_json()).apply(low.func)
    assert print_func(again.func) == print_func(sch.func)
    assert again.trace.to_json() == sch.trace.to_json()
    C.check_same(graph, low, again.func)


def _tiled_mm(m: int, n: int, k: int, tile: int = 4):
    """mm split by ``tile`` rows, the accumulator tile and A and B in local buffers, tails
    guarded."""
    graph, low = C.mm(m, n, k)
    sch = Schedule(low.func)
    i, j, kk = sch.get_loops("mm")
    io, ii = sch.split(i, [None, tile])
    ko, ki = sch.split(kk, [None, 2])
    sch.reorder(io, ko, ki, ii, j)
    sch.decompose_reduction("mm", io)
    load, store = sch.cache_inplace("mm", "mm")
    sch.reverse_compute_at(store, io)
    sch.compute_at(load, io)
    sch.compute_at(sch.cache_read("mm", "A"), io)  # the update reads only local buffers
    sch.compute_at(sch.cache_read("mm", "B"), ko)
    return graph, low, simplify_indices(compact_buffers(sch.func))


def test_drop_dead_guards_pads_the_register_tile() -> None:
    graph, low, func = _tiled_mm(6, 5, 3)
    update = ("block mm(vi0: spatial[{}] = i0_0 * 4 + i0_1, vi1: spatial[5] = i1, "
              "vk0: reduce[3] = k0_0 * 2 + k0_1) where {}k0_0 * 2 + k0_1 < 3:")
    assert update.format(6, "i0_0 * 4 + i0_1 < 6 and ") in print_func(func)
    padded = drop_dead_guards(func)
    text = print_func(padded)
    # the update runs over the padded rows (that domain widened), keeping the K guard
    assert update.format(8, "") in text
    assert "mm_local[i0_1, i1] = mm_local[i0_1, i1] + A_local[i0_1, k0_0 * 2 + k0_1] * " \
        "B_local[k0_1, i1]" in text
    assert text.count("i0_0 * 4 + ax0_") == 3 * 2  # pack A, load, write-back keep guards
    check_lowered(graph, low, padded)


def test_drop_dead_guards_keeps_guards_of_parameter_accesses() -> None:
    graph, low = C.mm(6, 5, 3)
    sch = Schedule(low.func)
    i, _, _ = sch.get_loops("mm")
    sch.split(i, [None, 4])
    func = compact_buffers(sch.func)
    assert drop_dead_guards(func) == func  # mm writes the output directly


def test_version_tails_fast_and_slow_copies() -> None:
    graph, low, func = _tiled_mm(6, 5, 3)
    func = drop_dead_guards(func)
    versioned = version_tails(func, ["k0_0"])  # the K block: B packing and updates
    text = print_func(versioned)
    fast = text[text.index("if k0_0 * 2 < 2:"):text.index("else:")]
    assert "where" not in fast  # full K blocks: no guard at all
    assert "where k0_0 * 2 + ax0_4 < 3:" in text[text.index("else:"):]  # the tail as it was
    check_lowered(graph, low, versioned)
    exact = print_func(version_tails(func, ["k0_1"]))  # a guard of the K step alone:
    assert "if k0_0 * 2 + k0_1 < 3:" in exact and "else:" not in exact  # no slow copy
    assert version_tails(func, ["no_such_loop"]) == func


def test_version_tails_skips_empty_tails_then_pads_them() -> None:
    graph, low, func = _tiled_mm(6, 5, 3)
    versioned = version_tails(func, ["k0_0"])
    text = print_func(versioned)
    assert "else:\n            if k0_0 * 2 < 3:" in text  # a K block past the end: nothing
    lowered = drop_dead_guards(versioned)  # each copy's register tile padded on its own
    text = print_func(lowered)
    assert "reduce[3] = k0_0 * 2 + k0_1):" in text  # full K blocks: no guard left
    assert "reduce[3] = k0_0 * 2 + k0_1) where k0_0 * 2 + k0_1 < 3:" in text  # the tail
    check_lowered(graph, low, lowered)


def test_simplify_indices_divides_sums() -> None:
    graph, low = C.mm(8, 12, 5)
    sch = Schedule(low.func)
    i, j, k = sch.get_loops("mm")
    jo, ji = sch.split(j, [None, 4])
    sch.reorder(jo, i, k, ji)
    sch.cache_read("mm", "B")
    sch.transform_layout("mm", "B_local", PANELS)
    func = simplify_indices(compact_buffers(sch.func))
    text = print_func(func)
    assert "B_local[i1_0, k0, i1_1]" in text  # (i1_0 * 4 + i1_1) // 4 and % 4
    check_lowered(graph, low, func)



def test_cache_inplace_copies_around_the_block_only() -> None:
    """Another block under the same loop sees the buffer written back before it runs."""
    func = _two_blocks_in_one_nest()
    sch = Schedule(func)
    sch.cache_inplace("U", "acc")
    text = print_func(sch.func)
    assert text.index("block acc_local_1(") < text.index("block R(")
    x = torch.randn(4)
    acc0 = torch.randn(4)
    expected_acc = acc0 + x
    for f in (func, sch.func):
        bufs = {"x": x.numpy().copy(), "acc": acc0.numpy().copy(), "y": np.zeros(4, np.float32)}
        run(f, bufs)
        torch.testing.assert_close(torch.from_numpy(bufs["acc"]), expected_acc)
        torch.testing.assert_close(torch.from_numpy(bufs["y"]), expected_acc)


def _two_blocks_in_one_nest():  # noqa: ANN202
    """for i: block U: acc[i] = acc[i] + x[i]; block R: y[i] = acc[i]."""
    from kiln.ir.types import DType
    from kiln.tir.nodes import Block, Buffer, BufferStore, For, IterVar, PrimFunc, Var, seq

    x, acc, y = (Buffer(n, (4,), DType.F32) for n in ("x", "acc", "y"))
    i, vu, vr = Var("i"), Var("vu"), Var("vr")
    update = Block("U", (IterVar(vu, 4),), (i,), BufferStore(acc, (vu,), acc[vu] + x[vu]))
    read = Block("R", (IterVar(vr, 4),), (i,), BufferStore(y, (vr,), acc[vr]))
    return PrimFunc("two", (x,), (acc, y), For(i, 4, seq(update, read)))  # acc: in and out
