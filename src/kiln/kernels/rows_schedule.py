"""The memory-bound fused kernels of a transformer layer: compute definitions (`kiln.tir.te`)
and the row schedule that turns them into fast loop nests, recorded as a replayable Trace.

    kernel = softmax_rows(R, N)     # out[r, :] = softmax(x[r, :])
    kernel.func                     # the scheduled, compacted PrimFunc
    print(kernel.trace.as_python()) # how: split, rfactor, compute_at, vectorize, parallel

    softmax_rows(R, N)       out[r, :] = softmax(x[r, :])
    layernorm_rows(R, N)     out[r, :] = (x - mean) * rsqrt(var + eps) * w + b
    rmsnorm_rows(R, N)       out[r, :] = x * rsqrt(mean(x * x) + eps) * w
    sum_rows(R, N, s)        out[r, 0] = sum(x[r, :]) * s  (a mean: s = 1/N)
    bias_gelu(R, N)          out = gelu(x + bias[None, :])  (erf form)
    add_relu(R, N)           out = relu(x + y)

The row schedule (`schedule_rows`): the output block's row loop runs in parallel; every row
reduction is split by ``LANES`` and rfactored into a local array of lane partials whose lane
loop is vectorized (the rf init decomposed out of the loop); the write-back blocks, the
reductions and every per-row intermediate are computed at the row loop, so a row is read
from memory once and later passes hit L1; every pass over a row is vectorized; the lane
partials are combined in halving vector steps (rfactor again on each write-back). Softmax
is max, exp (stored in a row of scratch) summed in the same chunk loop, and a scale by 1/sum.

Softmax over the last axis of, say, f32[12, 128, 128] is ``softmax_rows(12 * 128, 128)`` on
the same memory. NaN propagates as in torch (max keeps NaN; relu(NaN) is NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kiln.ir.types import DType
from kiln.tir.compact import compact_buffers
from kiln.tir.nodes import (
    Binary,
    BinOp,
    Block,
    CmpOp,
    Const,
    PrimFunc,
    Scope,
    Unary,
    UnOp,
    const,
)
from kiln.tir.primitives.common import find_block
from kiln.tir.schedule import Schedule
from kiln.tir.te import Builder, cmp, select, softmax_exp
from kiln.tir.trace import Trace

__all__ = ["LANES", "RowKernel", "add_relu", "bias_gelu", "layernorm_rows", "rmsnorm_rows",
           "schedule_rows", "softmax_rows", "sum_rows", "tree_combine"]

F32 = DType.F32
LANES = 16  # fp32 lanes of an AVX-512 vector: the width of the partial reductions
# lanes where a row pass also reads bytes (a bool mask): gcc 12 vectorizes a loop that mixes
# u8 and f32 loads only when it has a full 64-byte vector of bytes (64 iterations); at 16 it
# stays scalar (measured: masked softmax 12x128x128 1133 us at 16 lanes, 288 us at 64)
BYTE_LANES = 64


@dataclass(frozen=True)
class RowKernel:
    """A scheduled row kernel: the program, and the trace that made it from ``lowered``."""

    func: PrimFunc
    trace: Trace
    lowered: PrimFunc  # the compute definition before scheduling
    scheduled: PrimFunc | None = None  # the trace applied, before compaction


def _c(value: float) -> Const:
    return const(value, F32)


def softmax_rows(rows: int, n: int, name: str = "softmax", lanes: int = LANES) -> RowKernel:
    """Softmax over the last axis of x: f32[rows, n]."""
    b = Builder()
    x, out = b.buffer("x", (rows, n), F32), b.buffer("out", (rows, n), F32)
    mx = b.temp("row_max", (rows,), F32, Scope.LOCAL)
    e = b.temp("row_exp", (rows, n), F32, Scope.LOCAL)
    s = b.temp("row_sum", (rows,), F32, Scope.LOCAL)
    inv = b.temp("row_inv", (rows,), F32, Scope.LOCAL)
    b.reduce("max", mx, (n,), BinOp.MAX, lambda v, k: x[v[0], k[0]])
    b.compute("exp", e, lambda v: softmax_exp(x[v[0], v[1]] - mx[v[0]]))
    b.reduce("sum", s, (n,), BinOp.ADD, lambda v, k: e[v[0], k[0]])
    b.compute("inv", inv, lambda v: _c(1.0) / s[v[0]])
    b.compute(name, out, lambda v: e[v[0], v[1]] * inv[v[0]])
    return schedule_rows(PrimFunc(name, (x,), (out,), b.body()), lanes)


def layernorm_rows(rows: int, n: int, eps: float = 1e-5, name: str = "layernorm",
                   lanes: int = LANES) -> RowKernel:
    """LayerNorm over the last axis with weight and bias (two-pass mean and variance)."""
    b = Builder()
    x = b.buffer("x", (rows, n), F32)
    w, bias = b.buffer("w", (n,), F32), b.buffer("b", (n,), F32)
    out = b.buffer("out", (rows, n), F32)
    inv_n = _c(1.0 / n if n else 0.0)
    s1 = b.temp("row_sum", (rows,), F32, Scope.LOCAL)
    mean = b.temp("row_mean", (rows,), F32, Scope.LOCAL)
    s2 = b.temp("row_sq", (rows,), F32, Scope.LOCAL)
    rstd = b.temp("row_rstd", (rows,), F32, Scope.LOCAL)

    def dev(v0, k):  # noqa: ANN001, ANN202
        return x[v0, k] - mean[v0]
    # mean = x0 + sum((x - x0)/n), x0 the row's first element: exact for a constant row (as
    # ATen's Welford mean is: with eps = 0 its result is then 0*inf = NaN), and the sum of
    # the (x - x0)/n cannot overflow where the sum of x could
    def shifted(v0, k):  # noqa: ANN001, ANN202
        return (x[v0, k] - x[v0, 0]) * inv_n if n else x[v0, k]
    b.reduce("sum", s1, (n,), BinOp.ADD, lambda v, k: shifted(v[0], k[0]))
    b.compute("mean", mean, lambda v: x[v[0], 0] + s1[v[0]] if n else s1[v[0]])
    b.reduce("sq", s2, (n,), BinOp.ADD, lambda v, k: dev(v[0], k[0]) * dev(v[0], k[0]))
    b.compute("rstd", rstd, lambda v: Unary(UnOp.RSQRT, s2[v[0]] * inv_n + _c(eps)))

    def scaled(v0, k):  # noqa: ANN001, ANN202
        # 0 where the variance overflowed (rstd = 0), as ATen's x*rstd - mean*rstd gives,
        # where (x - mean)*rstd may be inf*0 = NaN
        return select(cmp(CmpOp.EQ, rstd[v0], 0.0), _c(0.0), dev(v0, k) * rstd[v0])
    b.compute(name, out, lambda v: scaled(v[0], v[1]) * w[v[1]] + bias[v[1]])
    return schedule_rows(PrimFunc(name, (x, w, bias), (out,), b.body()), lanes)


def rmsnorm_rows(rows: int, n: int, eps: float = 1e-6, weighted: bool = True,
                 name: str = "rmsnorm", lanes: int = LANES) -> RowKernel:
    """RMSNorm over the last axis, in the order models write it (`kiln.passes.rms_norm`):
    ``(x * rsqrt(sum(x * x) / n + eps)) * w``, the weight left out where ``weighted`` is
    false. The mean divides its sum by n, as ATen's does."""
    b = Builder()
    x = b.buffer("x", (rows, n), F32)
    w = b.buffer("w", (n,), F32) if weighted else None
    out = b.buffer("out", (rows, n), F32)
    s = b.temp("row_sq", (rows,), F32, Scope.LOCAL)
    rstd = b.temp("row_rstd", (rows,), F32, Scope.LOCAL)
    b.reduce("sq", s, (n,), BinOp.ADD, lambda v, k: x[v[0], k[0]] * x[v[0], k[0]])
    b.compute("rstd", rstd, lambda v: Unary(UnOp.RSQRT, s[v[0]] / _c(float(n)) + _c(eps)))

    def scaled(v):  # noqa: ANN001, ANN202
        y = x[v[0], v[1]] * rstd[v[0]]
        return y * w[v[1]] if w is not None else y
    b.compute(name, out, scaled)
    params = (x, w) if w is not None else (x,)
    return schedule_rows(PrimFunc(name, params, (out,), b.body()), lanes)


def sum_rows(rows: int, n: int, scale: float = 1.0, name: str = "sum",
             lanes: int = LANES) -> RowKernel:
    """out[r, 0] = sum(x[r, :]) * scale: a last-axis sum, or a mean with scale = 1/n (as
    ATen's mean scales its sum). RMSNorm's mean of squares over a Llama row is one."""
    b = Builder()
    x, out = b.buffer("x", (rows, n), F32), b.buffer("out", (rows, 1), F32)
    s = b.temp("row_sum", (rows,), F32, Scope.LOCAL)
    b.reduce("sum", s, (n,), BinOp.ADD, lambda v, k: x[v[0], k[0]])
    b.compute(name, out, lambda v: s[v[0]] * _c(scale) if scale != 1.0 else s[v[0]])
    return schedule_rows(PrimFunc(name, (x,), (out,), b.body()), lanes)


def bias_gelu(rows: int, n: int, name: str = "bias_gelu") -> RowKernel:
    """out = gelu(x + bias), gelu(v) = v/2 * (1 + erf(v / sqrt(2)))."""
    b = Builder()
    x, bias = b.buffer("x", (rows, n), F32), b.buffer("bias", (n,), F32)
    out = b.buffer("out", (rows, n), F32)

    def gelu(v):  # noqa: ANN001, ANN202
        h = x[v[0], v[1]] + bias[v[1]]
        return h * _c(0.5) * (Unary(UnOp.ERF, h * _c(1.0 / math.sqrt(2.0))) + _c(1.0))
    b.compute(name, out, gelu)
    return schedule_rows(PrimFunc(name, (x, bias), (out,), b.body()))


def add_relu(rows: int, n: int, name: str = "add_relu") -> RowKernel:
    """out = relu(x + y) = max(x + y, 0), NaN-propagating like torch.relu."""
    b = Builder()
    x, y = b.buffer("x", (rows, n), F32), b.buffer("y", (rows, n), F32)
    out = b.buffer("out", (rows, n), F32)
    b.compute(name, out, lambda v: Binary(BinOp.MAX, x[v[0], v[1]] + y[v[0], v[1]], _c(0.0)))
    return schedule_rows(PrimFunc(name, (x, y), (out,), b.body()))


def schedule_rows(func: PrimFunc, lanes: int = LANES) -> RowKernel:
    """The row schedule for a function whose last block writes the output row by row and
    whose other blocks (row reductions, per-row scalars, row intermediates) feed it, each in
    its own nest with the row loop outermost."""
    sch = Schedule(func)
    blocks = sch.blocks()
    out = blocks[-1]
    reductions = [name for name in blocks[:-1] if _block(sch, name).is_reduction]
    partials: set[str] = set()  # the rf blocks
    for name in reductions:  # lane partials
        reduce_loop = sch.get_loops(name)[-1]
        _, lane = sch.split(reduce_loop, [None, lanes])
        partials.add(sch.rfactor(name, lane).name)
    row, col = sch.get_loops(out)
    producers = [name for name in sch.blocks() if name != out]
    for name in reversed(producers):  # consumers first, so each producer's readers are inside
        sch.compute_at(name, row)
    for prev, name in zip(producers, producers[1:]):
        if name in partials:
            _fuse_pass_into_partials(sch, prev, name)
    vectorized: set[str] = set()
    for name in producers:
        block = _block(sch, name)
        loops = sch.get_loops(name)
        if name in partials:
            init_block = sch.decompose_reduction(name, loops[-2])  # lane init out of the chunks
            init = sch.get_loops(init_block)
            sch.vectorize(init[-1])
            sch.vectorize(loops[-1])
            vectorized.add(loops[-1].name)
        elif block.is_reduction:
            tree_combine(sch, name)
        elif len(loops) > 2 and loops[-1].name not in vectorized:
            sch.vectorize(loops[-1])  # a row pass
    sch.vectorize(col)
    sch.parallel(row)
    return RowKernel(compact_buffers(sch.func), sch.trace, func, sch.func)


def tree_combine(sch: Schedule, name: str) -> None:
    """Fold the lane partials in halving steps, each one vector operation (rfactor on the
    upper half), instead of a chain of scalar steps: 16 -> 8 -> 4 -> 2 -> 1.

        for l in range(16): m = max(m, part[l])   ->   for h in vectorized(8):
                                                          part8[h] = max(part[h], part[8 + h])
                                                        ... for l in range(2): m = max(m, part2[l])
    """
    while True:
        combine = sch.get_loops(name)[-1]
        extent = find_block(sch.func, name).loops[-1].extent
        if extent <= 2 or extent % 2:
            break
        _, half = sch.split(combine, [2, None])
        rf = sch.rfactor(name, half)
        loops = sch.get_loops(rf)
        init = sch.decompose_reduction(rf, loops[-2])
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(loops[-1])
    sch.decompose_reduction(name, sch.get_loops(name)[-1])  # the init out of its loop


def _fuse_pass_into_partials(sch: Schedule, producer: str, rf: str) -> None:
    """A row pass that writes what the next rf block folds (softmax's exp, then its sum)
    runs in the same chunk loop: each 16 values are folded right after they are made.

        for j in range(N): e[j] = ...            for jo in range(N / 16):
        for jo in range(N / 16):          ->       for ji in range(16): e[jo * 16 + ji] = ...
          for l in range(16): s[l] += e[..]        for l in range(16): s[l] += e[jo * 16 + l]
    """
    block = _block(sch, producer)
    loops = find_block(sch.func, producer).loops
    rf_loops = find_block(sch.func, rf).loops
    if block.is_reduction or len(loops) != 3 or len(rf_loops) != 4:
        return
    chunks, lanes = rf_loops[2].extent, rf_loops[3].extent
    if loops[1].extent != rf_loops[1].extent or loops[2].extent != chunks * lanes:
        return
    outer, col = sch.get_loops(producer)[1:]
    jo, _ = sch.split(col, [chunks, lanes])
    rf_outer, rf_jo, _ = sch.get_loops(rf)[1:]
    sch.fusion(outer, rf_outer)
    sch.fusion(jo, rf_jo)  # (the lane loops stay two: each one vector op per chunk)


def _block(sch: Schedule, name: str) -> Block:
    block = find_block(sch.func, name).stmt
    assert isinstance(block, Block)
    return block

