"""Design spaces: the heuristic is one point, decisions live in the trace, and a record's
decisions rebuild the identical kernel."""

from __future__ import annotations

import random

import pytest
import torch

from kiln.codegen.isa import Isa
from kiln.ir.ops import Op
from kiln.kernels.gemm_schedule import SERIAL_MACS, GemmConfig, default_gemm_config, gemm_plan
from kiln.kernels.plan import Epilogue, Serial
from kiln.tir.printer import print_func
from kiln.tir.trace import Trace
from kiln.tune.space import GemmSpace, neighbours, random_point, repair


@pytest.mark.parametrize("isa", [Isa.AVX512, Isa.AVX2, Isa.SCALAR])
@pytest.mark.parametrize("shape, packed", [((128, 768, 3072), True), ((7, 15, 129), False),
                                           ((197, 3072, 768), True)])
def test_the_heuristic_schedule_is_the_default_point(isa: Isa, shape: tuple[int, int, int],
                                                     packed: bool) -> None:
    m, n, k = shape
    space = GemmSpace.for_shape(m, n, k, isa=isa, threads=2, b_prepacked=packed)
    heuristic = default_gemm_config(m, n, k, threads=2, base=GemmConfig.for_isa(isa),
                                    b_prepacked=packed)
    expected = gemm_plan(m, n, k, heuristic, b_prepacked=packed)
    if m * n * k < SERIAL_MACS:  # as kiln.kernels.gemm compiles it: one thread
        expected = expected.with_post(Serial(f"fewer than {SERIAL_MACS} multiply-adds"))
    assert print_func(space.plan(space.default()).build()) == print_func(expected.build())


def test_decisions_are_read_back_from_the_trace_and_rebuild_the_kernel() -> None:
    space = GemmSpace.for_shape(128, 3072, 768, b_prepacked=True, bias=True)
    point = random_point(space, random.Random(3))
    plan = space.plan(point)
    saved = Trace.from_json(plan.trace.to_json())  # as the tuning database keeps it
    assert saved.decisions() == point
    rebuilt = space.plan(saved.decisions())
    assert rebuilt.trace.to_json() == plan.trace.to_json()
    assert print_func(rebuilt.build()) == print_func(plan.build())
    assert "sch.sample_categorical('mr'" in plan.as_python()


def test_neighbours_differ_in_one_decision_and_stay_in_the_space() -> None:
    space = GemmSpace.for_shape(128, 768, 768, b_prepacked=True)
    point = space.default()
    found = list(neighbours(space, point))
    assert found and point not in found
    for other in found:
        assert repair(space, other) == other
        changed = [n for n in space.names() if other[n] != point[n]]
        assert changed, other
    # MR is limited by the registers the tile's columns leave: 32 zmm, NR = 2 vectors
    assert max(space.candidates("mr", {"nr": 32})) == 14
    assert max(space.candidates("mr", {"nr": 16})) > 14


def test_an_epilogue_keeps_one_k_block_and_a_point_outside_is_refused() -> None:
    space = GemmSpace.for_shape(64, 96, 300, b_prepacked=True,
                                epilogue=Epilogue(Op.RELU))
    assert space.candidates("kc", space.default()) == (300,)
    with pytest.raises(ValueError, match="kc"):
        space.config({**space.default(), "kc": 128})


def test_the_epilogue_is_part_of_the_workload() -> None:
    plain = GemmSpace.for_shape(128, 3072, 768, bias=True, b_prepacked=True)
    gelu = GemmSpace.for_shape(128, 3072, 768, bias=True, b_prepacked=True,
                               epilogue=Epilogue(Op.GELU, ("none",)))
    relu = GemmSpace.for_shape(128, 3072, 768, bias=True, b_prepacked=True,
                               epilogue=Epilogue(Op.RELU))
    assert len({plain.workload(), gelu.workload(), relu.workload()}) == 3
    assert gelu.workload() == GemmSpace.for_shape(128, 3072, 768, bias=True, b_prepacked=True,
                                                  epilogue=Epilogue(Op.GELU, ("none",))
                                                  ).workload()


def test_a_batched_gemm_space_keeps_one_k_block_and_its_strides() -> None:
    """bmm: the heuristic (one thread per batch) is the default point, every point has one K
    block, the strides are in the workload, and a random point computes torch.bmm on
    operands with those strides."""
    strides = ((12, 96, 1), (12, 1, 96))  # a head of a projection, a transposed key
    space = GemmSpace.for_shape(6, 6, 12, batch=8, a_strides=strides[0], b_strides=strides[1])
    heuristic = default_gemm_config(6, 6, 12, threads=1, base=GemmConfig.for_isa(Isa.AVX512))
    assert space.config(space.default()) == heuristic
    assert space.candidates("kc", space.default()) == (12,)
    assert space.workload() != GemmSpace.for_shape(6, 6, 12, batch=8).workload()
    point = random_point(space, random.Random(5))
    plan = space.plan(point)
    assert "batch=8" in plan.notes and plan.trace.decisions() == point
    operands, (expected,) = space.operands(point, torch.Generator().manual_seed(0))
    assert operands[0].stride() == strides[0] and operands[1].stride() == strides[1]
    torch.testing.assert_close(torch.bmm(operands[0], operands[1]), expected)
    from kiln.tir import interp
    (got,) = interp.run_torch(plan.build(), operands[:2])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_residual_and_its_row_bias_are_in_the_workload_and_the_operands() -> None:
    """The GEMM that adds a residual's bias row in its init: another workload than the
    residual alone, operands (A, B, residual, row) and a program that computes addmm(r + b)."""
    space = GemmSpace.for_shape(20, 40, 12, bias=True, bias_matrix=True, bias_row=True,
                                b_prepacked=True)
    alone = GemmSpace.for_shape(20, 40, 12, bias=True, bias_matrix=True, b_prepacked=True)
    assert space.workload() != alone.workload()
    point = random_point(space, random.Random(3))
    plan = space.plan(point)
    assert "bias_row=True" in plan.notes
    operands, (expected,) = space.operands(point, torch.Generator().manual_seed(0))
    assert [tuple(t.shape) for t in operands[2:]] == [(20, 40), (40,), (20, 40)]
    from kiln.tir import interp
    (got,) = interp.run_torch(plan.build(), operands[:4])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_batched_gemm_is_measured_on_its_strided_operands(tmp_path) -> None:  # noqa: ANN001
    """The tuner's runner passes a bmm's operands with the strides its kernel reads (made
    contiguous, a head's view would be read wrongly: every candidate failed its check)."""
    import dataclasses as dc

    from kiln.options import Options
    from kiln.tune.measure import time_one

    space = GemmSpace.for_shape(6, 6, 12, batch=3, a_strides=(12, 72, 1),
                                b_strides=(12, 1, 72))
    assert space.strided_operands == (0, 1)
    assert GemmSpace.for_shape(6, 6, 12, batch=3).strided_operands == ()
    result = time_one(dc.replace(space, name="bmm_measured"), space.default(),
                      Options(kernel_cache_dir=str(tmp_path), measure_kernels=False), 1, 0.2)
    assert result.error is None and result.run_times


def test_a_short_n_may_take_a_register_tile_as_wide_as_n(options) -> None:  # noqa: ANN001
    """N = 96 on AVX-512: tiles of 1 to 6 vectors (4 rows at most for 6: 24 accumulators, 6
    vectors of B, a broadcast); AVX2 stops at 5 (two rows must fit its 16 registers); a
    narrower N at the vectors that cover it. The widest tile on this machine computes what
    torch does."""
    import dataclasses as dc

    from kiln.codegen.isa import target_isa
    from kiln.tune.measure import time_one

    space = GemmSpace.for_shape(200, 96, 16, b_prepacked=True, bias=True)
    assert space.candidates("nr", space.default()) == (16, 32, 48, 64, 80, 96)
    assert space.candidates("mr", {"nr": 96}) == (2, 4)
    avx2 = GemmSpace.for_shape(200, 96, 16, isa=Isa.AVX2, b_prepacked=True)
    assert avx2.candidates("nr", avx2.default()) == (8, 16, 24, 32, 40)
    assert avx2.candidates("mr", {"nr": 40}) == (2,)
    narrow = GemmSpace.for_shape(200, 40, 16, b_prepacked=True)
    assert narrow.candidates("nr", narrow.default()) == (16, 32, 48)
    host = GemmSpace.for_shape(200, 96, 16, isa=target_isa(options), b_prepacked=True,
                               bias=True)
    widest = max(host.candidates("nr", host.default()))
    point = repair(host, {**host.default(), "nr": widest, "mr": 4, "nc_panels": 1})
    assert point["nr"] == widest and point["nr"] > 2 * target_isa(options).f32_lanes
    result = time_one(dc.replace(host, name="gemm_wide_tile"), point, options, 1, 0.1)
    assert result.error is None and result.run_times
