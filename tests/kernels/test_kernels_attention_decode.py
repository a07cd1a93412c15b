"""The few-queries attention kernel (a decode step's): softmax(Q Kᵀ · c + M) V against the
decomposition with the keys not a multiple of the lanes, strided views, shared key heads,
two batches and the heads-inner output; masks (float and bool, computed at run time or
constant, shared by the heads or not) and causal masking; NaN and ±inf as the
decomposition's; the portable paths; which calls take it; and decode steps through
kiln.compile, a padded batch's among them."""

from __future__ import annotations

import dataclasses
import math
import platform

import pytest
import torch
from torch import nn

import kiln
from kiln.codegen.isa import target_isa
from kiln.codegen.kernel import compile_kernel
from kiln.kernels.attention_decode import (
    DECODE_QUERIES,
    decode_attention_func,
    decode_attention_plan,
    decode_shape,
    decodes,
)
from kiln.kernels.attention_schedule import AttentionShape, RuntimeMask, laid_mask
from kiln.kernels.plan import Recipe
from kiln.options import Options

# (batch, heads, key heads, queries, keys, depth, value depth)
CASES = [
    (1, 12, 12, 1, 128, 64, 64),  # GPT-2's decode step: whole chunks of keys and depth
    (1, 4, 4, 3, 37, 40, 32),  # keys and depth with tails, a few queries
    (2, 8, 2, 1, 20, 16, 16),  # two batches, four query heads a key head
    (1, 2, 2, 15, 5, 8, 48),  # fewer keys than a vector, the most queries it takes
]
IDS = ["x".join(map(str, c)) for c in CASES]


def _operands(case: tuple, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V as views of projections ([B, L, H * E] viewed [B, L, H, E], transposed)."""
    b, h, kv, n_q, n_k, e, ev = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n_q, h * e, generator=gen).view(b, n_q, h, e).transpose(1, 2)
    k = torch.randn(b, n_k, kv * e, generator=gen).view(b, n_k, kv, e).transpose(1, 2)
    v = torch.randn(b, n_k, kv * ev, generator=gen).view(b, n_k, kv, ev).transpose(1, 2)
    return q, k, v


def _shape(case: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           heads_inner: bool = False) -> AttentionShape:
    b, h, kv, n_q, n_k, e, ev = case
    return AttentionShape(b, h, n_q, n_k, e, ev, e ** -0.5, q.stride(), k.stride(), v.stride(),
                          heads_inner=heads_inner, kv_heads=kv if kv != h else 0)


def _decomposed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    repeats = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeats, 1), v.repeat_interleave(repeats, 1)
    return torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v


def _run(kernel, q: torch.Tensor, v: torch.Tensor, k: torch.Tensor,  # noqa: ANN001
         heads_inner: bool = False) -> torch.Tensor:
    b, h, n_q, _ = q.shape
    out = torch.empty(b, n_q, h, v.shape[-1]) if heads_inner else \
        torch.empty(b, h, n_q, v.shape[-1])
    kernel(q, k, v, out)
    return out.transpose(1, 2) if heads_inner else out


@pytest.fixture(scope="module")
def built(kernel_options: Options) -> dict:
    kernels = {}
    for i, case in enumerate(CASES):
        q, k, v = _operands(case, seed=i)
        shape = _shape(case, q, k, v)
        plan = decode_attention_plan(shape, f"decode_test_{i}")
        kernels[case] = ((q, k, v), shape, plan, compile_kernel(plan.build(), kernel_options))
    return kernels


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decode_attention_matches_the_decomposition(built: dict, case: tuple) -> None:
    """Within rounding of the decomposition in float64; the plan replays."""
    (q, k, v), shape, plan, kernel = built[case]
    got = _run(kernel, q, v, k)
    want = _decomposed(q.double(), k.double(), v.double(), shape.scale)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=2e-6)
    assert plan.recipe is Recipe.ATTENTION
    assert plan.replayed() == plan.build()  # the trace is the shipped kernel


def test_the_heads_inner_output(kernel_options: Options) -> None:
    """Written [B, L, H, Ev], as the model's transpose before its reshape reads it."""
    case = CASES[1]
    q, k, v = _operands(case, seed=7)
    shape = _shape(case, q, k, v, heads_inner=True)
    kernel = compile_kernel(decode_attention_plan(shape, "decode_test_inner").build(),
                            kernel_options)
    got = _run(kernel, q, v, k, heads_inner=True)
    torch.testing.assert_close(got, _decomposed(q, k, v, shape.scale), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("where", ["q_nan", "k_inf", "v_nan", "v_inf", "large_scores"])
def test_decode_attention_non_finite_as_the_decomposition(built: dict, where: str) -> None:
    """A NaN query makes its row NaN; an infinite key inf - inf = NaN; NaN and inf values
    reach the rows that weigh them; scores that overflow when scaled give the
    decomposition's NaNs (the lane partials' maxima keep a NaN)."""
    case = CASES[1]
    (q, k, v), shape, _, kernel = built[case]
    q, k, v = q.clone(), k.clone(), v.clone()
    if where == "q_nan":
        q[0, 1, 2, 3] = float("nan")
    elif where == "k_inf":
        k[0, 2, 33, 0] = float("inf")
    elif where == "v_nan":
        v[0, 3, 36, 5] = float("nan")
    elif where == "v_inf":
        v[0, 0, 2, 31] = -float("inf")
    else:  # one product a score: the same overflow in any order
        q[0, 3, 1] = 0.0
        q[0, 3, 1, 0] = 3e38
    got = _run(kernel, q, v, k)
    want = _decomposed(q, k, v, shape.scale)
    assert torch.equal(got.isnan(), want.isnan())
    assert got.isnan().any() or where == "v_inf"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_decode_attention_portable_paths(kernel_options: Options, march: str) -> None:
    """Compiled for AVX2 and for plain SSE2: the same results."""
    options = dataclasses.replace(kernel_options, c_flags=("-O3", f"-march={march}", "-fopenmp"))
    case = CASES[2]
    q, k, v = _operands(case, seed=3)
    shape = _shape(case, q, k, v)
    label = target_isa(options).label
    kernel = compile_kernel(decode_attention_plan(shape, f"decode_test_{label}").build(), options)
    torch.testing.assert_close(_run(kernel, q, v, k), _decomposed(q, k, v, shape.scale),
                               rtol=1e-5, atol=2e-6)


def test_which_calls_take_it() -> None:
    """Fewer than DECODE_QUERIES queries, with a mask or causal masking or neither."""
    base = AttentionShape(1, 4, 1, 64, 64, 64, 0.125)
    assert decodes(base)
    assert decodes(dataclasses.replace(base, queries=DECODE_QUERIES - 1))
    assert not decodes(dataclasses.replace(base, queries=DECODE_QUERIES))
    assert decodes(dataclasses.replace(base, mask=(1, 1)))
    runtime = RuntimeMask((1, 1, 1, 64), (64, 64, 64, 1))
    assert decodes(dataclasses.replace(base, mask=(1, 1), runtime_mask=runtime))
    assert decodes(dataclasses.replace(base, causal=True))


# (name, the mask's dims, bool): a padded batch's key mask shared by the heads, a bool one
# per query, one per head and query (read through a transposed view), and a constant one
MASKS = [("padding", (2, 1, 1, 37), False), ("bool_queries", (2, 1, 3, 37), True),
         ("per_head", (1, 4, 3, 37), False), ("constant", (4, 3, 37), False)]


def _mask(dims: tuple, boolean: bool, gen: torch.Generator) -> torch.Tensor:
    if boolean:
        mask = torch.rand(dims, generator=gen) > 0.3
        mask[..., 5] = True  # (every query attends a key: no row all -inf)
        return mask
    mask = torch.randn(dims, generator=gen)
    mask[..., :4] = -math.inf  # (a padded batch's first keys)
    if len(dims) == 4 and dims[1] > 1:  # (a view, the keys not innermost in memory)
        mask = mask.transpose(-1, -2).contiguous().transpose(-1, -2)
    return mask


def _additive(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, -math.inf)
    return mask.double()


@pytest.mark.parametrize("name,dims,boolean", MASKS, ids=[m[0] for m in MASKS])
def test_masked_decode_attention_matches_the_decomposition(
        kernel_options: Options, name: str, dims: tuple, boolean: bool) -> None:
    """Scaled scores plus the mask, read where it lies (a constant one as `decode_shape`
    lays it out), against the float64 decomposition; the plan replays."""
    case = (2, 4, 4, 3, 37, 40, 32)
    b, h, _, n_q, n_k, e, _ = case
    q, k, v = _operands(case, seed=11)
    mask = _mask(dims, boolean, torch.Generator().manual_seed(12))
    full = (1,) * (4 - len(dims)) + dims
    shape = dataclasses.replace(_shape(case, q, k, v), mask=(b if full[0] > 1 else 1,
                                                              h if full[1] > 1 else 1))
    if name == "constant":
        shape = decode_shape(shape)
        operand = laid_mask(mask, b, h, n_q, n_k).contiguous()
        assert shape.runtime_mask is not None and shape.mask_panel == 0
    else:
        shape = dataclasses.replace(shape, runtime_mask=RuntimeMask(dims, mask.stride(),
                                                                    boolean))
        operand = mask.view(torch.uint8) if boolean else mask
    plan = decode_attention_plan(shape, f"decode_test_mask_{name}")
    kernel = compile_kernel(plan.build(), kernel_options)
    out = torch.empty(b, h, n_q, v.shape[-1])
    kernel(q, k, v, operand, out)
    scores = q.double() @ k.double().transpose(-1, -2) * shape.scale + _additive(mask)
    want = torch.softmax(scores, -1) @ v.double()
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=2e-6)
    assert plan.replayed() == plan.build()


def test_causal_decode_attention_matches_the_decomposition(kernel_options: Options) -> None:
    """is_causal over more keys than queries, as ATen's: query i attends keys 0..i."""
    case = CASES[1]
    q, k, v = _operands(case, seed=13)
    shape = dataclasses.replace(_shape(case, q, k, v), causal=True)
    kernel = compile_kernel(decode_attention_plan(shape, "decode_test_causal").build(),
                            kernel_options)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            is_causal=True)
    torch.testing.assert_close(_run(kernel, q, v, k), want.float(), rtol=1e-5, atol=2e-6)


def test_a_row_masked_whole_is_nan_as_the_decomposition(kernel_options: Options) -> None:
    """Every key masked (-inf): the decomposition's maximum is -inf and its row NaN; the
    other rows are untouched."""
    case = (2, 4, 4, 1, 37, 40, 32)
    q, k, v = _operands(case, seed=14)
    mask = torch.zeros(2, 1, 1, 37)
    mask[1] = -math.inf
    shape = dataclasses.replace(_shape(case, q, k, v), mask=(2, 1),
                                runtime_mask=RuntimeMask(tuple(mask.shape), mask.stride()))
    kernel = compile_kernel(decode_attention_plan(shape, "decode_test_all_masked").build(),
                            kernel_options)
    out = torch.empty(2, 4, 1, 32)
    kernel(q, k, v, mask, out)
    want = torch.softmax(q @ k.transpose(-1, -2) * shape.scale + mask, -1) @ v
    assert out[1].isnan().all() and want[1].isnan().all()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6, equal_nan=True)


def test_a_constant_mask_needs_its_layout() -> None:
    """A constant mask the shape does not say how to read is refused with the fix named."""
    shape = AttentionShape(1, 4, 1, 64, 64, 64, 0.125, mask=(1, 1))
    with pytest.raises(ValueError, match="decode_shape"):
        decode_attention_func(shape)


class _DecodeStep(nn.Module):
    """One new token's attention over a cache: the new key and value joined to it, as a
    decode step computes them (eager attention: the decomposition)."""

    def forward(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                k_past: torch.Tensor, v_past: torch.Tensor) -> torch.Tensor:
        k = torch.cat([k_past, k_new], 2)
        v = torch.cat([v_past, v_new], 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(1, 1, -1)


def test_a_decode_step_runs_the_few_queries_kernel(kernel_options: Options) -> None:
    gen = torch.Generator().manual_seed(5)
    q, k_new, v_new = (torch.randn(1, 6, 1, 32, generator=gen) for _ in range(3))
    k_past, v_past = (torch.randn(1, 6, 40, 32, generator=gen) for _ in range(2))
    inputs = (q, k_new, v_new, k_past, v_past)
    model = _DecodeStep()
    compiled = kiln.compile(model, inputs, kernel_options)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)
    names = [k.source for k in compiled.report.kernels if k.kind == "generated"]
    assert any("kiln_attention_decode_6x1x41x32" in (s or "") for s in names)


def test_the_tuner_leaves_a_decode_step_alone(kernel_options: Options) -> None:
    """Its kernel has no tuning space: no attention workload for `kiln tune`; 16 queries
    (the query-block kernel) have one."""
    from kiln.tune.space_attention import AttentionSpace
    from kiln.tune.workloads import model_workloads

    class Attention(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            scores = torch.matmul(q, k.transpose(-1, -2)) * 0.25
            return torch.matmul(torch.softmax(scores, -1), v)

    for queries, tuned in ((1, False), (DECODE_QUERIES, True)):
        q, k, v = torch.randn(1, 2, queries, 16), torch.randn(1, 2, 24, 16), \
            torch.randn(1, 2, 24, 16)
        spaces = [w.space for w in model_workloads(Attention(), (q, k, v), kernel_options)]
        assert any(isinstance(s, AttentionSpace) for s in spaces) == tuned


class _PaddedDecodeStep(nn.Module):
    """A padded batch's decode step, as Hugging Face's attention runs it: SDPA with the
    keys' padding mask (bool, or float from the 0/1 attention mask) and heads-inner output."""

    def __init__(self, boolean: bool) -> None:
        super().__init__()
        self.boolean = boolean

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        if self.boolean:
            mask = attention_mask[:, None, None, :].bool()
        else:
            mask = (1.0 - attention_mask[:, None, None, :]) * torch.finfo(torch.float32).min
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


class _BiasedDecodeStep(nn.Module):
    """A constant per-head bias over the keys (a relative position bias), two queries."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.randn(1, 6, 2, 41, generator=torch.Generator()
                                                 .manual_seed(3)))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)


@pytest.mark.parametrize("model", ["bool", "float", "constant", "causal"])
def test_masked_decode_steps_run_the_few_queries_kernel(kernel_options: Options,
                                                        model: str) -> None:
    """Through kiln.compile: a padded batch (its second row's first 7 keys padding, bool
    and float masks), a constant bias, is_causal; eager's answers, and the kernel ran."""
    gen = torch.Generator().manual_seed(6)
    queries = 1 if model in ("bool", "float") else 2
    q = torch.randn(2, 6, queries, 32, generator=gen)
    k, v = (torch.randn(2, 6, 41, 32, generator=gen) for _ in range(2))
    if model in ("bool", "float"):
        attention_mask = torch.ones(2, 41)
        attention_mask[1, :7] = 0
        module: nn.Module = _PaddedDecodeStep(model == "bool")
        inputs: tuple = (q, k, v, attention_mask)
    elif model == "constant":
        module, inputs = _BiasedDecodeStep(), (q, k, v)
    else:
        module = _CausalStep()
        inputs = (q, k, v)
    compiled = kiln.compile(module, inputs, dataclasses.replace(kernel_options, strict=True))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), module(*inputs), rtol=1e-5, atol=1e-6)
    sources = " ".join(k.source or "" for k in compiled.report.kernels if k.kind == "generated")
    assert f"kiln_attention_decode_12x{queries}x41x32" in sources


class _CausalStep(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
