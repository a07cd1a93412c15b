"""kiln.tir.scratch: a row pass's last chunk stores its whole scratch vector (no masked vector
store), the same values in the interpreter and in C; a store that could leave its buffer, or
that writes an output, keeps its guard."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.kernels import rows_schedule
from kiln.kernels.plan import VersionTails
from kiln.options import Options
from kiln.tir import interp
from kiln.tir.nodes import Block, BufferStore, For, ForKind, PrimFunc, Select
from kiln.tir.scratch import unmask_scratch_stores
from kiln.tir.visit import iter_exprs, iter_stmts


def _selects(func: PrimFunc) -> int:
    """The selects in the values ``func`` stores."""
    return sum(isinstance(e, Select) for s in iter_stmts(func.body)
               if isinstance(s, BufferStore) for e in iter_exprs(s.value))


def _guarded_stores(func: PrimFunc) -> dict[str, int]:
    """Guarded blocks by the buffer they store."""
    found: dict[str, int] = {}
    for b in iter_stmts(func.body):
        if isinstance(b, Block) and b.predicate is not None:
            for st in iter_stmts(b.body):
                if isinstance(st, BufferStore):
                    found[st.buffer.name] = found.get(st.buffer.name, 0) + 1
    return found


@pytest.mark.parametrize("kind,n", [("softmax", 197), ("softmax", 37), ("layernorm", 37),
                                    ("rmsnorm", 45)])
def test_a_rows_last_chunk_stores_its_whole_scratch_vector(options: Options, kind: str,
                                                            n: int) -> None:
    """The last chunk's store into the row's scratch (softmax's exponentials) is no longer a
    masked vector store: it stores the whole vector, the guard moved into the value; stores
    of the output stay guarded; the interpreter gives the guarded program's values bit for
    bit, and the C kernel the interpreter's, NaN, infinities and -0.0 in the rows included."""
    build = {"softmax": rows_schedule.softmax_rows, "layernorm": rows_schedule.layernorm_rows,
             "rmsnorm": rows_schedule.rmsnorm_rows}[kind]
    func = build(6, n).func
    serial = tuple(s.var.name for s in iter_stmts(func.body)
                   if isinstance(s, For) and s.kind is ForKind.SERIAL)
    versioned = VersionTails(serial).apply(func)
    unmasked = unmask_scratch_stores(versioned)
    before, after = _guarded_stores(versioned), _guarded_stores(unmasked)
    assert "out" not in before or after.get("out") == before["out"]
    if kind == "softmax":
        assert before.get("row_exp") and "row_exp" not in after
        assert _selects(unmasked) > _selects(versioned)
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=gen) * 3
    x[1, 3], x[2, n - 1], x[3, 0], x[4, 5] = math.nan, math.inf, -math.inf, -0.0
    params = {"softmax": 0, "rmsnorm": 1, "layernorm": 2}[kind]
    args = (x, *(torch.randn(n, generator=gen) for _ in range(params)))
    interpreted = []
    for f in (versioned, unmasked):
        (got,) = interp.run_torch(f, list(args))
        interpreted.append(got)
        kernel = compile_kernel(f, options)
        assert isinstance(kernel, CompiledKernel)
        out = torch.full((6, n), math.nan)
        kernel(*args, out)
        # (the C compiler may contract a multiply-add: layer norm's and RMSNorm's squares)
        torch.testing.assert_close(out, got, equal_nan=True, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(interpreted[1], interpreted[0], equal_nan=True, rtol=0, atol=0)


def test_a_store_that_could_leave_its_scratch_or_into_a_parameter_stays_guarded() -> None:
    """A scratch row allocated without padding (its last chunk would reach past it: 37
    elements in chunks of 16), or an output: the guard stays, as the masked store is then
    what keeps the store inside."""
    from kiln.ir.types import DType
    from kiln.tir.nodes import Scope, Unary, UnOp, const
    from kiln.tir.schedule import Schedule
    from kiln.tir.te import Builder

    b = Builder()
    x, out = b.buffer("x", (37,), DType.F32), b.buffer("out", (37,), DType.F32)
    t = b.temp("t", (37,), DType.F32, Scope.LOCAL)
    b.compute("t", t, lambda v: Unary(UnOp.EXP, x[v[0]]))
    b.compute("out", out, lambda v: t[v[0]] * const(2.0, DType.F32))
    sch = Schedule(PrimFunc("f", (x,), (out,), b.body()))
    for name in ("t", "out"):
        sch.split(sch.get_loops(name)[0], [None, 16])
    func = sch.func
    assert _guarded_stores(func) == {"t": 1, "out": 1}
    assert _guarded_stores(unmask_scratch_stores(func)) == {"t": 1, "out": 1}
