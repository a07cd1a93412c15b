"""The refusals of the loop primitives, handles, tile, replay and region analysis that the
per-primitive tests do not reach."""

from __future__ import annotations

import dataclasses

import pytest
import tir_cases as C

from kiln.ir.types import DType
from kiln.tir.nodes import Block, Buffer, BufferStore, Load, PrimFunc, Var
from kiln.tir.primitives.common import find_block
from kiln.tir.schedule import Schedule, ScheduleError
from kiln.tir.visit import replace_node, substitute_stmt


def _relu_reads(func: PrimFunc, *indices) -> PrimFunc:
    """add_relu whose relu reads ``add`` at each of ``indices`` (functions of the relu
    block's iter vars), summed: shapes of access no lowering makes."""
    relu = find_block(func, "relu").stmt
    assert isinstance(relu, Block) and isinstance(relu.body, BufferStore)
    add = find_block(func, "add").stmt.body.buffer  # type: ignore[union-attr]
    v0, v1 = (iv.var for iv in relu.iter_vars)
    loads = [Load(add, idx(v0, v1)) for idx in indices]
    value = loads[0]
    for ld in loads[1:]:
        value = value + ld
    body = dataclasses.replace(relu.body, value=value)
    return func.with_body(replace_node(func.body, relu, dataclasses.replace(relu, body=body)))


def test_split_refuses_non_positive_factors() -> None:
    with pytest.raises(ScheduleError, match="factors must be positive ints"):
        Schedule(C.add_relu()[1].func).split("i1", [0, None])


def test_fuse_refusals() -> None:
    sch = Schedule(C.add_relu()[1].func)
    with pytest.raises(ScheduleError, match="give at least two loops"):
        sch.fuse("i0")
    sch.parallel("i0")
    with pytest.raises(ScheduleError, match="only serial loops can be fused"):
        sch.fuse("i0", "i1")


def test_reorder_refuses_loops_of_different_nests() -> None:
    with pytest.raises(ScheduleError, match="loop i0_1 is not nested with i0"):
        Schedule(C.add_relu()[1].func).reorder("i0", "i0_1")


def test_fission_and_fusion_refuse_loops_without_siblings() -> None:
    sch = Schedule(C.add_relu()[1].func)
    with pytest.raises(ScheduleError, match="needs more than 1 statements"):
        sch.fission("i1", 1)  # its body is one block
    with pytest.raises(ScheduleError, match="loop i1 has no sibling statements"):
        sch.fusion("i1", "i1_1")


def test_handles_and_tile_refusals() -> None:
    sch = Schedule(C.add_relu()[1].func)
    with pytest.raises(ScheduleError, match="no block named 'nope' in add_relu"):
        sch.get_block("nope")
    with pytest.raises(ScheduleError, match="2 loops but 1 tile sizes"):
        sch.tile(["i0", "i1"], [2])


def test_replay_refuses_a_program_with_other_names() -> None:
    sch = Schedule(C.row_sum(5, 7)[1].func)
    sch.split("k0", [None, 4])  # k0_0, k0_1
    with pytest.raises(ScheduleError, match="no loop named 'k0'"):
        sch.trace.apply(C.add_relu()[1].func)
    # the same loops, but the name k0_1 is taken, so the split names its loops otherwise
    taken = C.row_sum(5, 7)[1].func
    outer = find_block(taken, "sum").loops[0]
    renamed = dataclasses.replace(outer, var=Var("k0_1"),
                                  body=substitute_stmt(outer.body, {outer.var: Var("k0_1")}))
    taken = taken.with_body(replace_node(taken.body, outer, renamed))
    with pytest.raises(ScheduleError, match="not the program the trace was made on"):
        sch.trace.apply(taken)


def test_compute_at_regions_that_are_not_a_box_start() -> None:
    func = C.add_relu(3, 4)[1].func
    flipped = _relu_reads(func, lambda a, b: (a, b), lambda a, b: (a, 3 - b))
    with pytest.raises(ScheduleError, match="along dimension 1 do not start at the same place"):
        Schedule(flipped).compute_at("add", "i0_1")
    reversed_only = _relu_reads(func, lambda a, b: (a, 3 - b))
    with pytest.raises(ScheduleError, match="along dimension 1 are not increasing"):
        Schedule(reversed_only).compute_at("add", "i0_1")


def test_compute_at_refuses_an_index_it_cannot_bound() -> None:
    func = C.add_relu(3, 4)[1].func
    table = Buffer("table", (4,), DType.I64)
    gathered = _relu_reads(func, lambda a, b: (a, Load(table, (b,))))
    with pytest.raises(ScheduleError, match="cannot bound index"):
        Schedule(gathered).compute_at("add", "i0_1")
