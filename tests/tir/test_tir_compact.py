"""Buffer compaction (kiln.tir.compact): allocations move into the innermost loop that holds
their accesses; under a parallel loop always, so that threads never share a scratch buffer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.kernels.gemm_schedule import GemmConfig, gemm_plan, pack_b
from kiln.tir import interp
from kiln.tir.compact import compact_buffers
from kiln.tir.nodes import Allocate, For, ForKind, Stmt
from kiln.tir.visit import map_stmt


def _enclosing_loops(body: Stmt, name: str, loops: tuple[For, ...] = ()) -> tuple[For, ...] | None:
    """The loops around the allocation of buffer ``name``, outermost first."""
    if isinstance(body, Allocate) and body.buffer.name == name:
        return loops
    if isinstance(body, For):
        loops = (*loops, body)
    for child in getattr(body, "stmts", None) or [getattr(body, "body", None)]:
        if isinstance(child, Stmt):
            found = _enclosing_loops(child, name, loops)
            if found is not None:
                return found
    return None


def test_a_buffer_used_within_one_parallel_iteration_is_allocated_inside_it() -> None:
    """A GEMM split by N over the threads, with one block of rows and one K block: each
    iteration of the parallel loop packs all of A, so compaction cannot shrink A's packed
    buffer; it still moves inside the parallel loop (it stayed outside, shared by the
    threads packing into it at once). The values stay F.linear's."""
    config = GemmConfig(mr=10, nr=32, kc=64, mc=20, nc=32, split_n=True, lanes=16)
    plan = gemm_plan(19, 64, 64, config, b_transposed=True, bias=True, b_prepacked=True)
    func = compact_buffers(plan.scheduled)
    loops = _enclosing_loops(func.body, "A_local")
    assert loops is not None and any(loop.kind.is_parallel for loop in loops)
    torch.manual_seed(0)
    a, w, bias = torch.randn(19, 64), torch.randn(64, 64), torch.randn(64)
    got = interp.run_torch(plan.build(), [a, pack_b(w.t(), config.nr), bias])[0]
    torch.testing.assert_close(got, F.linear(a, w, bias), rtol=1e-5, atol=1e-5)


def test_a_whole_buffer_outside_parallel_loops_stays_where_it_is() -> None:
    """The same program with its parallel loop made serial: A's packed buffer is used whole
    by the one iteration, so it keeps its place at the top (nothing to shrink, no thread to
    keep apart)."""
    config = GemmConfig(mr=10, nr=32, kc=64, mc=20, nc=32, split_n=True, lanes=16)
    plan = gemm_plan(19, 64, 64, config, b_transposed=True, bias=True, b_prepacked=True)

    def serial(s: Stmt) -> Stmt:
        return For(s.var, s.extent, s.body, ForKind.SERIAL) \
            if isinstance(s, For) and s.kind.is_parallel else s

    func = compact_buffers(plan.scheduled.with_body(map_stmt(plan.scheduled.body, serial)))
    assert _enclosing_loops(func.body, "A_local") == ()
