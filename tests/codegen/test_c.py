"""The C renderer: expected text for small programs, and compiled results vs the oracle."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch

from kiln.codegen.c import CRenderer, render_c
from kiln.codegen.kernel import CompiledKernel, KernelArgumentError, compile_kernel
from kiln.ir.types import DType
from kiln.options import Options
from kiln.tir import interp
from kiln.tir.nodes import (
    INDEX,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Cast,
    CmpOp,
    Compare,
    For,
    ForKind,
    IterKind,
    IterVar,
    PrimFunc,
    Select,
    Stmt,
    Unary,
    UnOp,
    Var,
    const,
    seq,
)
from kiln.tir.printer import print_func

F32 = DType.F32


def _add(rows: int, cols: int, outer: ForKind = ForKind.PARALLEL,
         inner: ForKind = ForKind.VECTORIZED) -> PrimFunc:
    a = Buffer("A", (rows, cols), F32)
    b = Buffer("B", (rows, cols), F32)
    c = Buffer("C", (rows, cols), F32)
    i, j, vi, vj = Var("i"), Var("j"), Var("vi"), Var("vj")
    block = Block("C", (IterVar(vi, rows), IterVar(vj, cols)), (i, j),
                  BufferStore(c, (vi, vj), a[vi, vj] + b[vi, vj]))
    return PrimFunc("add", (a, b), (c,), For(i, rows, For(j, cols, block, inner), outer))


def _body(source: str, name: str) -> str:
    return source[source.index(f"void {name}("):]


def test_add_renders_expected_c() -> None:
    assert _body(render_c(_add(4, 8)), "add") == """\
void add(const float* restrict A, const float* restrict B, float* restrict C) {
  #pragma omp parallel for schedule(static) num_threads(KILN_THREADS)
  for (int64_t i = 0; i < 4; ++i) {
    #pragma omp simd
    for (int64_t j = 0; j < 8; ++j) {
      {  /* block C */
        const int64_t vi = i;
        const int64_t vj = j;
        C[vi * 8 + vj] = A[vi * 8 + vj] + B[vi * 8 + vj];
      }
    }
  }
}
"""


def test_nested_parallel_loops_collapse_and_unroll_pragma() -> None:
    text = render_c(_add(4, 8, ForKind.PARALLEL, ForKind.PARALLEL))
    assert "#pragma omp parallel for schedule(static) collapse(2)" in text
    text = render_c(_add(4, 8, ForKind.SERIAL, ForKind.UNROLLED))
    assert "#pragma GCC unroll 8\n" in text and "omp parallel" not in _body(text, "add")


def _row_sum(rows: int, cols: int, kind: ForKind) -> PrimFunc:
    """out[i] = sum_j x[i, j] with the reduction loop marked ``kind``."""
    x = Buffer("x", (rows, cols), F32)
    out = Buffer("out", (rows,), F32)
    i, k, vi, vk = Var("i"), Var("k"), Var("vi"), Var("vk")
    block = Block("sum", (IterVar(vi, rows), IterVar(vk, cols, IterKind.REDUCE)), (i, k),
                  BufferStore(out, (vi,), out[vi] + x[vi, vk]),
                  init=BufferStore(out, (vi,), const(0.0, F32)))
    return PrimFunc("row_sum", (x,), (out,), For(i, rows, For(k, cols, block, kind)))


def test_racy_reduction_loop_renders_serial(options: Options) -> None:
    func = _row_sum(3, 5, ForKind.PARALLEL)
    text = render_c(func)
    assert "feeds a reduction: serial" in text and "omp parallel" not in _body(text, "row_sum")
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    torch.manual_seed(0)
    x = torch.randn(3, 5)
    out = torch.empty(3)
    kernel(x, out)
    torch.testing.assert_close(out, x.sum(1))
    # the interpreter runs PARALLEL loops backwards to expose exactly this schedule bug
    assert not torch.allclose(interp.run_torch(func, [x])[0], x.sum(1))


def test_names_are_made_valid_c() -> None:
    a = Buffer("x.1", (2,), F32)
    b = Buffer("int", (2,), F32)
    i, vi = Var("for"), Var("2v")
    block = Block("b", (IterVar(vi, 2),), (i,), BufferStore(b, (vi,), a[vi]))
    text = render_c(PrimFunc("my-kernel", (a,), (b,), For(i, 2, block)))
    assert "void my_kernel(const float* restrict x_1, float* restrict v_int)" in text
    assert "for (int64_t v_for = 0;" in text and "const int64_t v_2v = v_for;" in text


def _everything(n: int) -> PrimFunc:
    """One output per expression kind the renderer spells, elementwise over f32[n]."""
    x = Buffer("x", (n,), F32)
    y = Buffer("y", (n,), F32)
    outs = [Buffer(f"o{k}", (n,), F32) for k in range(12)]
    i, vi = Var("i"), Var("vi")
    a, b = x[vi], y[vi]
    zero = const(0.0, F32)
    values = [
        Binary(BinOp.MAX, a, b), Binary(BinOp.MIN, a, b), Unary(UnOp.EXP, a),
        Unary(UnOp.ERF, a), Unary(UnOp.TANH, a), Unary(UnOp.SIGMOID, a),
        Unary(UnOp.RSQRT, Unary(UnOp.ABS, a)), Binary(BinOp.FLOORMOD, a, b),
        Select(Compare(CmpOp.GT, a, zero), a, b * const(-math.inf, F32)),
        Cast(F32, Cast(DType.I32, Select(Compare(CmpOp.EQ, a, a), a, zero) * const(10.0, F32))),
        Binary(BinOp.FLOORDIV, a, b), Unary(UnOp.LOG, Unary(UnOp.ABS, b)) / a,
    ]
    block = Block("all", (IterVar(vi, n),), (i,),
                  _seq([BufferStore(o, (vi,), v) for o, v in zip(outs, values)]))
    return PrimFunc("everything", (x, y), tuple(outs), For(i, n, block, ForKind.VECTORIZED))


def _seq(stmts: list[BufferStore]) -> Stmt:
    return seq(*stmts)


def test_expressions_match_interpreter_and_torch(options: Options) -> None:
    n = 37  # not a multiple of the vector width
    func = _everything(n)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    torch.manual_seed(1)
    x = torch.randn(n) * 3
    y = torch.randn(n) * 3
    x[0], y[1], x[2] = float("nan"), float("nan"), 0.0
    outs = [torch.empty(n) for _ in func.outputs]
    kernel(x, y, *outs)
    want = interp.run_torch(func, [x, y])
    for got, ref in zip(outs, want):
        torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-6, equal_nan=True)
    # NaN in either operand of max/min gives NaN, as torch.maximum/minimum do
    torch.testing.assert_close(outs[0], torch.maximum(x, y), equal_nan=True)
    torch.testing.assert_close(outs[1], torch.minimum(x, y), equal_nan=True)
    torch.testing.assert_close(outs[7], torch.remainder(x, y), equal_nan=True)


def test_kernel_checks_its_arguments(options: Options) -> None:
    kernel = compile_kernel(_add(2, 3, ForKind.SERIAL, ForKind.SERIAL), options)
    assert isinstance(kernel, CompiledKernel)
    a, b, c = torch.ones(2, 3), torch.ones(2, 3), torch.empty(2, 3)
    kernel(a, b, c)
    assert torch.equal(c, torch.full((2, 3), 2.0))
    with pytest.raises(KernelArgumentError, match="shape"):
        kernel(a, b, torch.empty(3, 2))
    with pytest.raises(KernelArgumentError, match="dtype"):
        kernel(a, b.double(), c)
    with pytest.raises(KernelArgumentError, match="strides"):
        kernel(a, torch.ones(3, 2).t(), c)
    with pytest.raises(KernelArgumentError, match="takes 3"):
        kernel(a, b)


def test_a_loop_with_a_stop_ends_there_as_in_the_interpreter(options: Options) -> None:
    """``For.stop``, a bound computed from an outer loop (causal attention's keys): row i
    of C gets A + B in its first min(8, i + 2) columns and keeps the zeros written before;
    the C bound is the lesser of the stop and the extent, as the interpreter runs it."""
    rows, cols = 6, 8
    a, b, c = (Buffer(n, (rows, cols), F32) for n in "ABC")
    i, j, i2, j2 = Var("i"), Var("j"), Var("i2"), Var("j2")
    vi, vj, wi, wj = Var("vi"), Var("vj"), Var("wi"), Var("wj")
    zero = Block("Z", (IterVar(vi, rows), IterVar(vj, cols)), (i, j),
                 BufferStore(c, (vi, vj), const(0.0, F32)))
    add = Block("C", (IterVar(wi, rows), IterVar(wj, cols)), (i2, j2),
                BufferStore(c, (wi, wj), a[wi, wj] + b[wi, wj]))
    stop = i2 + const(2, INDEX)
    func = PrimFunc("stop", (a, b), (c,), seq(
        For(i, rows, For(j, cols, zero)),
        For(i2, rows, For(j2, cols, add, ForKind.VECTORIZED, stop), ForKind.PARALLEL)))
    assert "vectorized(8, stop=i2 + 2)" in print_func(func)
    assert " < 8 ? " in _body(render_c(func), "stop")
    x, y = torch.randn(rows, cols), torch.randn(rows, cols)
    want = torch.where(torch.arange(cols) < torch.arange(rows)[:, None] + 2, x + y, 0.0)
    out = torch.full((rows, cols), float("nan"))
    compile_kernel(func, options)(x, y, out)
    assert torch.equal(out, want)
    assert torch.equal(interp.run_torch(func, [x, y])[0], want)


def test_zero_extent_loop_renders_nothing(options: Options) -> None:
    func = _add(0, 8)
    assert "for (" not in _body(render_c(func), "add")
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    kernel(torch.empty(0, 8), torch.empty(0, 8), torch.empty(0, 8))


def test_renderer_hooks_can_be_overridden() -> None:
    class NoPragmas(CRenderer):
        def loop_pragma(self, loop, collapse):  # noqa: ANN001, ANN202
            return None
    assert "#pragma omp" not in _body(NoPragmas().render(_add(4, 8)), "add")


def _unary_kernel(op: UnOp, n: int) -> PrimFunc:
    x = Buffer("x", (n,), F32)
    y = Buffer("y", (n,), F32)
    i, vi = Var("i"), Var("vi")
    block = Block("f", (IterVar(vi, n),), (i,), BufferStore(y, (vi,), Unary(op, x[vi])))
    return PrimFunc(f"unary_{op.value}", (x,), (y,), For(i, n, block, ForKind.VECTORIZED))


@pytest.mark.parametrize("nan_bound", [False, True])
def test_a_clamp_by_constants_keeps_nan_and_signed_zeros(options: Options,
                                                         nan_bound: bool) -> None:
    """min(6, max(0, x)) vectorized, its bounds through the constant-bound helpers: NaN
    stays NaN, infinities and signed zeros as ATen's clamp gives them (a NaN bound: NaN)."""
    n = 1029
    x = Buffer("x", (n,), F32)
    y = Buffer("y", (n,), F32)
    i, vi = Var("i"), Var("vi")
    low = const(float("nan") if nan_bound else 0.0, F32)
    value = Binary(BinOp.MIN, const(6.0, F32), Binary(BinOp.MAX, low, x[vi]))
    block = Block("f", (IterVar(vi, n),), (i,), BufferStore(y, (vi,), value))
    func = PrimFunc(f"clamp_{int(nan_bound)}", (x,), (y,), For(i, n, block, ForKind.VECTORIZED))
    source = render_c(func)
    assert "kiln_minc_f32(6.0f, kiln_maxc_f32(" in source
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 6.0, 7.0,
                            -1.0, 5.5])
    data = torch.cat([torch.linspace(-8, 8, n - special.numel()), special])
    got = torch.empty_like(data)
    compile_kernel(func, options)(data, got)
    want = torch.full_like(data, float("nan")) if nan_bound else torch.clamp(data, 0.0, 6.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    if not nan_bound:  # (bit for bit: the signs of the zeros too)
        assert torch.equal(got.view(torch.int32)[~want.isnan()],
                           want.view(torch.int32)[~want.isnan()])


def test_vector_exp_is_accurate_and_handles_specials(options: Options) -> None:
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 88.72,
                            88.73, 89.0, -87.0, -103.0, -104.0, -200.0, 1e-30, -1e-8])
    x = torch.cat([torch.linspace(-87.3, 88.7, 100_003), special])
    func = _unary_kernel(UnOp.EXP, x.numel())
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    y = torch.empty_like(x)
    kernel(x, y)
    exact = torch.exp(x.double())
    ref = exact.float()
    normal = ref.abs() >= torch.finfo(torch.float32).tiny
    ulp = (torch.nextafter(ref, torch.tensor(math.inf)) - ref).double()
    err_ulp = ((y.double() - exact).abs() / ulp)[normal & torch.isfinite(ref)]
    assert err_ulp.max().item() <= 3.0  # libmvec's expf: 2.6 ulp; kiln_expf: 1.02 ulp
    torch.testing.assert_close(y[~normal], ref[~normal], atol=1e-37, rtol=0, equal_nan=True)
    assert torch.isnan(y[-14]) and y[-13] == math.inf and y[-12] == 0.0
    assert y[-8] == math.inf and y[-3] == 0.0  # overflow to inf, underflow to 0


def test_vector_erf_is_accurate_and_handles_specials(options: Options) -> None:
    special = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 4.0, -4.0, 1e-30])
    x = torch.cat([torch.linspace(-6.0, 6.0, 200_003), special])
    kernel = compile_kernel(_unary_kernel(UnOp.ERF, x.numel()), options)
    assert isinstance(kernel, CompiledKernel)
    y = torch.empty_like(x)
    kernel(x, y)
    err = (y.double() - torch.erf(x.double())).abs()
    assert err[:-8].max().item() < 4.5e-7  # kiln_erff's rational approximation
    assert torch.isnan(y[-8]) and y[-7] == 1.0 and y[-6] == -1.0
    assert y[-5] == 0.0 and math.copysign(1.0, y[-4].item()) == -1.0


def test_parallel_loops_schedule_as_their_kind_says_whatever_their_work() -> None:
    for cols in (8, 1 << 14):  # (the schedule decides, not the amount of work)
        static = _body(render_c(_add(4, cols)), "add")
        assert "#pragma omp parallel for schedule(static) num_threads" in static
        assert "dynamic" not in static
        dynamic = _body(render_c(_add(4, cols, ForKind.PARALLEL_DYNAMIC)), "add")
        assert "#pragma omp parallel for schedule(dynamic, 1) num_threads" in dynamic
        assert "static" not in dynamic


def test_dynamic_parallel_loops_collapse_and_serialize_as_static_ones() -> None:
    nested = _body(render_c(_add(4, 8, ForKind.PARALLEL_DYNAMIC, ForKind.PARALLEL_DYNAMIC)),
                   "add")
    assert "schedule(dynamic, 1) collapse(2)" in nested
    assert nested.count("#pragma omp parallel") == 1
    racy = _body(render_c(_row_sum(3, 5, ForKind.PARALLEL_DYNAMIC)), "row_sum")
    assert "#pragma omp parallel" not in racy and "feeds a reduction: serial" in racy


def test_f32_exp_is_plain_arithmetic_with_or_without_libmvec(options: Options,
                                                              tmp_path) -> None:  # noqa: ANN001
    """f32 exp is kiln_expf in every build (libmvec's expf goes scalar below -87.3, a masked
    softmax's fill): within 1.5 ulp on normal results, 0, inf and NaN where exp gives them."""
    import dataclasses

    from kiln.codegen import build as build_mod
    chain = build_mod.toolchain(options)
    assert not isinstance(chain, build_mod.CompilerUnavailable)
    x = torch.cat([torch.linspace(-87.3, 88.7, 20_011),
                   torch.tensor([math.nan, -math.inf, math.inf, 89.0, -110.0, 88.7228, 88.73,
                                 -3.4e38, -1e4, -104.5, 1e30])])
    func = _unary_kernel(UnOp.EXP, x.numel())
    rendered = render_c(func)
    assert "kiln_expf(" in rendered.split("void unary_exp")[1]
    opts = dataclasses.replace(options, kernel_cache_dir=str(tmp_path))
    for name, source in (("exp_mvec", rendered),
                         ("exp_plain", rendered.replace("#ifdef KILN_LIBMVEC",
                                                        "#ifdef KILN_NEVER_DEFINED"))):
        lib = build_mod.build(source, name, opts)
        assert isinstance(lib, build_mod.BuiltLibrary)
        fn = lib.function("unary_exp")
        y = torch.empty_like(x)
        fn(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()))
        ref = torch.exp(x.double())
        ulp = (torch.nextafter(ref.float(), torch.tensor(math.inf)) - ref.float()).double()
        tiny = torch.finfo(torch.float32).tiny
        finite = torch.isfinite(ref.float()) & (ref.float().abs() >= tiny)
        assert ((y.double() - ref).abs() / ulp)[finite].max().item() <= 1.5
        assert torch.isnan(y[-11]) and y[-10] == 0.0 and y[-9] == math.inf and y[-8] == math.inf
        assert y[-7] == 0.0 and torch.isfinite(y[-6]) and y[-5] == math.inf
        assert (y[-4:-1] == 0.0).all() and y[-1] == math.inf


def _select_kernel(shift: int) -> PrimFunc:
    """y[i] = m[i] ? x[i + shift] * 2 : -inf, guarded where i + shift leaves x when shift."""
    n = 40
    x = Buffer("x", (n,), F32)
    m = Buffer("m", (n,), DType.U8)
    y = Buffer("y", (n,), F32)
    i, vi = Var("i"), Var("vi")
    cond = Compare(CmpOp.NE, m[vi], const(0, DType.U8))
    if shift:
        cond = Binary(BinOp.AND, cond, Compare(CmpOp.LT, vi + shift, const(n, DType.I64)))
    value = Select(cond, x[vi + shift] * 2.0, const(-math.inf, F32))
    block = Block("f", (IterVar(vi, n),), (i,), BufferStore(y, (vi,), value))
    return PrimFunc(f"select{shift}", (x, m), (y,), For(i, n, block, ForKind.VECTORIZED))


@pytest.mark.parametrize("shift", [0, 3])
def test_a_select_reads_its_in_bounds_loads_first(options: Options, shift: int) -> None:
    func = _select_kernel(shift)
    source = render_c(func)
    assert ("float hoisted0 = x[" in source) == (shift == 0)  # x[i + 3] may leave x: lazy
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    x = torch.randn(40)
    m = torch.rand(40) > 0.5
    y = torch.empty(40)
    kernel(x, m.to(torch.uint8), y)
    want = interp.run_torch(func, [x, m.to(torch.uint8)])[0]
    assert torch.equal(y, want)


def _through_temp(rows: int, cols: int) -> PrimFunc:
    """C = 2 * T where T = A + 1, T a heap temporary of rows x cols floats."""
    from kiln.tir.nodes import Allocate

    a, c = Buffer("A", (rows, cols), F32), Buffer("C", (rows, cols), F32)
    t = Buffer("T", (rows, cols), F32)

    def nest(name: str, out: Buffer, value) -> Stmt:  # noqa: ANN001
        i, j, vi, vj = Var(f"{name}_i"), Var(f"{name}_j"), Var(f"v{name}_i"), Var(f"v{name}_j")
        block = Block(name, (IterVar(vi, rows), IterVar(vj, cols)), (i, j),
                      BufferStore(out, (vi, vj), value(vi, vj)))
        return For(i, rows, For(j, cols, block, ForKind.VECTORIZED), ForKind.PARALLEL)

    body = seq(nest("fill", t, lambda vi, vj: a[vi, vj] + const(1.0, F32)),
               nest("out", c, lambda vi, vj: t[vi, vj] * const(2.0, F32)))
    return PrimFunc(f"through_temp_{rows}x{cols}", (a,), (c,), Allocate(t, body))


@pytest.mark.parametrize("rows,kept", [(8, False), (128, True)], ids=["small", "workspace"])
def test_a_large_heap_temporary_is_a_kept_per_thread_workspace(options: Options, rows: int,
                                                               kept: bool) -> None:
    """From 64 KiB up a heap temporary is allocated once per calling thread and kept (no
    fresh mapping to fault in on each call); smaller ones are allocated and freed per call.
    Either way, calls from several threads at once each get their own."""
    from concurrent.futures import ThreadPoolExecutor

    func = _through_temp(rows, 256)
    source = render_c(func)
    assert ("static __thread float* T_ws" in source) is kept
    assert ("free(T)" in source) is not kept
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)

    def run(seed: int) -> bool:
        a = torch.randn(rows, 256, generator=torch.Generator().manual_seed(seed))
        ok = True
        for _ in range(20):
            c = torch.empty_like(a)
            kernel(a, c)
            ok &= torch.equal(c, (a + 1) * 2)
        return ok

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, range(8)))


@pytest.mark.parametrize("op", [UnOp.EXP, UnOp.ERF])
def test_exp_and_erf_loops_are_vectorized_with_the_default_flags(options: Options, tmp_path,
                                                                 op: UnOp) -> None:  # noqa: ANN001
    """gcc's own report on kiln_expf's and kiln_erff's loops: vectorized. Without
    -fno-trapping-math, gcc 12 for AVX2 made their clamps branches and left the loops scalar
    ("control flow in loop"): a softmax ran 4x, a bias + GELU 7x slower than now."""
    import subprocess

    from kiln.codegen import build as build_mod
    chain = build_mod.toolchain(options)
    assert not isinstance(chain, build_mod.CompilerUnavailable)
    version = subprocess.run([chain.compiler, "--version"], capture_output=True, text=True)
    if "gcc" not in version.stdout.lower() and "free software" not in version.stdout.lower():
        pytest.skip("the vectorization report is gcc's")
    source = tmp_path / "k.c"
    source.write_text(render_c(_unary_kernel(op, 4096)))
    report = subprocess.run([chain.compiler, *Options().c_flags, "-fopt-info-vec-all", "-c",
                             "-o", str(tmp_path / "k.o"), str(source)],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    lines = [line for line in report.stderr.splitlines() if "k.c:" in line]
    assert any("loop vectorized" in line for line in lines), "\n".join(lines)
    assert not any("control flow in loop" in line for line in lines), "\n".join(lines)
