"""The GEMM derived by schedule primitives: against torch, its trace replays, its C is clean."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kiln.codegen.c import render_c
from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.kernels.gemm_schedule import (
    GemmConfig,
    gemm_func,
    gemm_plan,
    matmul_func,
    pack_b,
    schedule_gemm,
)
from kiln.kernels.plan import VersionTails
from kiln.options import Options
from kiln.tir import interp
from kiln.tir.printer import print_func
from kiln.tir.schedule import Schedule
from kiln.tir.trace import Trace

TINY = GemmConfig(mr=4, nr=8, kc=5, mc=8, nc=16)  # several blocks and tails in every loop


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (0, 3, 4), (3, 0, 4), (3, 4, 0), (13, 37, 29),
                                   (16, 32, 10), (33, 17, 11)])
@pytest.mark.parametrize("b_transposed", [False, True], ids=["B", "Bt"])
@pytest.mark.parametrize("bias", [False, True], ids=["mm", "addmm"])
def test_gemm_matches_torch_and_interpreter(options: Options, m: int, n: int, k: int,
                                            b_transposed: bool, bias: bool) -> None:
    func = gemm_func(m, n, k, TINY, b_transposed, bias)
    torch.manual_seed(m * 1000 + n * 10 + k)
    a = torch.randn(m, k)
    b = torch.randn(n, k) if b_transposed else torch.randn(k, n)
    bias_t = torch.randn(n)
    weight = b if b_transposed else b.t()
    expected = F.linear(a, weight, bias_t if bias else None)
    inputs = [a, b, bias_t] if bias else [a, b]
    torch.testing.assert_close(interp.run_torch(func, inputs)[0], expected,
                               rtol=1e-5, atol=1e-5)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    c = torch.full((m, n), float("nan"))
    kernel(*inputs, c)
    torch.testing.assert_close(c, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_transposed", [False, True])
def test_trace_replays_onto_the_lowered_matmul(b_transposed: bool) -> None:
    plan = gemm_plan(30, 50, 23, TINY, b_transposed, bias=True)
    func, trace = plan.build(), plan.trace
    assert VersionTails(("k0_0", "ax0_3_0", "i1_1", "i0_1", "k0_1")) in plan.post
    for text in (trace.to_json(), Trace.from_json(trace.to_json()).to_json()):
        replayed = dataclasses.replace(plan, program=matmul_func(30, 50, 23, b_transposed, True),
                                       trace=Trace.from_json(text), scheduled=None)
        assert print_func(replayed.build()) == print_func(func)
    # the Python form runs too
    sch = Schedule(matmul_func(30, 50, 23, b_transposed, True))
    exec(trace.as_python(), {"sch": sch})  # noqa: S102 - the trace's own text
    lowered = sch.func
    for step in plan.post:
        lowered = step.apply(lowered)
    assert print_func(lowered) == print_func(func)


def test_trace_is_the_blis_schedule() -> None:
    sch, tails = schedule_gemm(matmul_func(64, 64, 64), GemmConfig(14, 32, 16, 28, 32))
    text = sch.trace.as_python()
    assert tails == ["k0_0", "ax0_3_0", "i1_1", "i0_1", "k0_1"]
    for line in ("i0_0, i0_1, i0_2 = sch.split(i0, factors=[None, 2, 14])",
                 "sch.reorder(i1_0, k0_0, i0_0, i1_1, i0_1, k0_1, i0_2, i1_2)",
                 "b_C_init = sch.decompose_reduction(b_C, i1_0)",
                 "b_C_local, b_C_local_1 = sch.cache_inplace(b_C, buffer='C', scope='local')",
                 "sch.compute_at(b_A_local, i0_0)",
                 "sch.transform_layout(b_C, buffer='B_global', "
                 "index_map=[[1, '//', 32], [0, '', 0], [1, '%', 32]])",
                 "sch.parallel(i0_0)", "sch.unroll(i0_2)", "sch.vectorize(i1_2)"):
        assert line in text


def test_micro_kernel_is_clean_c() -> None:
    """Full tiles: no bounds check and plain indices in the K loop, as the hand-built had."""
    func = gemm_func(100, 100, 100, GemmConfig(14, 32, 50, 28, 64))
    source = render_c(func)
    update = source[source.index("/* block C */"):]
    update = update[:update.index("}")]
    assert "if (" not in update
    assert ("C_local[i0_2 * 32 + i1_2] = C_local[i0_2 * 32 + i1_2] + "
            "(A_local[i0_1 * 700 + k0_1 * 14 + i0_2] * B_global[i1_1 * 1600 + k0_1 * 32 + i1_2])"
            in update)
    assert "float C_local[448]" in source  # the register tile


@pytest.mark.parametrize("row", [False, True], ids=["matrix", "matrix_and_row"])
@pytest.mark.parametrize("m,n,k,kc", [(13, 37, 5, 5), (13, 37, 29, 5), (28, 64, 16, 16),
                                      (1, 3, 1, 8)], ids=["one_k_block", "k_blocks", "no_a_pack",
                                                          "tiny"])
def test_an_m_by_n_bias_is_the_residual_the_tiles_start_from(options: Options, m: int, n: int,
                                                              k: int, kc: int, row: bool) -> None:
    """The tiles start from the [M, N] bias (plus, with ``bias_row``, a row added to it)."""
    cfg = GemmConfig(mr=14 if m >= 14 else 4, nr=32 if n >= 32 else 8, kc=kc,
                     mc=28 if m >= 14 else 8, nc=64)
    func = gemm_func(m, n, k, cfg, bias=True, bias_matrix=True, bias_row=row)
    gen = torch.Generator().manual_seed(m + n + k)
    a, b, r = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen), \
        torch.randn(m, n, generator=gen)
    r[0, 0] = float("nan")
    extra = [torch.randn(n, generator=gen)] if row else []
    expected = torch.addmm(r + extra[0] if row else r, a, b)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    c = torch.full((m, n), 7.0)
    kernel(a, b, r, *extra, c)
    torch.testing.assert_close(c, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(interp.run_torch(func, [a, b, r, *extra])[0], expected,
                               rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_row_bias_needs_a_matrix_bias() -> None:
    with pytest.raises(ValueError, match="bias_matrix"):
        gemm_func(4, 4, 4, bias=True, bias_row=True)


def test_one_k_block_starts_the_register_tile_from_the_bias() -> None:
    """With KC >= K the tile's accumulator is initialized from the bias and C written once:
    no init pass over C, no load of C into the tile (3 passes over C for small K before)."""
    plan = gemm_plan(64, 64, 24, GemmConfig(14, 32, 24, 28, 64), bias=True)
    text = plan.trace.as_python()
    assert "sch.cache_write(b_C, scope='local')" in text
    assert "decompose_reduction(b_C, k0)" in text and "cache_inplace" not in text
    source = render_c(plan.build())
    assert "C_local[" in source and "C[" not in source.split("/* block C_init */")[1].split(
        ";")[0]  # the init writes the local tile


def test_short_rows_of_a_are_read_in_place_and_narrow_outputs_take_one_vector() -> None:
    from kiln.codegen.isa import Isa
    from kiln.kernels.gemm_schedule import default_gemm_config

    cfg = default_gemm_config(12544, 16, 32, threads=2, base=GemmConfig.for_isa(Isa.AVX512),
                              b_prepacked=True)
    assert (cfg.nr, cfg.mr) == (16, 28)  # 28 one-vector accumulators, none on padding
    source = render_c(gemm_func(12544, 16, 32, cfg, bias=True, b_prepacked=True))
    assert "A_local" not in source  # one K block, one N block: A read in place
    tail = render_c(gemm_func(12545, 16, 32, cfg, bias=True, b_prepacked=True))
    assert "A_local" not in tail  # a last tile of rows reads A in place, with its checks
    wide = render_c(gemm_func(12544, 16, 300, cfg, bias=True, b_prepacked=True))
    assert "A_local" in wide  # several K blocks: A is packed
    projection = default_gemm_config(784, 32, 192, threads=2,
                                     base=GemmConfig.for_isa(Isa.AVX512), b_prepacked=True)
    assert "A_local" not in render_c(gemm_func(784, 32, 192, projection, bias=True,
                                               b_prepacked=True))
    long = default_gemm_config(784, 32, 600, threads=2, base=GemmConfig.for_isa(Isa.AVX512),
                               b_prepacked=True, one_k_block=True)
    assert "A_local" in render_c(gemm_func(784, 32, 600, long, bias=True, b_prepacked=True))



def test_short_reductions_over_many_rows_take_a_one_vector_tile() -> None:
    """K <= 128 over M >= 512 rows (1x1 convolutions): 16 x 16; long K, or few rows
    (a transformer's tokens), keep the two-vector tile; other ISAs keep theirs."""
    from kiln.codegen.isa import Isa
    from kiln.kernels.gemm_schedule import NARROW_TILE_MAX_K, NARROW_TILE_MIN_M, default_gemm_config

    avx512 = GemmConfig.for_isa(Isa.AVX512)

    def tile(m: int, n: int, k: int, base: GemmConfig = avx512) -> tuple[int, int]:
        cfg = default_gemm_config(m, n, k, threads=2, base=base, b_prepacked=True)
        return cfg.nr, cfg.mr

    assert tile(3136, 64, 64) == (16, 16)
    assert tile(12544, 96, 16) == (16, 16)
    assert tile(NARROW_TILE_MIN_M, 192, NARROW_TILE_MAX_K)[0] == 16
    assert tile(784, 192, NARROW_TILE_MAX_K + 1) == (32, 14)
    assert tile(NARROW_TILE_MIN_M - 1, 384, 64)[0] == 32
    assert tile(128, 768, 768)[0] == 32
    assert tile(3136, 64, 64, GemmConfig.for_isa(Isa.AVX2)) == (16, 6)


def test_full_rate_512_bit_fmas_keep_the_two_vector_tile_for_short_reductions() -> None:
    """``full_rate_512`` (a machine whose 512-bit FMAs run at full rate): the same short
    reductions keep 14 x 32; the one-vector tile for a one-vector N stays."""
    from kiln.codegen.isa import Isa
    from kiln.kernels.gemm_schedule import default_gemm_config

    avx512 = GemmConfig.for_isa(Isa.AVX512)
    for m, n, k in ((3136, 64, 64), (12544, 96, 16), (784, 512, 128)):
        narrow = default_gemm_config(m, n, k, threads=2, base=avx512, b_prepacked=True)
        wide = default_gemm_config(m, n, k, threads=2, base=avx512, b_prepacked=True,
                                   full_rate_512=True)
        assert narrow.nr == 16
        assert (wide.nr, wide.mr) == (32, 14) and wide.nc % wide.nr == 0
    one_vector = default_gemm_config(3136, 16, 64, threads=2, base=avx512, b_prepacked=True,
                                     full_rate_512=True)
    assert one_vector.nr == 16


def test_full_rate_512_bit_fmas_accept_a_little_more_padding_for_taller_tiles() -> None:
    """128 tokens: 12-row tiles (132 rows, 3% padding) over 10-row ones (130) at full rate;
    where the taller tile pads more (49 rows in 14s: 56), the shorter stays."""
    from kiln.codegen.isa import Isa
    from kiln.kernels.gemm_schedule import default_gemm_config

    avx512 = GemmConfig.for_isa(Isa.AVX512)

    def mr(m: int, n: int, k: int, full: bool) -> int:
        return default_gemm_config(m, n, k, threads=2, base=avx512, b_prepacked=True,
                                   full_rate_512=full).mr

    assert (mr(128, 3072, 768, False), mr(128, 3072, 768, True)) == (10, 12)
    assert mr(49, 512, 2048, True) == mr(49, 512, 2048, False) == 10
    assert mr(197, 768, 3072, True) == mr(197, 768, 3072, False) == 12


def test_avx2_tiles_for_24_columns_skinny_rows_and_deep_k() -> None:
    """AVX2: 24 columns take one 4 x 24 tile (6 x 16 would compute a third padding); M tiles
    that fall unevenly on the threads make them split N instead (64 rows: 11 tiles of 6), as
    does N > M;
    K blocks are up to 1024 deep. The counterparts keep the defaults."""
    from kiln.codegen.isa import Isa
    from kiln.kernels.gemm_schedule import default_gemm_config

    avx2 = GemmConfig.for_isa(Isa.AVX2)

    def config(m: int, n: int, k: int, base: GemmConfig = avx2) -> GemmConfig:
        return default_gemm_config(m, n, k, threads=2, base=base, b_prepacked=True)

    assert (config(3136, 24, 96).mr, config(3136, 24, 96).nr) == (4, 24)
    assert (config(3136, 32, 96).mr, config(3136, 32, 96).nr) == (6, 16)
    assert config(3136, 24, 96, GemmConfig.for_isa(Isa.AVX512)).nr != 24
    assert config(64, 2048, 2048).split_n  # 6 tiles on one thread, 5 on the other
    assert config(72, 2048, 2048).split_n  # 6 tiles each, but N > M: half the weights each
    assert not config(2052, 2048, 2048).split_n  # 171 tiles each, and M >= N
    # split by N: a thread's whole share as one N block (up to 2048 columns), A in even
    # blocks of at most 8 tiles
    split = config(128, 3072, 768)
    assert (split.split_n, split.nc, split.mc) == (True, 1536, 48)  # 22 tiles: 8, 8, 6
    vocab = config(128, 32000, 768)
    blocks = -(-32000 // vocab.nc)
    assert vocab.nc <= 2048 and vocab.nc % 16 == 0 and blocks % 2 == 0
    assert config(49, 320, 960).mc == 30  # 9 tiles: 5 and 4
    assert not config(3136, 2048, 64).split_n
    # N split only where N outweighs twice M: each thread packs all of A then
    assert not config(196, 256, 1024, GemmConfig.for_isa(Isa.AVX512)).split_n
    assert config(196, 1024, 256, GemmConfig.for_isa(Isa.AVX512)).split_n
    assert config(128, 768, 768).kc == 768  # one K block
    assert config(128, 768, 3072).kc == 1024
    assert config(128, 768, 3072, GemmConfig.for_isa(Isa.AVX512)).kc == 512

def test_tail_tiles_of_a_prepacked_b_run_without_bounds_checks() -> None:
    """B prepacked in zero-padded panels is read in bounds over the whole tile, so a tail
    tile's K loop has no guard (it had one per FMA: 16-wide outputs ran 30x slower)."""
    func = gemm_func(28, 40, 64, GemmConfig(14, 32, 64, 28, 64), bias=True, b_prepacked=True)
    source = render_c(func)
    updates = source.split("/* block C */")[1:]
    assert len(updates) >= 2  # the full tile and the tail tile
    for update in updates:
        assert "if (" not in update[:update.index("}")]


@pytest.mark.parametrize("kc", [5, 29], ids=["k-blocks", "one-k-block"])
@pytest.mark.parametrize("tiles", [1, 2], ids=["each-tile-all-rows", "spread-over-2-tiles"])
def test_prefetched_panels_change_no_value(options: Options, kc: int, tiles: int) -> None:
    """The next panel's prefetch (clamped to the last panel) leaves the results as they were,
    in the interpreter and in C, with K blocks or one; spread over the tiles that pass over
    a panel (each its share of the rows: tile t at step k prefetches row (t K + k) // T),
    too."""
    from kiln.kernels.gemm_schedule import pack_b
    from kiln.kernels.plan import PrefetchPanels

    config = dataclasses.replace(TINY, kc=kc)
    plan = gemm_plan(13, 70, 29, config, b_transposed=True, bias=True, b_prepacked=True)
    assert not any(isinstance(p, PrefetchPanels) for p in plan.post)  # (B below the size)
    loops = plan.post[2].loops
    step = PrefetchPanels(loops[-1], "B", loops[-2] if tiles > 1 else "", tiles)
    func = plan.with_post(step).build()
    printed = print_func(func)
    assert "prefetch B[min(" in printed and "(2 lines)" not in printed  # NR = 8: one line
    assert (f") // {tiles}, 0]" in printed) == (tiles > 1)
    source = render_c(func)
    assert source.count("__builtin_prefetch(") == printed.count("prefetch B[") > 0
    torch.manual_seed(0)
    a, w, bias = torch.randn(13, 29), torch.randn(70, 29), torch.randn(70)
    inputs = [a, pack_b(w.t(), config.nr), bias]
    expected = F.linear(a, w, bias)
    torch.testing.assert_close(interp.run_torch(func, inputs)[0], expected, rtol=1e-5,
                               atol=1e-5)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    c = torch.full((13, 70), float("nan"))
    kernel(*inputs, c)
    torch.testing.assert_close(c, expected, rtol=1e-5, atol=1e-5)


def test_large_packed_weights_get_their_panels_prefetched() -> None:
    from kiln.kernels.plan import PrefetchPanels

    config = GemmConfig(mr=12, nr=32, kc=384, mc=72, nc=384, split_n=True, lanes=16)
    plan = gemm_plan(128, 768, 768, config, b_transposed=True, bias=True, b_prepacked=True)
    (step,) = [p for p in plan.post if isinstance(p, PrefetchPanels)]
    assert step.k_loop == plan.post[2].loops[-1] and "post.prefetch_panels(" in plan.as_python()
    # the 6 tiles of a 72-row block share the next panel's rows between them
    assert (step.tile_loop, step.tiles) == (plan.post[2].loops[-2], 6)
    # into L1 too (locality 3); a step asked for L2 only (2) says so in the plan and the C
    source = render_c(plan.build())
    assert "__builtin_prefetch(" in source and ", 0, 2);" not in source
    assert source.count(", 0, 3);") == source.count("__builtin_prefetch(")
    outer = dataclasses.replace(step, locality=2)
    assert "locality=2" in outer.as_python() and "locality" not in step.as_python()
    source = render_c(dataclasses.replace(plan, post=tuple(
        outer if p is step else p for p in plan.post)).build())
    assert source.count(", 0, 2);") == source.count("__builtin_prefetch(") > 0


def test_compute_bound_gemms_share_their_blocks_dynamically() -> None:
    """A transformer's projections (about 50 FLOPs a byte) hand their blocks out as threads
    come free; a CNN's 1x1 convolutions and a classifier's GEMV (memory-bound) keep a fixed
    run per thread, in every parallel loop of the kernel (its init and B's packing too)."""
    from kiln.kernels.gemm_schedule import default_gemm_config
    from kiln.kernels.plan import DYNAMIC_MIN_INTENSITY

    def dynamic(m: int, n: int, k: int, prepacked: bool = True) -> bool:
        return default_gemm_config(m, n, k, threads=2, b_prepacked=prepacked).dynamic

    assert dynamic(128, 3072, 768) and dynamic(128, 768, 3072) and dynamic(512, 2304, 768)
    assert not dynamic(12544, 96, 16) and not dynamic(196, 576, 96)
    assert not dynamic(1, 1000, 1280) and not dynamic(3136, 24, 144)
    # the threshold itself: M = N = K = 6t has 2(6t)^3 / (4 * 3 (6t)^2) = t FLOPs a byte
    edge = int(DYNAMIC_MIN_INTENSITY) * 6
    assert dynamic(edge, edge, edge) and not dynamic(edge - 6, edge - 6, edge - 6)
    for m, n, k, policy in ((128, 768, 3072, "dynamic, 1"), (3136, 64, 64, "static")):
        config = default_gemm_config(m, n, k, threads=2)  # (B packed in the kernel, K blocks)
        source = render_c(gemm_func(m, n, k, config, b_transposed=True))
        pragmas = [line for line in source.splitlines() if "omp parallel" in line]
        assert len(pragmas) >= 2 and all(f"schedule({policy})" in p for p in pragmas)


@pytest.mark.parametrize("prepacked", [True, False])
def test_a_column_tail_reads_a_in_place_without_bounds_checks(options: Options,
                                                              prepacked: bool) -> None:
    """N not a multiple of NR: A is still read in place (no packing for one use), and the
    tail tile's K loop has no guard (its dead columns run over B's padded panel); only its
    write-back is guarded. The values agree with torch."""
    m, n, k = 56, 24, 40
    config = GemmConfig(14, 32, k, 28, 32)
    func = gemm_func(m, n, k, config, bias=True, b_prepacked=prepacked)
    assert "A_local" not in print_func(func)
    source = render_c(func)
    updates = source.split("/* block C */")[1:]
    assert updates and all("if (" not in u[:u.index("}")] for u in updates)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    a, b, bias = torch.randn(m, k), torch.randn(k, n), torch.randn(n)
    a[3, 5] = float("nan")
    out = torch.empty(m, n)
    kernel(a, pack_b(b, 32) if prepacked else b, bias, out)
    torch.testing.assert_close(out, torch.addmm(bias, a, b), rtol=1e-4, atol=1e-4,
                               equal_nan=True)


@pytest.mark.parametrize(("k", "n", "nr"), [(5, 7, 4), (6, 32, 16), (3, 5, 8), (0, 5, 4)])
@pytest.mark.parametrize("transposed", [False, True])
def test_packed_b_holds_nr_column_panels_the_last_zero_padded(k: int, n: int, nr: int,
                                                             transposed: bool) -> None:
    """Panel p of pack_b(B, nr) is B[:, p*nr:(p+1)*nr], the columns past N zeros, whether B
    is contiguous or a Linear weight's transpose."""
    torch.manual_seed(0)
    b = torch.randn(n, k).t() if transposed else torch.randn(k, n)
    packed = pack_b(b, nr)
    panels = -(-n // nr)
    assert packed.shape == (panels, k, nr) and packed.is_contiguous()
    for p in range(panels):
        width = min(nr, n - p * nr)
        assert torch.equal(packed[p, :, :width], b[:, p * nr:p * nr + width])
        assert not packed[p, :, width:].any()


def test_k_blocks_split_k_exactly_where_a_slightly_longer_block_does() -> None:
    """A K of up to 1.5 x KC is one block (768 on AVX-512, where two of 384 read and wrote
    C twice); a longer K that balanced blocks of KC split with a shorter last block takes
    equal blocks of up to 1.5 x KC where K divides into them; exact splits stay as they
    were; a K with no such split keeps the balanced blocks."""
    from kiln.codegen.isa import Isa
    from kiln.kernels.gemm_schedule import K_BLOCK_STRETCH, default_gemm_config

    avx512 = GemmConfig.for_isa(Isa.AVX512)

    def kc(m: int, n: int, k: int) -> int:
        return default_gemm_config(m, n, k, threads=2, base=avx512, b_prepacked=True).kc

    assert (kc(128, 512, 1376), kc(1, 1000, 1280)) == (688, 640)  # (459 and 427 before)
    assert 688 <= K_BLOCK_STRETCH * avx512.kc
    assert (kc(128, 3072, 768), kc(128, 768, 3072), kc(49, 512, 2048)) == (768, 512, 512)
    assert (kc(196, 96, 576), kc(128, 768, 769), kc(128, 768, 1024)) == (576, 385, 512)
    assert kc(128, 512, 1001) == 501  # (1001 = 7 x 11 x 13: no split of 2 to 4 blocks)


def _pack_block(func, name: str = "B_global"):
    """The blocks of ``func`` named ``name`` (the kernel's pack of B)."""
    from kiln.tir.nodes import Block
    from kiln.tir.visit import iter_stmts
    return [s for s in iter_stmts(func.body) if isinstance(s, Block) and s.name == name]


def test_a_b_packed_in_the_kernel_writes_zeros_in_its_padding_lanes(options: Options) -> None:
    """HF ViT's scores bmm (N = 197 in panels of 32): the pack block writes B where the
    panel's lane is inside N and 0.0 past it, so the micro-kernel's dropped lanes never meet
    the allocator's leftovers (subnormal garbage: 5.4 ms a call against 0.28 in the model)."""
    from kiln.kernels.plan import ZeroPadding
    from kiln.tir.nodes import BufferStore, IfThenElse

    cfg = GemmConfig(mr=12, nr=32, kc=64, mc=24, nc=224, lanes=16)
    plan = gemm_plan(197, 197, 64, cfg, batch=12, a_strides=(64, 2304, 1),
                     b_strides=(64, 1, 2304), name="scores")
    assert any(isinstance(p, ZeroPadding) for p in plan.post)
    from kiln.tir.nodes import Block
    from kiln.tir.visit import iter_stmts
    branches = [s for s in iter_stmts(plan.build().body) if isinstance(s, IfThenElse)
                and isinstance(s.then_body, Block) and s.then_body.name == "B_global"
                and isinstance(s.else_body, BufferStore)]
    assert len(branches) == 1 and branches[0].else_body.buffer.name == "B_global"
    assert branches[0].else_body.value.value == 0.0  # type: ignore[union-attr]
    without = dataclasses.replace(plan, post=tuple(p for p in plan.post
                                                  if not isinstance(p, ZeroPadding)))
    (guarded,) = _pack_block(without.build())
    assert guarded.predicate is not None  # (what the pass replaces: a store skipped)
    a = torch.randn(12 * 197 * 64 * 3).as_strided((12, 197, 64), (64, 2304, 1))
    b = torch.randn(12 * 197 * 64 * 3).as_strided((12, 64, 197), (64, 1, 2304))
    kernel = compile_kernel(plan.build(), options)
    if not isinstance(kernel, CompiledKernel):
        pytest.skip("no C compiler")
    out = torch.empty(12, 197, 197)
    kernel.run_unchecked(a.data_ptr(), b.data_ptr(), out.data_ptr())
    torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-4, atol=1e-4)


def test_zero_padding_leaves_a_store_that_could_leave_its_buffer_alone() -> None:
    """A pack whose index may pass the buffer's end under the predicate's failing side is
    not touched, nor a buffer no block or several blocks write."""
    from kiln.kernels.plan import ZeroPadding
    from kiln.tir.nodes import Block, BufferStore

    cfg = GemmConfig(mr=12, nr=32, kc=64, mc=24, nc=224, lanes=16)
    func = gemm_plan(197, 197, 64, cfg, batch=12, a_strides=(64, 2304, 1),
                     b_strides=(64, 1, 2304), name="scores").scheduled
    assert ZeroPadding("no_such_buffer").apply(func) is func
    (block,) = _pack_block(func)
    assert isinstance(block.body, BufferStore)
    small = dataclasses.replace(block.body.buffer, shape=(1, 6, 64, 32))  # (7 panels written)
    shrunk = dataclasses.replace(block, body=dataclasses.replace(block.body, buffer=small))
    from kiln.tir.visit import map_stmt
    narrow = func.with_body(map_stmt(func.body, lambda s: shrunk if isinstance(s, Block)
                                     and s.name == "B_global" else s))
    assert ZeroPadding("B_global").apply(narrow) is narrow
