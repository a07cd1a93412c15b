"""Traces print as Python, round-trip through JSON and replay onto a fresh program."""

from __future__ import annotations

import pytest
import tir_cases as C

from kiln.tir.printer import print_func
from kiln.tir.schedule import Schedule, ScheduleError
from kiln.tir.trace import Trace


def _schedule(func):
    sch = Schedule(func)
    b = sch.get_block("mm")
    i, j, k = sch.get_loops(b)
    io, ii = sch.split(i, [None, 4])
    sch.reorder(io, j, k, ii)
    sch.parallel(io)
    sch.unroll(ii)
    return sch


def test_as_python() -> None:
    _, low = C.mm()
    assert _schedule(low.func).trace.as_python() == """\
b_mm = sch.get_block('mm')
i0, i1, k0 = sch.get_loops(b_mm)
i0_0, i0_1 = sch.split(i0, factors=[None, 4])
sch.reorder(i0_0, i1, k0, i0_1)
sch.parallel(i0_0)
sch.unroll(i0_1)
"""


def test_json_roundtrip_and_replay() -> None:
    graph, low = C.mm()
    sch = _schedule(low.func)
    trace = Trace.from_json(sch.trace.to_json())
    assert trace.instructions == sch.trace.instructions
    replayed = trace.apply(C.mm()[1].func)
    assert replayed.func == sch.func
    C.check_same(graph, low, replayed.func)


def test_replay_on_a_different_program_fails_loudly() -> None:
    _, low = C.mm()
    trace = _schedule(low.func).trace
    with pytest.raises(ScheduleError):
        trace.apply(C.add_relu()[1].func)


def test_a_dynamic_parallel_loop_prints_round_trips_and_replays() -> None:
    graph, low = C.mm()
    sch = Schedule(low.func)
    i, _, _ = sch.get_loops(sch.get_block("mm"))
    sch.parallel(i, dynamic=True)
    assert sch.trace.as_python().endswith("sch.parallel(i0, dynamic=True)\n")
    assert "parallel_dynamic" in print_func(sch.func)
    trace = Trace.from_json(sch.trace.to_json())
    replayed = trace.apply(C.mm()[1].func)
    assert replayed.func == sch.func and replayed.trace.instructions == trace.instructions
    C.check_same(graph, low, replayed.func)
    static = Schedule(C.mm()[1].func)
    static.parallel(static.get_loops(static.get_block("mm"))[0])
    assert static.func != sch.func  # (the kind is part of the program)
