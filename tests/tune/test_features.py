"""Program features on programs whose values are known by hand."""

from __future__ import annotations

import math

from kiln.ir.types import DType
from kiln.kernels.gemm_schedule import GemmConfig, gemm_plan
from kiln.tir.nodes import BinOp, PrimFunc
from kiln.tir.schedule import Schedule
from kiln.tir.te import Builder
from kiln.tune.features import FEATURE_NAMES, features


def _named(func: PrimFunc) -> dict[str, float]:
    values = features(func)
    assert len(values) == len(FEATURE_NAMES)
    return dict(zip(FEATURE_NAMES, values))


def _log(x: float) -> float:
    return math.log2(1 + x)


def _add(n: int, m: int) -> PrimFunc:
    b = Builder()
    x = b.buffer("x", (n, m), DType.F32)
    y = b.buffer("y", (n, m), DType.F32)
    out = b.buffer("out", (n, m), DType.F32)
    b.compute("out", out, lambda v: x[v] + y[v])
    return PrimFunc("add", (x, y), (out,), b.body())


def test_an_elementwise_add_has_known_features() -> None:
    sch = Schedule(_add(64, 256))
    i, j = sch.get_loops(sch.get_block("out"))
    j0, j1 = sch.split(j, [None, 16])
    sch.parallel(i)
    sch.vectorize(j1)
    f = _named(sch.func)
    assert f["float_ops"] == _log(64 * 256) and f["stores"] == _log(64 * 256)
    assert f["loads"] == _log(2 * 64 * 256)
    assert f["param_bytes"] == _log(3 * 64 * 256 * 4)
    assert f["parallel_extent"] == _log(64) and f["per_thread_iterations"] == _log(256)
    assert f["vector_lanes"] == _log(16) and f["vector_op_share"] == 1.0
    assert f["depth"] == _log(3) and f["innermost_extent"] == _log(16)
    assert f["local_bytes"] == 0.0
    # each row (1 KiB per buffer) fits in L1 and is read once: traffic = the buffers' bytes
    assert f["traffic_l1"] == _log(3 * 64 * 256 * 4)


def test_a_larger_register_tile_moves_less_data_past_l1() -> None:
    def traffic(mr: int) -> float:
        cfg = GemmConfig(mr=mr, nr=32, kc=256, mc=2 * mr, nc=256)
        return _named(gemm_plan(256, 512, 512, cfg).build())["traffic_l1"]

    assert traffic(14) < traffic(4)


def test_reduction_ops_count_with_the_reduction_loop() -> None:
    b = Builder()
    x = b.buffer("x", (8, 32), DType.F32)
    out = b.buffer("out", (8,), DType.F32)
    b.reduce("out", out, (32,), BinOp.ADD, lambda v, r: x[v[0], r[0]])
    f = _named(PrimFunc("rowsum", (x,), (out,), b.body()))
    assert f["float_ops"] == _log(8 * 32)  # one add per element
    assert f["vector_op_share"] == 0.0 and f["parallel_extent"] == _log(1)
