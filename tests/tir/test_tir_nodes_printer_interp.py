"""Nodes type-check their operands; the printer's text; the interpreter's strictness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln.ir.types import DType
from kiln.tir.interp import InterpError, run, run_torch
from kiln.tir.nodes import (
    Block,
    Buffer,
    BufferStore,
    CmpOp,
    Compare,
    Const,
    For,
    ForKind,
    IterVar,
    PrimFunc,
    Select,
    Var,
    const,
)
from kiln.tir.printer import print_expr, print_func

F32 = DType.F32


def _add(n: int = 4, kind: ForKind = ForKind.SERIAL, offset: int = 0) -> PrimFunc:
    a, b, c = (Buffer(x, (n,), F32) for x in "ABC")
    i, vi = Var("i"), Var("vi")
    at = vi + offset if offset else vi
    blk = Block("C", (IterVar(vi, n),), (i,), BufferStore(c, (vi,), a[at] + b[vi]))
    return PrimFunc("add", (a, b), (c,), For(i, n, blk, kind))


def test_nodes_check_types() -> None:
    with pytest.raises(TypeError, match="ADD of f32 and i64"):
        Const(1.0, F32) + Var("i")
    with pytest.raises(TypeError, match="does not have dtype"):
        Const(1, F32)
    with pytest.raises(ValueError, match="1 indices, rank 2"):
        Buffer("A", (2, 3), F32)[Var("i")]
    with pytest.raises(TypeError, match="store of i64"):
        BufferStore(Buffer("A", (2,), F32), (const(0, DType.I64),), const(1, DType.I64))
    assert _add() == _add() and hash(_add()) == hash(_add())


def test_printer() -> None:
    assert print_func(_add(4, ForKind.PARALLEL)) == """\
def add(A: f32[4], B: f32[4], C: f32[4]):
  for i in parallel(4):
    block C(vi: spatial[4] = i):
      C[vi] = A[vi] + B[vi]
"""
    i = Var("i")
    assert print_expr((i + 1) * 2 - (i - (i - 1))) == "(i + 1) * 2 - (i - (i - 1))"
    assert print_expr(Select(Compare(CmpOp.LT, i, const(3, DType.I64)), i, -i)) == \
        "select(i < 3, i, -i)"


def test_interp_runs_and_checks_bounds() -> None:
    a, b = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(run_torch(_add(), [a, b])[0], a + b)
    with pytest.raises(InterpError, match="out of range for A"):
        run_torch(_add(offset=1), [a, b])


def test_interp_parallel_loops_run_backwards() -> None:
    # c[i] = c[i-1] + 1 carried across iterations: fine serially, wrong if run in parallel
    c = Buffer("c", (4,), F32)
    i, vi = Var("i"), Var("vi")
    prev = Select(Compare(CmpOp.GT, vi, const(0, DType.I64)), c[vi - 1], const(0.0, F32))
    blk = Block("c", (IterVar(vi, 4),), (i,), BufferStore(c, (vi,), prev + 1.0))
    for kind, expect_ok in ((ForKind.SERIAL, True), (ForKind.PARALLEL, False)):
        arr = np.zeros(4, np.float32)
        run(PrimFunc("scan", (), (c,), For(i, 4, blk, kind)), {"c": arr})
        assert (arr.tolist() == [1, 2, 3, 4]) is expect_ok
