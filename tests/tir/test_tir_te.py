"""`kiln.tir.te`'s expression helpers: the softmax's exp, through the reference interpreter
and the C compiler."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.ir.types import DType
from kiln.options import Options
from kiln.tir.interp import run_torch
from kiln.tir.nodes import EXP_FLUSH_BELOW, PrimFunc, UnOp
from kiln.tir.te import Builder, softmax_exp, unary

# shifted scores as a softmax sees them (at most 0), NaN, and the edges of the flush
SHIFTED = [0.0, -1.0, -30.0, -86.9, EXP_FLUSH_BELOW, -87.1, -87.4, -95.0, -103.0, -104.5,
           -1e30, -math.inf, math.nan]
FLOAT32_TINY = torch.finfo(torch.float32).tiny


def _exp_func(dtype: DType) -> PrimFunc:
    b = Builder()
    x, out = b.buffer("x", (len(SHIFTED),), dtype), b.buffer("out", (len(SHIFTED),), dtype)
    b.compute("e", out, lambda v: softmax_exp(x[v[0]]))
    return PrimFunc("softmax_exp", (x,), (out,), b.body())


def _expected(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x < EXP_FLUSH_BELOW, torch.zeros_like(x), x.exp())


def test_the_softmax_exp_flushes_what_would_be_subnormal_and_keeps_nan() -> None:
    x = torch.tensor(SHIFTED, dtype=torch.float32)
    (got,) = run_torch(_exp_func(DType.F32), [x])
    torch.testing.assert_close(got, _expected(x), equal_nan=True, rtol=2e-7, atol=0)
    assert got[-1].isnan() and got[-2] == 0.0  # NaN stays NaN; -inf (masked) gives 0
    kept = got[(got != 0) & ~got.isnan()]
    assert (kept >= FLOAT32_TINY).all()  # every term left is a normal float
    assert (x.exp() < FLOAT32_TINY).any()  # (what exp itself gives there: subnormals)


def test_the_compiled_softmax_exp_agrees_and_computes_no_subnormal(options: Options) -> None:
    kernel = compile_kernel(_exp_func(DType.F32), options)
    if not isinstance(kernel, CompiledKernel):
        pytest.skip("no C compiler")
    x = torch.tensor(SHIFTED, dtype=torch.float32)
    out = torch.full_like(x, 7.0)
    kernel(x, out)
    torch.testing.assert_close(out, _expected(x), equal_nan=True, rtol=2e-6, atol=0)
    assert not ((out != 0) & (out.abs() < FLOAT32_TINY)).any()


def test_a_double_softmax_exp_is_exp() -> None:
    x = torch.tensor(SHIFTED, dtype=torch.float64)
    (got,) = run_torch(_exp_func(DType.F64), [x])
    torch.testing.assert_close(got, x.exp(), equal_nan=True)
    assert 0 < got[7] < 1e-40  # (exp(-95) in double: kept)


def test_the_compiled_flushed_exp_is_exp_bit_for_bit_from_the_threshold_up(options: Options
                                                                          ) -> None:
    """Over a million random float32 bit patterns (every sign, exponent, NaN, inf): the
    flushed exp equals kiln's exp exactly at and above `EXP_FLUSH_BELOW` and for NaN, and is
    +0.0 below it."""
    n = 1 << 20

    def func(op: UnOp) -> PrimFunc:
        b = Builder()
        x, out = b.buffer("x", (n,), DType.F32), b.buffer("out", (n,), DType.F32)
        b.compute("e", out, lambda v: unary(op, x[v[0]]))
        return PrimFunc(f"exp_{op.value}", (x,), (out,), b.body())

    flushed, plain = (compile_kernel(func(op), options) for op in (UnOp.EXP_FLUSHED, UnOp.EXP))
    if not isinstance(flushed, CompiledKernel) or not isinstance(plain, CompiledKernel):
        pytest.skip("no C compiler")
    bits = torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64,
                         generator=torch.Generator().manual_seed(5)).to(torch.int32)
    x = bits.view(torch.float32)
    got, want = torch.empty_like(x), torch.empty_like(x)
    flushed(x, got)
    plain(x, want)
    kept = ~(x < EXP_FLUSH_BELOW)  # (NaN included)
    assert torch.equal(got[kept].view(torch.int32), want[kept].view(torch.int32))
    assert torch.equal(got[~kept].view(torch.int32), torch.zeros_like(got[~kept]).view(torch.int32))
    assert (x < EXP_FLUSH_BELOW).sum() > n // 8 and x.isnan().any()


def test_a_flushed_exp_of_another_type_is_refused_by_the_c_renderer() -> None:
    """softmax_exp makes it for float32 only; a double one is not silently rendered."""
    from kiln.codegen.c import UnsupportedForC, render_c

    b = Builder()
    x, out = b.buffer("x", (4,), DType.F64), b.buffer("out", (4,), DType.F64)
    b.compute("e", out, lambda v: unary(UnOp.EXP_FLUSHED, x[v[0]]))
    with pytest.raises(UnsupportedForC, match="EXP_FLUSHED on f64"):
        render_c(PrimFunc("flushed_f64", (x,), (out,), b.body()))
