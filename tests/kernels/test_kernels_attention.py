"""The generated attention kernel: softmax(Q Kᵀ · c) V against the decomposition at shapes
with every tail (a short last block of queries, a short last tile of keys, fewer queries
than a block), on strided views as models give them; NaN and ±inf propagating as the
decomposition's; the portable path; its plan; what it refuses; and attention through
kiln.compile."""

from __future__ import annotations

import dataclasses
import platform

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln.codegen.isa import Isa, target_isa
from kiln.codegen.kernel import compile_kernel, prebuild
from kiln.kernels.attention_schedule import (
    AttentionShape,
    RuntimeMask,
    attention_plan,
    default_attention_config,
    packs_head,
    transposed_mask,
)
from kiln.kernels.plan import Recipe
from kiln.options import Options
from kiln.tir.nodes import Allocate, For
from kiln.tir.printer import print_func
from kiln.tir.visit import iter_stmts

# (batch, heads, queries, keys, depth, value depth)
CASES = [
    (1, 8, 100, 75, 64, 64),  # a short last query block (100 = 2 x 48 + 4), 75 = 12 x 6 + 3 keys
    (1, 3, 37, 53, 40, 32),  # fewer queries than a block, an odd head depth
    (2, 2, 5, 7, 8, 16),  # two batches, tiny
    (1, 4, 49, 30, 64, 128),  # a wide value (8 vectors: a 2-row product tile)
    (1, 2, 96, 96, 64, 64),  # whole blocks and tiles, no tails
]
IDS = ["x".join(map(str, c)) for c in CASES]


def _operands(case: tuple, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V as a model's attention reads them: heads split out of projections
    ([B, L, H * E] viewed [B, L, H, E] and transposed), so no operand is contiguous."""
    b, h, n_q, n_k, e, ev = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n_q, h * e, generator=gen).view(b, n_q, h, e).transpose(1, 2)
    k = torch.randn(b, n_k, h * e, generator=gen).view(b, n_k, h, e).transpose(1, 2)
    v = torch.randn(b, n_k, h * ev, generator=gen).view(b, n_k, h, ev).transpose(1, 2)
    return q, k, v


def _decomposed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v


def _plan(case: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, isa: Isa = Isa.AVX512):
    b, h, n_q, n_k, e, ev = case
    shape = AttentionShape(b, h, n_q, n_k, e, ev, e ** -0.5, q.stride(), k.stride(), v.stride())
    config = default_attention_config(isa, ev, n_q)
    assert config is not None
    return shape, attention_plan(shape, config, f"attention_test_{'_'.join(map(str, case))}"
                                 f"_{isa.label}")


def _run(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    out = torch.empty(*q.shape[:3], v.shape[-1])
    kernel(q, k, v, out)
    return out


@pytest.fixture(scope="module")
def built(kernel_options: Options) -> dict:
    """Every case's kernel, compiled in parallel."""
    plans = {}
    for i, case in enumerate(CASES):
        operands = _operands(case, seed=i)
        plans[case] = (operands, *_plan(case, *operands))
    prebuild([plan.build() for _, _, plan in plans.values()], kernel_options)
    return {case: (operands, shape, plan, compile_kernel(plan.build(), kernel_options))
            for case, (operands, shape, plan) in plans.items()}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_attention_matches_the_decomposition(built: dict, case: tuple) -> None:
    """Within rounding of the decomposition computed in float64; the plan replays."""
    (q, k, v), shape, plan, kernel = built[case]
    got = _run(kernel, q, k, v)
    want = _decomposed(q.double(), k.double(), v.double(), shape.scale)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=2e-6)
    assert plan.recipe is Recipe.ATTENTION
    assert plan.replayed() == plan.build()  # the trace is the shipped kernel
    source = kernel.source
    assert source.count("fma_tile") >= 2  # both products in registers (full blocks at least)


def test_widely_spread_scores_flush_their_subnormal_probabilities(built: dict) -> None:
    """Scores over a range of hundreds (sharp heads, LeViT's attention biases), where the
    kernel makes the probabilities below the smallest normal float 0
    (`kiln.tir.te.softmax_exp`; as subnormals each cost a microcode assist on Intel cores:
    LeViT's 8 x 49 x 196 2.2 against 0.19 ms): the result is the decomposition's to
    float32's rounding."""
    case = CASES[0]
    (q, k, v), shape, _, kernel = built[case]
    q = q * 12  # scores of |x| up to several hundred
    got = _run(kernel, q, k, v)
    scores = q.double() @ k.double().transpose(-1, -2) * shape.scale
    probs = torch.softmax(scores, -1)
    assert ((probs > 0) & (probs < torch.finfo(torch.float32).tiny)).any()
    want = probs @ v.double()
    # (scores this large carry float32's rounding into the exponent: the bound is what the
    # float32 decomposition itself misses by)
    bound = (_decomposed(q, k, v, shape.scale).double() - want).abs().max().item()
    assert (got.double() - want).abs().max().item() <= 2 * bound + 2e-6


@pytest.mark.parametrize("where", ["q_nan", "k_inf", "v_nan", "v_inf", "large_scores"])
def test_attention_non_finite_as_the_decomposition(built: dict, where: str) -> None:
    """A NaN query makes its row NaN; an infinite key makes inf - inf = NaN rows where the
    decomposition has them; NaN and inf values reach the rows that weigh them; scores that
    overflow when scaled give the decomposition's NaNs. ATen's fused kernel differs in each
    (it returns finite values), the generated kernel does not."""
    case = CASES[0]
    (q, k, v), shape, _, kernel = built[case]
    q, k, v = q.clone(), k.clone(), v.clone()
    if where == "q_nan":
        q[0, 1, 7, 3] = float("nan")
    elif where == "k_inf":
        k[0, 2, 11, 0] = float("inf")
    elif where == "v_nan":
        v[0, 3, 40, 5] = float("nan")
    elif where == "v_inf":
        v[0, 4, 2, 60] = -float("inf")
    else:  # one product a score: the same overflow (to inf, then inf - inf) in any order
        q[0, 5, 9] = 0.0
        q[0, 5, 9, 0] = 3e38
    got = _run(kernel, q, k, v)
    want = _decomposed(q, k, v, shape.scale)
    assert torch.equal(got.isnan(), want.isnan())
    assert got.isnan().any() or where == "v_inf"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
def test_attention_portable_path(kernel_options: Options) -> None:
    """Compiled for AVX2 (8-lane tiles) and for plain SSE2 (4 lanes, a value of 16 wide:
    32 would leave no register for a tile's row): the same results."""
    for flags, isa, case in ((("-O3", "-march=haswell", "-fopenmp"), Isa.AVX2, CASES[1]),
                             (("-O3", "-march=x86-64", "-fopenmp"), Isa.VEC128, CASES[2])):
        options = dataclasses.replace(kernel_options, c_flags=flags)
        assert target_isa(options) is isa
        q, k, v = _operands(case, seed=11)
        shape, plan = _plan(case, q, k, v, isa)
        got = _run(compile_kernel(plan.build(), options), q, k, v)
        torch.testing.assert_close(got, _decomposed(q, k, v, shape.scale), rtol=1e-5, atol=2e-6)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
def test_causal_stop_on_the_portable_path(kernel_options: Options) -> None:
    """The keys after each block skipped on AVX2 (8-lane tiles: blocks of 16 queries) and
    SSE2 (4 lanes): ATen's is_causal values."""
    b, h, n, e = 1, 2, 45, 16
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(b, h, n, e, generator=gen) for _ in range(3))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    for flags, isa in ((("-O3", "-march=haswell", "-fopenmp"), Isa.AVX2),
                       (("-O3", "-march=x86-64", "-fopenmp"), Isa.VEC128)):
        options = dataclasses.replace(kernel_options, c_flags=flags)
        assert target_isa(options) is isa
        shape = AttentionShape(b, h, n, n, e, e, e ** -0.5, q.stride(), k.stride(), v.stride(),
                               causal=True)
        config = default_attention_config(isa, e, n, h, 2, stops=True)
        assert config is not None and config.qb == 2 * isa.f32_lanes
        plan = attention_plan(shape, config, f"attention_test_stop_{isa.label}")
        out = torch.empty(b, h, n, e)
        compile_kernel(plan.build(), options)(q, k, v, out)
        torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=2e-6)


def test_attention_writes_the_heads_side_by_side(kernel_options: Options) -> None:
    """``heads_inner``: the output [B, L, H, Ev] (what the model's transpose before its
    reshape wants), contiguous, the same values."""
    case = (2, 3, 41, 29, 32, 32)
    b, h, n_q, n_k, e, ev = case
    q, k, v = _operands(case, seed=9)
    shape = AttentionShape(b, h, n_q, n_k, e, ev, 0.2, q.stride(), k.stride(), v.stride(),
                           heads_inner=True)
    config = default_attention_config(Isa.AVX512, ev, n_q)
    assert config is not None
    plan = attention_plan(shape, config, "attention_test_heads_inner")
    out = torch.empty(b, n_q, h, ev)
    compile_kernel(plan.build(), kernel_options)(q, k, v, out)
    want = _decomposed(q.double(), k.double(), v.double(), 0.2).transpose(1, 2)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=2e-6)
    assert plan.replayed() == plan.build()


def test_few_heads_share_their_blocks_of_queries(kernel_options: Options) -> None:
    """One head (or heads that fall unevenly on the threads): the threads take each head's
    blocks of queries; twelve heads on two threads: the heads. Same values either way
    (Zen 4, 2 threads, 1 x 1024 x 1024 x 64: 2.79 ms on one thread, 1.40 split, ATen 1.69)."""
    assert default_attention_config(Isa.AVX512, 64, 1024, heads=1, threads=2).split_queries
    assert default_attention_config(Isa.AVX512, 64, 197, heads=3, threads=2).split_queries
    assert not default_attention_config(Isa.AVX512, 64, 197, heads=12,
                                        threads=2).split_queries
    case = (1, 1, 70, 45, 32, 32)
    q, k, v = _operands(case, seed=12)
    shape = AttentionShape(1, 1, 70, 45, 32, 32, 0.2, q.stride(), k.stride(), v.stride())
    config = default_attention_config(Isa.AVX512, 32, 70, heads=1, threads=2)
    plan = attention_plan(shape, config, "attention_test_split")
    parallel = [f for f in iter_stmts(plan.build().body)
                if isinstance(f, For) and f.kind.is_parallel]
    assert [f.extent for f in parallel] == [-(-70 // config.qb)]  # (the blocks of queries)
    out = torch.empty(1, 1, 70, 32)
    compile_kernel(plan.build(), kernel_options)(q, k, v, out)
    want = _decomposed(q.double(), k.double(), v.double(), 0.2)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=2e-6)


MASKS = {
    # [L, S], aligned to the last query: with more queries than keys, the first see none
    "causal": lambda n_q, n_k, h: torch.full((n_q, n_k), -float("inf")).triu(1 + n_k - n_q),
    # T5's position bias: one per head, finite
    "bias": lambda n_q, n_k, h: torch.randn(1, h, n_q, n_k,
                                            generator=torch.Generator().manual_seed(3)),
}


@pytest.mark.parametrize("panel", ["block", "none", "other"])
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_attention_with_a_constant_mask(kernel_options: Options, kind: str,
                                        panel: str) -> None:
    """A causal mask ([L, S], broadcast over batch and heads) and a per-head bias
    ([1, H, L, S]) are laid out transposed once and added to the scaled scores: the
    decomposition's result, and its NaN rows where a query sees no key (a causal mask over
    more queries than keys masks every key of the first ones). Laid out in panels of the
    kernel's block of queries (as compiled: each block's part in order, no division left in
    its indices), as [S, L], or in panels of another width (a tuned block): the same."""
    case = (2, 3, 53, 41, 32, 32)
    b, h, n_q, n_k, e, ev = case
    q, k, v = _operands(case, seed=4)
    mask = MASKS[kind](n_q, n_k, h)
    config = default_attention_config(Isa.AVX512, ev, n_q)
    assert config is not None
    width = {"block": config.qb, "none": 0, "other": 16}[panel]
    shape = AttentionShape(b, h, n_q, n_k, e, ev, e ** -0.5, q.stride(), k.stride(), v.stride(),
                           (1, h if kind == "bias" else 1), mask_panel=width)
    plan = attention_plan(shape, config, f"attention_test_mask_{kind}_{panel}")
    kernel = compile_kernel(plan.build(), kernel_options)
    reads = [line.split("M[", 1)[1].split("]", 1)[0]
             for line in print_func(plan.build()).splitlines() if " M[" in line]
    assert reads and all(("//" in r) == (panel == "other") for r in reads)
    assert plan.replayed() == plan.build()
    out = torch.empty(b, h, n_q, ev)
    kernel(q, k, v, transposed_mask(mask, b, h, n_q, n_k, width), out)
    want = torch.softmax(q @ k.transpose(-1, -2) * shape.scale + mask, -1) @ v
    assert torch.equal(out.isnan(), want.isnan())
    assert want.isnan().any() == (kind == "causal")
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6, equal_nan=True)


# masks computed at run time, as models hand them over: (the mask, its additive form)
RUNTIME_MASKS = {
    # a float mask per batch, broadcast over heads (HF's sdpa and eager paths)
    "float_b1ls": lambda b, h, n_q, n_k, gen: torch.randn(b, 1, n_q, n_k, generator=gen),
    # bool, True where a query attends; some queries of the first batch see no key at all
    "bool_b1ls": lambda b, h, n_q, n_k, gen: (torch.rand(b, 1, n_q, n_k, generator=gen) > 0.3)
    .index_fill_(2, torch.tensor([0, 50]), False),
    # a padding mask expanded over queries (stride 0), -inf past the last real key
    "padding_b11s": lambda b, h, n_q, n_k, gen: torch.where(
        torch.arange(n_k) < 30, 0.0, -float("inf")).expand(b, 1, 1, n_k),
    # two dims only, broadcast over batch and heads
    "float_ls": lambda b, h, n_q, n_k, gen: torch.randn(n_q, n_k, generator=gen),
    # one per head, laid out keys by queries (a transposed view)
    "float_bhls_transposed": lambda b, h, n_q, n_k, gen: torch.randn(
        b, h, n_k, n_q, generator=gen).transpose(-1, -2),
}


@pytest.mark.parametrize("kind", sorted(RUNTIME_MASKS))
def test_attention_with_a_mask_made_at_run_time(kernel_options: Options, kind: str) -> None:
    """A mask the model computes is read where it lies (its run-time strides, broadcast dims
    indexed at 0), each block of queries transposing its part into a zero-padded pack; a bool
    one adds 0 or -inf. The decomposition's values, NaN rows where a query sees no key; the
    plan replays."""
    case = (2, 3, 53, 41, 32, 32)
    b, h, n_q, n_k, e, ev = case
    q, k, v = _operands(case, seed=5)
    mask = RUNTIME_MASKS[kind](b, h, n_q, n_k, torch.Generator().manual_seed(6))
    full = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    shape = AttentionShape(b, h, n_q, n_k, e, ev, e ** -0.5, q.stride(), k.stride(), v.stride(),
                           (b if full[0] > 1 else 1, h if full[1] > 1 else 1),
                           RuntimeMask(tuple(mask.shape), mask.stride(),
                                       mask.dtype == torch.bool))
    config = default_attention_config(Isa.AVX512, ev, n_q)
    assert config is not None
    plan = attention_plan(shape, config, f"attention_test_runtime_mask_{kind}")
    assert plan.replayed() == plan.build()
    out = torch.empty(b, h, n_q, ev)
    compile_kernel(plan.build(), kernel_options)(q, k, v, mask, out)
    additive = torch.zeros(mask.shape).masked_fill_(~mask, -float("inf")) \
        if mask.dtype == torch.bool else mask
    want = torch.softmax(q.double() @ k.double().transpose(-1, -2) * shape.scale
                         + additive.double(), -1) @ v.double()
    assert want.isnan().any() == (kind == "bool_b1ls")
    assert torch.equal(out.isnan(), want.isnan())
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["grouped", "multi-query"])
def test_grouped_query_heads_read_their_groups_key_head(kernel_options: Options,
                                                        kv_heads: int) -> None:
    """Fewer key and value heads than query heads (ATen's ``enable_gqa``): query head h reads
    key head h // (H / KV) where it lies (no repeated copy), causal here; ATen's values, and
    both products still on register tiles (the key head's index, not affine, is outside
    them)."""
    b, h, n_q, n_k, e = 2, 6, 45, 45, 32
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(b, n_q, h * e, generator=gen).view(b, n_q, h, e).transpose(1, 2)
    k, v = (torch.randn(b, n_k, kv_heads * e, generator=gen).view(b, n_k, kv_heads, e)
            .transpose(1, 2) for _ in range(2))
    shape = AttentionShape(b, h, n_q, n_k, e, e, e ** -0.5, q.stride(), k.stride(), v.stride(),
                           causal=True, kv_heads=kv_heads)
    config = default_attention_config(Isa.AVX512, e, n_q)
    assert config is not None
    plan = attention_plan(shape, config, f"attention_test_gqa_{kv_heads}")
    kernel = compile_kernel(plan.build(), kernel_options)
    assert kernel.source.count("fma_tile") >= 2 and plan.replayed() == plan.build()
    out = torch.empty(b, h, n_q, e)
    kernel(q, k, v, out)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                          enable_gqa=True)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("heads,kv_heads,causal,inner", [(4, 2, True, True), (1, 1, False, False)],
                         ids=["grouped causal heads-inner", "one head: blocks shared"])
def test_strided_keys_and_values_are_copied_once_per_head(kernel_options: Options, heads: int,
                                                          kv_heads: int, causal: bool,
                                                          inner: bool) -> None:
    """K and V whose rows lie a token apart (heads split out of a merged projection, rows
    4 KiB apart as Whisper's) are copied with their rows adjacent once a head, where more
    than one block of queries reads them (`packs_head`); also for shared key heads, the
    causal stop, the heads-inner output, and where the threads share one head's blocks (the
    copy then made before they start). The decomposition's values, and the plan replays."""
    b, n, e = 1, 100, 32
    gen = torch.Generator().manual_seed(17)
    q = torch.randn(b, n, heads * e, generator=gen).view(b, n, heads, e).transpose(1, 2)
    merged = torch.randn(b, n, 1024, generator=gen)  # [K | V | unused]: rows 4 KiB apart
    k = merged[..., :kv_heads * e].view(b, n, kv_heads, e).transpose(1, 2)
    v = merged[..., 512:512 + kv_heads * e].view(b, n, kv_heads, e).transpose(1, 2)
    shape = AttentionShape(b, heads, n, n, e, e, e ** -0.5, q.stride(), k.stride(), v.stride(),
                           causal=causal, heads_inner=inner,
                           kv_heads=kv_heads if kv_heads != heads else 0)
    config = default_attention_config(Isa.AVX512, e, n, heads, threads=2)
    assert config is not None and config.split_queries == (heads == 1)
    plan = attention_plan(shape, config, f"attention_test_copied_{heads}_{kv_heads}")
    func = plan.build()
    assert packs_head(func, "K", config) and packs_head(func, "V", config)
    assert {"K_local", "V_local"} <= {a.buffer.name for a in iter_stmts(func.body)
                                      if isinstance(a, Allocate)}
    assert plan.replayed() == func
    out = torch.empty(b, n, heads, e) if inner else torch.empty(b, heads, n, e)
    compile_kernel(func, kernel_options)(q, k, v, out)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                          is_causal=causal, enable_gqa=kv_heads != heads)
    torch.testing.assert_close(out.transpose(1, 2) if inner else out, want.float(),
                               rtol=1e-5, atol=2e-6)


def test_contiguous_or_once_read_keys_are_not_copied() -> None:
    """K and V with adjacent rows, or read by a single block of queries, are read where
    they lie."""
    config = default_attention_config(Isa.AVX512, 32, 100, 4, threads=2)
    assert config is not None
    for n_q, strided in ((100, False), (config.qb, True)):
        q, k, v = (torch.randn(1, n, 4 * 32).view(1, n, 4, 32).transpose(1, 2) if strided
                   else torch.randn(1, 4, n, 32) for n in (n_q, 100, 100))
        shape = AttentionShape(1, 4, n_q, 100, 32, 32, 0.2, q.stride(), k.stride(), v.stride())
        func = attention_plan(shape, config, f"attention_test_uncopied_{n_q}").build()
        assert not packs_head(func, "K", config) and not packs_head(func, "V", config)


@pytest.mark.parametrize("case", [(1, 4, 100, 100, 64, 64, False), (2, 1, 70, 70, 32, 32, True),
                                  (1, 2, 40, 57, 16, 16, False)],
                         ids=["tails", "few heads: blocks shared", "more keys than queries"])
def test_causal_blocks_stop_at_their_last_key(kernel_options: Options, case: tuple) -> None:
    """With ``is_causal`` over as many keys as queries, each block of queries runs its
    scores, exponentials and product up to its last query's key only (the loops' stop,
    rendered as their bound); threads that share a head's blocks take them as each is free
    (they differ in length). More keys than queries: every key is read (ATen's is_causal
    lets query i see keys up to i there too, but the skipped keys would differ from its
    kernel's). ATen's values either way, and the plan replays."""
    b, h, n_q, n_k, e, ev, split = case
    gen = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(b, h, n, d, generator=gen)
               for n, d in ((n_q, e), (n_k, e), (n_k, ev)))
    shape = AttentionShape(b, h, n_q, n_k, e, ev, e ** -0.5, q.stride(), k.stride(), v.stride(),
                           causal=True)
    config = default_attention_config(Isa.AVX512, ev, n_q, h, threads=2)
    assert config is not None and config.split_queries == split
    plan = attention_plan(shape, config, f"attention_test_stop_{'_'.join(map(str, case))}")
    func = plan.build()
    stops = [s for s in iter_stmts(func.body) if isinstance(s, For) and s.stop is not None]
    assert plan.replayed() == func
    if n_q != n_k:
        assert not stops
    else:  # (the key tiles, the exponentials' keys, the product's keys: in each version)
        assert len({s.var.name for s in stops}) == 3
        assert ("schedule(dynamic, 1)" in compile_kernel(func, kernel_options).source) == split
    out = torch.empty(b, h, n_q, ev)
    compile_kernel(func, kernel_options)(q, k, v, out)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=2e-6)


def test_causal_attention_takes_the_narrowest_block_of_queries() -> None:
    """A block that stops at its last key wastes least across the diagonal when narrow: the
    default takes two vectors of queries (the space's heuristic point too), where without
    a causal stop it takes the width that pads the last block least."""
    from kiln.tune.space_attention import AttentionSpace

    for queries in (128, 197, 1500):
        assert default_attention_config(Isa.AVX512, 64, queries, stops=True).qb == 32
    assert default_attention_config(Isa.AVX512, 64, 128).qb == 64
    causal = AttentionShape(1, 12, 128, 128, 64, 64, 0.125, causal=True)
    space = AttentionSpace(causal, Isa.AVX512, 2)
    assert "qb=32" in space.plan(space.default()).notes


def test_attention_config_refuses() -> None:
    """No tile without vectors, nor for a value width that is not whole vectors; the block
    of queries that leaves the fewest padded in the last, the widest on a tie."""
    assert default_attention_config(Isa.SCALAR, 64, 128) is None
    assert default_attention_config(Isa.AVX512, 72, 128) is None
    assert default_attention_config(Isa.VEC128, 32, 128) is None  # (8 accumulators a row of 16)
    for queries, qb in ((128, 64), (197, 32), (1500, 32), (96, 48), (20, 32)):
        config = default_attention_config(Isa.AVX512, 64, queries)
        assert config is not None and config.qb == qb and config.qb % config.mr_rows == 0


class _Attention(nn.Module):
    """Self-attention as HF's eager code writes it: projections, heads split by view and
    transpose, matmul, scale, softmax, matmul."""

    def __init__(self, dim: int, heads: int, tokens: int = 0) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        # a causal mask over ``tokens``, added to the scores (none for 0)
        mask = torch.full((tokens, tokens), -float("inf")).triu(1)[None, None] if tokens else None
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, -1))
        scores = q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5
        if self.mask is not None:
            scores = scores + self.mask
        mixed = torch.softmax(scores, -1) @ v
        return self.out(mixed.transpose(1, 2).reshape(b, n, d))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_through_kiln_compile(kernel_options: Options, causal: bool) -> None:
    """The attention pass fuses the chain (with its causal mask) into one call; the
    contraction stage runs it as the generated kernel (every checked kernel used,
    unmeasured), and the model matches eager."""
    torch.manual_seed(0)
    model = _Attention(128, 4, 70 if causal else 0).eval()
    x = torch.randn(1, 70, 128)
    compiled = kiln.compile(model, (x,), kernel_options)
    attention = [k for k in compiled.report.kernels
                 if k.kind == "generated" and "kiln_attention" in (k.source or "")]
    assert len(attention) == 1
    assert attention[0].ops == ("call", "permute")  # (the heads' transpose written so)
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class _Sdpa(nn.Module):
    """Self-attention through torch's fused call, as Hugging Face's default (sdpa) attention
    runs it: ``kind`` picks its mask (a constant bool or float mask, ``is_causal``), scale, or
    grouped-query heads (``enable_gqa``, causal: one key head for two query heads)."""

    def __init__(self, kind: str, tokens: int) -> None:
        super().__init__()
        self.kind = kind
        self.qkv = nn.Linear(64, 192)
        gen = torch.Generator().manual_seed(2)
        # (every query attends to itself: no empty row)
        attends = (torch.rand(tokens, tokens, generator=gen) > 0.3) | torch.eye(tokens).bool()
        mask = {"bool_mask": attends,
                "float_mask": torch.randn(1, 4, tokens, tokens, generator=gen)}.get(kind)
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        q, k, v = (t.view(1, n, 4, 16).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        if self.kind == "grouped":
            k, v = k[:, :2], v[:, :2]  # (two key heads, each read by two query heads)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask,
                                              is_causal=self.kind == "causal",
                                              scale=0.3 if self.kind == "scale" else None)


@pytest.mark.parametrize("kind", ["plain", "causal", "bool_mask", "float_mask", "scale",
                                  "grouped"])
def test_the_models_own_fused_attention_runs_generated(kernel_options: Options,
                                                      kind: str) -> None:
    """ATen's scaled_dot_product_attention called by the model (kept whole by capture) runs
    as the generated kernel: its mask laid out once, is_causal as masked scores, its scale
    or 1/sqrt(E); the model matches eager."""
    torch.manual_seed(0)
    model = _Sdpa(kind, 37).eval()
    x = torch.randn(1, 37, 64)
    compiled = kiln.compile(model, (x,), kernel_options)
    attention = [k for k in compiled.report.kernels
                 if k.kind == "generated" and "kiln_attention" in (k.source or "")]
    assert len(attention) == 1
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


class _Operands(nn.Module):
    """ATen's attention on the graph's inputs, with a constant mask that hides every key from
    query 3."""

    def __init__(self) -> None:
        super().__init__()
        mask = torch.zeros(20, 20)
        mask[3] = -float("inf")
        self.register_buffer("mask", mask)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def test_non_finite_results_get_atens_answer(kernel_options: Options) -> None:
    """ATen's kernel answers a query that sees no key with zeros, where the decomposition
    (and so the generated kernel) gives NaN; where the kernel's output is not finite the
    library call runs again, so the compiled model gives ATen's answer there (and for a NaN
    or an infinite operand), and the kernel's elsewhere."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 3, 20, 16, generator=gen) for _ in range(3))
    model = _Operands()
    compiled = kiln.compile(model, (q, k, v), kernel_options)
    assert any(k_.kind == "generated" and "kiln_attention" in (k_.source or "")
               for k_ in compiled.report.kernels)
    for where in ("none", "q", "k"):
        qq, kk = q.clone(), k.clone()
        if where == "q":
            qq[0, 1, 4, 2] = float("nan")
        elif where == "k":
            kk[0, 2, 7, 0] = float("inf")
        want = model(qq, kk, v)
        if where == "none":
            assert torch.equal(want[0, :, 3], torch.zeros(3, 16))  # (ATen's empty row)
        got = compiled(qq, kk, v)
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


class _MaskedFill(nn.Module):
    """nanoGPT's attention on the graph's inputs: scores scaled, a causal ``masked_fill``
    with -inf from a buffer, softmax, then V."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(tokens, tokens))[None, None])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q.shape[2]
        scores = (q @ k.transpose(-2, -1)) * 0.25
        scores = scores.masked_fill(self.bias[:, :, :n, :n] == 0, float("-inf"))
        return torch.softmax(scores, -1) @ v


def test_a_causal_masked_fill_runs_generated_and_selects(kernel_options: Options) -> None:
    """The fill's condition becomes the kernel's constant bool mask; where a key's +inf
    meets only masked queries, the fill leaves those scores -inf (the model's output is
    finite), while the kernel's 0 / -inf added gives NaN: the library runs again there and
    the compiled model gives the fill's answer."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 3, 21, 16, generator=gen) for _ in range(3))
    model = _MaskedFill(21).eval()
    compiled = kiln.compile(model, (q, k, v), kernel_options)
    kernels = [k_ for k_ in compiled.report.kernels
               if k_.kind == "generated" and "kiln_attention" in (k_.source or "")]
    assert len(kernels) == 1
    # (the mask is causal: masked as is_causal, not read, the keys after each block skipped)
    assert "const float* restrict M" not in kernels[0].source and " < 21 ? " in kernels[0].source
    for where in ("none", "masked key", "value after the diagonal"):
        kk, vv = k.clone(), v.clone()
        if where == "masked key":
            kk[0, 1, 20, 3] = float("inf")  # (the last key: only the last query attends it)
            kk[0, 1, 19, 3] = float("inf")
        elif where == "value after the diagonal":  # (0 x inf: NaN in every row, as the
            vv[0, 2, 20, 5] = float("inf")  # graph has it, where the kernel skipped it)
        want = model(q, kk, vv)
        got = compiled(q, kk, vv)
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


class _ExportedCausal(nn.Module):
    """ATen's attention with the causal mask Hugging Face models get under torch.export: a
    float constant, 0 up to each query's key and ``fill`` after."""

    def __init__(self, tokens: int, fill: float) -> None:
        super().__init__()
        causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        self.register_buffer("mask", torch.zeros(tokens, tokens).masked_fill(~causal, fill))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


@pytest.mark.parametrize("fill", [torch.finfo(torch.float32).min, -float("inf"), -1e9],
                         ids=["finfo.min", "-inf", "-1e9"])
def test_an_added_causal_mask_runs_as_is_causal_where_the_scores_are_bounded(
        kernel_options: Options, fill: float) -> None:
    """A float causal mask filled with -inf or finfo.min runs as is_causal (no mask read,
    the keys after each block skipped) where every operand is finite and every score far
    from overflow, which the executor tests each call: an infinite key (NaN in the graph
    where +inf meets the fill, in rows the kernel leaves finite) runs ATen's call. A fill of
    -1e9 stays a mask: its exponential need not be 0."""
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(3))
    model = _ExportedCausal(40, fill).eval()
    compiled = kiln.compile(model, (q, k, v), kernel_options)
    kernels = [k_ for k_ in compiled.report.kernels
               if k_.kind == "generated" and "kiln_attention" in (k_.source or "")]
    assert len(kernels) == 1
    reads_mask = "const float* restrict M" in kernels[0].source
    assert reads_mask == (fill == -1e9)
    assert ("runs where scores_bounded holds, else the library calls" in kernels[0].decision
            ) == (fill != -1e9)  # (the report says when ATen's call runs instead)
    assert "run again where its output is not finite" in kernels[0].decision  # (ATen's call)
    for where in ("none", "+inf behind the mask", "-inf before it"):
        qq, kk = q.clone(), k.clone()
        if where == "+inf behind the mask":
            kk[0, 1, 39, 2] = float("inf")  # (the last key: only the last query attends it)
        elif where == "-inf before it":  # (the key's one query sees -inf, the others' +inf
            kk[0, 1, 39, 2] = -float("inf")  # meets the fill: NaN; a select and the skipped
            qq[0, 1, :, 2] = -qq[0, 1, :, 2].abs()  # keys of the kernel leave every row
            qq[0, 1, 39, 2] = 1.0  # finite, the library's answer is the graph's)
        want = model(qq, kk, v)
        got = compiled(qq, kk, v)
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_the_run_time_test_is_timed_and_keyed_with_the_kernel(kernel_options: Options) -> None:
    """The kernel that skips an added causal mask's keys carries its test of the operands:
    the decision's key names it (by name: the same in every process), so the time of a
    kernel without it is not taken for it, and the runner it is timed with calls it."""
    from kiln.kernels.attention import attention_candidate, attention_groups
    from kiln.kernels.decide import decision_key
    from kiln.kernels.outcome import Built
    from kiln.kernels.validate import random_operands, runner

    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(3))
    compiled = kiln.compile(_ExportedCausal(40, -float("inf")).eval(), (q, k, v), kernel_options)
    graph = compiled.report.graphs[0].details.optimized
    group = attention_groups(graph)[0]
    first, again = (attention_candidate(graph, group, kernel_options) for _ in range(2))
    assert isinstance(first, Built) and isinstance(again, Built) and first.run_if is not None
    assert decision_key(first) == decision_key(again)
    assert decision_key(first) != decision_key(dataclasses.replace(first, run_if=None))
    tested = []
    test, positions = first.run_if
    counted = dataclasses.replace(first, run_if=(lambda *xs: tested.append(len(xs)) or
                                                 test(*xs), positions))
    operands = random_operands(graph, group, {})
    runner(graph, counted, operands, [torch.empty(1, 2, 40, 16)])()
    assert tested == [3]


def test_a_decision_over_the_call_is_keyed_with_kiln_s_library_ops(kernel_options: Options,
                                                                   monkeypatch) -> None:
    """The kernel competes with kiln's own attention call (`kiln.ir.fused`), whose speed is
    kiln's: its decision's key holds that module's source, so another version of it is
    timed anew, not read from the cache."""
    import hashlib
    from pathlib import Path

    import kiln.kernels.decide as decide
    from kiln.ir import fused
    from kiln.kernels.attention import attention_candidate, attention_groups

    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(3))
    compiled = kiln.compile(_ExportedCausal(40, -float("inf")).eval(), (q, k, v), kernel_options)
    graph = compiled.report.graphs[0].details.optimized
    built = attention_candidate(graph, attention_groups(graph)[0], kernel_options)
    assert decide.kiln_library() == hashlib.sha256(Path(fused.__file__).read_bytes()).hexdigest()
    key = decide.decision_key(built)
    monkeypatch.setattr(decide, "kiln_library", lambda: "another version")
    assert decide.decision_key(built) != key


@pytest.mark.parametrize("case", ["bool", "-inf", "finfo.min", "one key fewer", "NaN",
                                  "-1e30", "more keys", "a zero above"])
def test_which_constant_masks_are_causal(case: str) -> None:
    """Exactly causal (each query attends its key and those before it), over as many keys
    as queries: a bool mask selects, a float one adds with -inf or at most -1e35 after the
    diagonal and exactly 0 up to it. Anything else stays a mask."""
    from kiln.ir.builder import GraphBuilder
    from kiln.ir.types import DType, TensorType
    from kiln.kernels.attention import AttentionCall, _causal_constant

    n, keys = 6, 7 if case == "more keys" else 6
    tril = torch.ones(n, keys, dtype=torch.bool).tril()
    fill = {"-inf": -float("inf"), "-1e30": -1e30}.get(case, torch.finfo(torch.float32).min)
    mask = tril.clone() if case == "bool" else torch.zeros(n, keys).masked_fill(~tril, fill)
    if case == "one key fewer":
        mask[3, 1] = fill
    elif case == "NaN":
        mask[4, 1] = float("nan")
    elif case == "a zero above":
        mask[1, 5] = 0.0
    b = GraphBuilder()
    q = b.input("q", TensorType((1, 2, n, 8), DType.F32))
    k = b.input("k", TensorType((1, 2, keys, 8), DType.F32))
    m = b.constant("mask", mask[None, None])
    graph = b.build(q)
    kind = _causal_constant(graph, AttentionCall(q, k, k, m, 0.5))
    assert kind == {"bool": "selects", "-inf": "adds", "finfo.min": "adds"}.get(case)


def test_a_mask_made_at_run_time_runs_generated(kernel_options: Options) -> None:
    """A bool mask the model computes from its inputs ([B, H, L, 1]: some queries see no
    key) runs in the generated kernel; those rows get ATen's answer (the library runs again
    where the kernel's output is not finite), the others the kernel's."""
    class Masked(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=q.sum(-1, keepdim=True) > 0)

    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=gen) for _ in range(3))
    compiled = kiln.compile(Masked(), (q, k, v), kernel_options)
    assert any("kiln_attention" in (k_.source or "") for k_ in compiled.report.kernels)
    want = Masked()(q, k, v)
    assert (q.sum(-1) <= 0).any() and (q.sum(-1) > 0).any()  # (both kinds of row)
    torch.testing.assert_close(compiled(q, k, v), want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_the_report_says_why_an_attention_call_keeps_atens_kernel(
        kernel_options: Options) -> None:
    """A call the generated kernel refuses (float64 operands here) stays ATen's, and the
    report's decision for it names the reason, once."""
    class Double(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v)

    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 9, 32, generator=gen, dtype=torch.float64) for _ in range(3))
    compiled = kiln.compile(Double(), (q, k, v), kernel_options)
    (call,) = [k_ for k_ in compiled.report.kernels if k_.ops == ("call",)]
    assert call.kind == "library"
    assert call.decision == "not lowerable: not 4-d float32 operands"
    torch.testing.assert_close(compiled(q, k, v), Double()(q, k, v))


class _RandomSdpa(nn.Module):
    """ATen's fused attention on the graph's inputs: ``mask`` is None, a bool or float mask
    input of its given shape, or ``is_causal``; ``grouped``: fewer key heads."""

    def __init__(self, mask: str, grouped: bool) -> None:
        super().__init__()
        self.mask, self.grouped = mask, grouped

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                m: torch.Tensor) -> torch.Tensor:
        attn_mask = None if self.mask in ("none", "causal") else m
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              is_causal=self.mask == "causal",
                                              enable_gqa=self.grouped)


@pytest.mark.parametrize("seed", range(8))
def test_random_attention_calls_match_eager(kernel_options: Options, seed: int) -> None:
    """Random sizes (tails everywhere), grouped or not, and a mask drawn from: none, causal,
    a bool or float one computed at run time in any broadcast shape (padding rows of -inf
    included): the generated kernel runs each call, matching eager, NaN rows included."""
    rng = torch.Generator().manual_seed(100 + seed)

    def draw(*options):  # noqa: ANN002, ANN202
        return options[int(torch.randint(len(options), (1,), generator=rng))]

    b, kv = draw(1, 2), draw(1, 2, 3)
    h = kv * (draw(1, 2, 3) if seed % 2 else 1)
    n_q, n_k = int(torch.randint(1, 70, (1,), generator=rng)), int(
        torch.randint(1, 70, (1,), generator=rng))
    e = ev = draw(16, 32, 48, 64)  # (capture writes a call with Ev != E out as its math)
    mask = draw("none", "causal", "bool", "float")
    # (capture writes a call with a 3-d mask out as its math: 4-d or 2-d ones)
    dims = (draw(1, b), draw(1, h), draw(1, n_q), n_k)[draw(0, 2):]
    q = torch.randn(b, h, n_q, e, generator=rng)
    k = torch.randn(b, kv, n_k, e, generator=rng)
    v = torch.randn(b, kv, n_k, ev, generator=rng)
    m = torch.randn(dims, generator=rng)
    if mask == "bool":
        m = m > -1.0
    elif mask == "float":
        m = m.masked_fill(m < -1.5, -float("inf"))
    model = _RandomSdpa(mask, h != kv)
    compiled = kiln.compile(model, (q, k, v, m), kernel_options)
    assert any("kiln_attention" in (k_.source or "") for k_ in compiled.report.kernels), \
        (b, h, kv, n_q, n_k, e, ev, mask, dims)
    want = model(q, k, v, m)
    torch.testing.assert_close(compiled(q, k, v, m), want, rtol=1e-4, atol=1e-5,
                               equal_nan=True)
