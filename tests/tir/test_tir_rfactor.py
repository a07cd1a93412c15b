"""rfactor: expected IR, semantics in the reference interpreter (NaN and infinities
included), replay from a trace, and every refusal."""

from __future__ import annotations

import math

import pytest
import tir_cases as C
import torch

from kiln.ir.types import DType
from kiln.tir.interp import run_torch
from kiln.tir.nodes import BinOp, PrimFunc, const
from kiln.tir.printer import print_func
from kiln.tir.schedule import Schedule, ScheduleError
from kiln.tir.te import Builder
from kiln.tir.trace import Trace

F32 = DType.F32


def _row_reduce(op: BinOp, m: int, n: int, init: float | None = None) -> PrimFunc:
    """out[i] = op-fold of x[i, :] (init: the identity unless given)."""
    b = Builder()
    x = b.buffer("x", (m, n), F32)
    out = b.buffer("out", (m,), F32)
    finit = None if init is None else (lambda v: const(init, F32))
    b.reduce("red", out, (n,), op, lambda v, r: x[v[0], r[0]], finit)
    return PrimFunc("red", (x,), (out,), b.body())


def _factored(func: PrimFunc, lanes: int = 16) -> Schedule:
    sch = Schedule(func)
    _, k = sch.get_loops("red")
    _, ki = sch.split(k, [None, lanes])
    sch.rfactor("red", ki)
    return sch


TORCH = {BinOp.ADD: lambda x: x.sum(1), BinOp.MUL: lambda x: x.prod(1),
         BinOp.MAX: lambda x: x.amax(1), BinOp.MIN: lambda x: x.amin(1)}


def test_rfactor_text() -> None:
    sch = _factored(_row_reduce(BinOp.MAX, 4, 37))
    assert print_func(sch.func) == """\
def red(x: f32[4, 37], out: f32[4]):
  alloc out_rf: f32[4, 16] local:
    for i0 in range(4):
      for k0_0 in range(3):
        for k0_1 in range(16):
          block red_rf(vi0: spatial[4] = i0, vk0_0: reduce[3] = k0_0, vk0_1: spatial[16] = k0_1):
            init:
              out_rf[vi0, vk0_1] = -inf
            out_rf[vi0, vk0_1] = max(out_rf[vi0, vk0_1], select(vk0_0 * 16 + vk0_1 < 37, \
x[vi0, vk0_0 * 16 + vk0_1], -inf))
    for ax0 in range(4):
      for k0_1_wb in range(16):
        block red(vi0_wb: spatial[4] = ax0, vk0_1_wb: reduce[16] = k0_1_wb):
          init:
            out[vi0_wb] = -inf
          out[vi0_wb] = max(out[vi0_wb], out_rf[vi0_wb, vk0_1_wb])
"""


def test_rfactor_on_the_outer_part_of_a_split() -> None:
    """Factoring the outer loop (threads-style): partials per chunk, not per lane."""
    sch = Schedule(_row_reduce(BinOp.ADD, 3, 40))
    _, k = sch.get_loops("red")
    ko, _ = sch.split(k, [4, None])
    sch.rfactor("red", ko)
    assert "alloc out_rf: f32[3, 4] local:" in print_func(sch.func)
    x = torch.randn(3, 40)
    (got,) = run_torch(sch.func, [x])
    torch.testing.assert_close(got, x.sum(1))


@pytest.mark.parametrize("op", list(TORCH))
@pytest.mark.parametrize("n", [1, 5, 16, 37, 64])
def test_rfactor_semantics(op: BinOp, n: int) -> None:
    sch = _factored(_row_reduce(op, 6, n))
    gen = torch.Generator().manual_seed(n)
    x = torch.rand(6, n, generator=gen) + 0.5 if op is BinOp.MUL else torch.randn(6, n,
                                                                                 generator=gen)
    # special rows: NaN somewhere, +-inf, all -inf
    x[1, n // 2] = math.nan
    x[2, n - 1] = math.inf
    x[3, 0] = -math.inf
    x[4, :] = -math.inf
    (got,) = run_torch(sch.func, [x])
    torch.testing.assert_close(got, TORCH[op](x), equal_nan=True, rtol=1e-5, atol=1e-5)


def test_rfactor_zero_length_rows_and_the_lowered_softmax() -> None:
    graph, low = C.row_sum(3, 0)
    (got,) = run_torch(low.func, [torch.randn(3, 0)])  # nothing to factor: no reduce loop
    assert got.tolist() == [0.0, 0.0, 0.0]
    graph, low = C.row_sum(5, 21)
    sch = Schedule(low.func)
    name = sch.blocks()[0]
    _, k = sch.get_loops(name)
    _, ki = sch.split(k, [None, 8])
    sch.rfactor(name, ki)
    C.check_same(graph, low, sch.func)


def test_rfactor_replays_from_json() -> None:
    func = _row_reduce(BinOp.ADD, 4, 37)
    sch = _factored(func)
    assert sch.trace.as_python().endswith("b_red_rf = sch.rfactor(b_red, k0_1)\n")
    again = Trace.from_json(sch.trace.to_json()).apply(func)
    assert again.func == sch.func


def test_rfactor_refusals() -> None:
    # not a reduction
    graph, low = C.add_relu()
    with pytest.raises(ScheduleError, match="not a reduction"):
        Schedule(low.func).rfactor("add", "i1")
    func = _row_reduce(BinOp.ADD, 4, 8)
    # the loop binds a spatial iter var
    with pytest.raises(ScheduleError, match="feeds a spatial iter var"):
        Schedule(func).rfactor("red", "i0")
    # the init is not the identity
    with pytest.raises(ScheduleError, match="not the identity"):
        Schedule(_row_reduce(BinOp.ADD, 4, 8, init=1.0)).rfactor("red", "k0")
    with pytest.raises(ScheduleError, match="not the identity"):
        Schedule(_row_reduce(BinOp.MAX, 4, 8, init=0.0)).rfactor("red", "k0")
    # an update that is not C = C op e
    b = Builder()
    x = b.buffer("x", (4, 8), F32)
    out = b.buffer("out", (4,), F32)
    b.reduce("red", out, (8,), BinOp.SUB, lambda v, r: x[v[0], r[0]],
             lambda v: const(0.0, F32))
    with pytest.raises(ScheduleError, match="not C = C op e"):
        Schedule(PrimFunc("f", (x,), (out,), b.body())).rfactor("red", "k0")
    with pytest.raises(ScheduleError, match="no loop named"):
        Schedule(func).rfactor("red", "nope")


def _copy_then_sum() -> PrimFunc:
    b = Builder()
    x = b.buffer("x", (4, 8), F32)
    y = b.buffer("y", (4, 8), F32)
    out = b.buffer("out", (4,), F32)
    b.compute("copy", y, lambda v: x[v[0], v[1]] * 2.0)
    b.reduce("red", out, (8,), BinOp.ADD, lambda v, r: y[v[0], r[0]])
    return PrimFunc("f", (x,), (y, out), b.body())


def test_rfactor_inside_a_loop_that_holds_other_statements() -> None:
    """After compute_at the row loop holds the producer too: the write-back goes right after
    the factored nest, inside the row loop, over that row only."""
    sch = Schedule(_copy_then_sum())
    i0, _ = sch.get_loops("red")
    sch.compute_at("copy", i0)
    _, k = sch.get_loops("red")
    _, ki = sch.split(k, [None, 4])
    sch.rfactor("red", ki)
    text = print_func(sch.func)
    assert "for k0_1_wb in range(4):" in text and "block red(vi0_1_wb: spatial[4] = i0_1," in text
    x = torch.randn(4, 8)
    y, out = run_torch(sch.func, [x])
    torch.testing.assert_close(out, (x * 2.0).sum(1))


def test_rfactor_refuses_a_reduction_loop_with_other_statements() -> None:
    sch = Schedule(_copy_then_sum())
    with pytest.raises(ScheduleError, match="not under that loop"):
        sch.rfactor("red", sch.get_loops("copy")[1])
    _, k = sch.get_loops("red")
    sch.compute_at("copy", k)
    with pytest.raises(ScheduleError, match="also holds other statements"):
        sch.rfactor("red", k)
