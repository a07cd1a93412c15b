"""The design space of the generated attention: the heuristic is the default point, points
replay from their traces and compute the decomposition (strided views, a mask), candidates
respect the registers and the block, the runner measures them, and a compile uses a recorded
point."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from torch import nn

import kiln
from kiln.codegen.isa import Isa
from kiln.kernels.attention_schedule import (
    AttentionShape,
    RuntimeMask,
    attention_plan,
    default_attention_config,
)
from kiln.tir import interp
from kiln.tir.printer import print_func
from kiln.tune.db import Target, TuningDB, TuningRecord
from kiln.tune.space import neighbours, random_point
from kiln.tune.space_attention import AttentionSpace
from kiln.tune.workloads import model_workloads

# heads split out of [B, L, H * E] projections: Q, K, V are transposed views
B, H, L, S, E = 1, 2, 21, 19, 16
STRIDES = (L * H * E, E, H * E, 1), (S * H * E, E, H * E, 1), (S * H * E, E, H * E, 1)
SHAPE = AttentionShape(B, H, L, S, E, E, 0.25, *STRIDES)
MASKED = AttentionShape(B, H, L, S, E, E, 0.25, *STRIDES, mask=(1, H))
# the constant laid out as compiled: in panels of the default block (other points' blocks
# read it through a division)
PANELS = AttentionShape(B, H, L, S, E, E, 0.25, *STRIDES, mask=(1, H), mask_panel=32)
# masks made at run time: a float one per head, a bool padding mask expanded over queries
RUNTIME = AttentionShape(B, H, L, S, E, E, 0.25, *STRIDES, mask=(1, H),
                         runtime_mask=RuntimeMask((B, H, L, S), (H * L * S, L * S, S, 1)))
PADDING = AttentionShape(B, H, L, S, E, E, 0.25, *STRIDES, mask=(1, 1),
                         runtime_mask=RuntimeMask((B, 1, L, S), (S, S, 0, 1), boolean=True))
# causal (GPT-2's, Llama's): over as many keys as queries each block stops at the diagonal;
# over more keys (a prompt after a cache) query i still sees keys 0..i, as ATen's is_causal
SQUARE = ((L * H * E, E, H * E, 1),) * 3
CAUSAL = AttentionShape(B, H, L, L, E, E, 0.25, *SQUARE, causal=True)
WIDE = ((S + L) * H * E, E, H * E, 1)
CAUSAL_WIDE = AttentionShape(B, H, L, S + L, E, E, 0.25, STRIDES[0], WIDE, WIDE, causal=True)


def test_the_heuristic_schedule_is_the_default_point() -> None:
    space = AttentionSpace(SHAPE, Isa.AVX512, 2, "aspace")
    heuristic = attention_plan(SHAPE, default_attention_config(Isa.AVX512, E, L), "aspace")
    default = space.plan_config(space.config(space.default()))
    assert print_func(default.build()) == print_func(heuristic.build())


def test_points_replay_from_their_trace_and_compute_the_decomposition() -> None:
    for shape in (SHAPE, MASKED, PANELS, RUNTIME, PADDING, CAUSAL, CAUSAL_WIDE):
        space = AttentionSpace(shape, Isa.AVX512, 2, "aspace")
        rng = random.Random(5)
        for point in [space.default(), *(random_point(space, rng) for _ in range(3))]:
            plan = space.plan(point)
            assert plan.trace.decisions() == point
            operands, (expected,) = space.operands(point, torch.Generator().manual_seed(1))
            assert operands[0].stride() == STRIDES[0]  # (as the kernel reads them)
            if shape.runtime_mask is not None:
                assert operands[3].stride() == shape.runtime_mask.strides
            (got,) = interp.run_torch(plan.build(), operands[:-1])
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        assert all(n != space.default() for n in neighbours(space, space.default()))


def test_candidates_respect_registers_and_the_block() -> None:
    wide = AttentionShape(1, 4, 100, 100, 64, 128, 0.125)  # 8 vectors of V a row
    space = AttentionSpace(wide, Isa.AVX512, 2)
    assert space.candidates("query_vectors", {}) == (2, 3, 4)
    assert max(space.candidates("key_rows", {"query_vectors": 4})) == 6  # (30 - 4) // 4
    assert space.candidates("value_rows", {"query_vectors": 3}) == (1, 2)  # (30 - 8) // 8
    avx2 = AttentionSpace(SHAPE, Isa.AVX2, 2)
    assert max(avx2.candidates("value_rows", {"query_vectors": 2})) <= 6  # (14 - 2) // 2
    assert all(16 % r == 0 for r in avx2.candidates("value_rows", {"query_vectors": 2}))


def test_the_workload_is_the_program() -> None:
    space = AttentionSpace(SHAPE, Isa.AVX512, 2, "one")
    assert AttentionSpace(SHAPE, Isa.AVX512, 2, "other name").workload() == space.workload()
    assert AttentionSpace(MASKED, Isa.AVX512, 2).workload() != space.workload()
    assert AttentionSpace(RUNTIME, Isa.AVX512, 2).workload() \
        != AttentionSpace(MASKED, Isa.AVX512, 2).workload()
    contiguous = AttentionShape(B, H, L, S, E, E, 0.25)
    assert AttentionSpace(contiguous, Isa.AVX512, 2).workload() != space.workload()


def test_the_runner_measures_a_point(options: kiln.Options) -> None:
    from kiln.tune.measure import time_one

    for shape in (MASKED, PADDING, CAUSAL):
        space = AttentionSpace(shape, Isa.AVX512, 2, "arun")
        result = time_one(space, random_point(space, random.Random(3)), options, threads=1,
                          budget_s=0.05)
        assert result.error is None and result.run_times


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(1, 40, 4, 16).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


def test_a_compile_uses_the_recorded_attention_schedule(tmp_path: Path,
                                                       options: kiln.Options) -> None:
    torch.manual_seed(0)
    model, inputs = _Attention().eval(), (torch.randn(1, 40, 64),)
    (workload,) = [w for w in model_workloads(model, inputs, options)
                   if isinstance(w.space, AttentionSpace)]
    assert workload.label == "attention 4x40x40x16"
    space = workload.space
    point = list(neighbours(space, space.default()))[-1]  # not the heuristic's
    target = Target.here(options, torch.get_num_threads())
    db = TuningDB.open(tmp_path / "t.sqlite")
    db.add(TuningRecord.measured(space.workload(), target, "attention",
                                 space.plan(point).trace.to_json(), point, [1e-6],
                                 paired=0.5))
    tuned = kiln.Options(**{**options.__dict__, "tuning_db": str(tmp_path / "t.sqlite")})
    with torch.no_grad():
        compiled = kiln.compile(model, inputs, options=tuned)
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    (kernel,) = [k for k in compiled.report.kernels if k.nodes[-1:] == workload.nodes]
    assert kernel.decision.startswith("generated (tuned)"), kernel.decision
