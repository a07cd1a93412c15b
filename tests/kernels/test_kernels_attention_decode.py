"""The few-queries attention kernel (a decode step's): softmax(Q Kᵀ · c) V against the
decomposition with the keys not a multiple of the lanes, strided views, shared key heads,
two batches and the heads-inner output; NaN and ±inf as the decomposition's; the portable
paths; which calls take it; and a decode step through kiln.compile."""

from __future__ import annotations

import dataclasses
import platform

import pytest
import torch
from torch import nn

import kiln
from kiln.codegen.isa import target_isa
from kiln.codegen.kernel import compile_kernel
from kiln.kernels.attention_decode import DECODE_QUERIES, decode_attention_plan, decodes
from kiln.kernels.attention_schedule import AttentionShape, RuntimeMask
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
    """Fewer than DECODE_QUERIES queries, no mask, not causal."""
    base = AttentionShape(1, 4, 1, 64, 64, 64, 0.125)
    assert decodes(base)
    assert decodes(dataclasses.replace(base, queries=DECODE_QUERIES - 1))
    assert not decodes(dataclasses.replace(base, queries=DECODE_QUERIES))
    assert not decodes(dataclasses.replace(base, mask=(1, 1)))
    runtime = RuntimeMask((1, 1, 1, 64), (64, 64, 64, 1))
    assert not decodes(dataclasses.replace(base, mask=(1, 1), runtime_mask=runtime))
    assert not decodes(dataclasses.replace(base, causal=True))


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
