"""What is made from a model's weights is made once and shared by its compiles, and only
where the sources are the same: the same live tensor at the same version, the same other
arguments (-0.0 is not 0.0), the same recipe."""

from __future__ import annotations

import functools
import gc
import weakref

import torch
import torch.nn as nn

from kiln.ir import parse_graph
from kiln.ir import shared as shared_module
from kiln.ir.shared import all_finite, packed, shared
from kiln.kernels import gemm
from kiln.kernels.gemm_schedule import pack_b
from kiln.passes.fold import fold_constants


def test_the_same_weight_is_packed_once_and_again_after_an_in_place_change():
    w = torch.randn(16, 40)
    first = packed(pack_b, w.t(), 16)
    assert packed(pack_b, w.t(), 16) is first  # (another view of the same memory)
    assert packed(pack_b, w.t(), 32) is not first  # (other parameters)
    assert packed(pack_b, w.t().contiguous(), 16) is not first  # (other memory)
    with torch.no_grad():
        w.mul_(2.0)
    again = packed(pack_b, w.t(), 16)
    assert again is not first
    torch.testing.assert_close(again, pack_b(w.t(), 16))


def test_finiteness_is_asked_once_per_weight_and_again_after_an_in_place_change(monkeypatch):
    asked = []
    isfinite = torch.isfinite
    monkeypatch.setattr(shared_module.torch, "isfinite",
                        lambda t: asked.append(t) or isfinite(t))
    w = torch.randn(8, 3)
    assert all_finite(w) and all_finite(w) and len(asked) == 1  # remembered
    assert all_finite(w.t()) and len(asked) == 2  # (other strides: asked)
    with torch.no_grad():
        w[2, 1] = float("inf")
    assert not all_finite(w) and len(asked) == 3  # the version changed: asked again
    assert not all_finite(w.t()) and not all_finite(w) and len(asked) == 4
    assert not all_finite(torch.tensor([1.0, float("nan")])) and len(asked) == 5
    with torch.inference_mode():
        frozen = torch.ones(3)  # no version counter: asked every time
    assert all_finite(frozen) and all_finite(frozen) and len(asked) == 7


def test_finiteness_answers_of_freed_weights_are_swept(monkeypatch):
    monkeypatch.setattr(shared_module, "_FINITE", {})
    monkeypatch.setattr(shared_module, "_finite_sweep_at", 3)
    for _ in range(3):
        all_finite(torch.randn(5))  # (each freed at once)
    kept = torch.randn(5)
    assert all_finite(kept)  # the fourth: a sweep first, the dead three go
    assert len(shared_module._FINITE) == 1
    assert shared_module._finite_sweep_at == shared_module._SWEEP_FROM


def test_numbers_are_told_apart_by_their_text():
    w = torch.randn(4)
    made = [shared("scale", (w, s), functools.partial(torch.mul, w, s))
            for s in (0.0, -0.0, float("nan"), float("nan"))]
    assert made[0] is not made[1] and torch.equal(made[1].signbit(), (w * -0.0).signbit())
    assert made[2] is made[3]


def test_a_freed_weight_is_forgotten():
    w = torch.randn(8, 8)
    made = shared("copy", (w,), w.clone)
    ref = made.data_ptr()
    del w, made
    gc.collect()
    fresh = torch.zeros(8, 8)  # (maybe at the freed address, with version 0)
    again = shared("copy", (fresh,), fresh.clone)
    assert torch.equal(again, torch.zeros(8, 8)), ref


def test_folding_the_same_weights_twice_gives_the_same_tensors():
    text = """graph(%x: f32[3, 4]) {
      %w = constant {name='w'} : f32[5, 4]
      %t = permute(%w) {dims=(1, 0)} : f32[4, 5]
      %s = mul(%t, %t) : f32[4, 5]
      %y = mm(%x, %s) : f32[3, 5]
      return %y
    }"""
    weights = {"w": torch.randn(5, 4)}
    first = fold_constants(parse_graph(text, weights))
    second = fold_constants(parse_graph(text, weights))
    names = [k for k in first.constants if k.startswith("fold.")]
    assert names == ["fold.t", "fold.s"]
    assert all(second.constants[k] is first.constants[k] for k in names)
    other = fold_constants(parse_graph(text, {"w": weights["w"].clone()}))
    assert not any(other.constants[k] is first.constants[k] for k in names)
    torch.testing.assert_close(other.constants["fold.s"], first.constants["fold.s"])


def test_compiles_for_new_shapes_pack_no_weight_again(monkeypatch):
    """torch.compile hands kiln a graph with symbolic shapes from the second shape on; each
    shape compiles, and each compile packed every GEMM weight again (HF BERT: +350 MB a
    sequence length)."""
    calls = []

    def counting(b: torch.Tensor, nr: int) -> torch.Tensor:
        # (kept here: a packing no compiled graph holds, a GEMM the library won, is freed,
        # and made again when needed)
        calls.append(pack_b(b, nr))
        return calls[-1]
    monkeypatch.setattr(gemm, "pack_b", counting)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    torch._dynamo.reset()
    fast = torch.compile(model, backend="kiln", dynamic=True)
    with torch.no_grad():
        x = torch.randn(40, 64)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
        first = len(calls)
        for rows in (24, 33):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
    assert first >= 2 and len(calls) == first, [t.shape for t in calls]


def test_forgetting_the_dead_survives_a_compile_on_another_thread(monkeypatch):
    """Another thread may add an entry while this one forgets the dead: simulated by a
    reference whose call adds one (iterating the live dict raised)."""
    from kiln.ir import shared as module

    table: dict = {}
    monkeypatch.setattr(module, "_MADE", table)
    keep = torch.zeros(2)

    class Busy(weakref.ref):
        def __call__(self):
            table[("another", len(table))] = ((weakref.ref(keep),), (weakref.ref(keep),), None)
            return super().__call__()

    table["entry"] = ((Busy(keep),), (weakref.ref(keep),), None)
    module._drop_dead()
    assert "entry" in table and len(table) > 1


def test_the_table_is_swept_for_the_dead_a_logarithmic_number_of_times(monkeypatch):
    """A sweep per new entry made compiling quadratic in a model's weights; now the table
    is swept when it doubles, and the dead still go."""
    import kiln.ir.shared as module

    monkeypatch.setattr(module, "_MADE", {})
    monkeypatch.setattr(module, "_sweep_at", module._SWEEP_FROM)
    sweeps = []
    sweep = module._drop_dead
    monkeypatch.setattr(module, "_drop_dead", lambda: (sweeps.append(1), sweep()))
    kept = [torch.full((2,), float(i)) for i in range(2000)]
    made = [shared("copy", (w,), w.clone) for w in kept]
    assert len(module._MADE) == 2000 and len(sweeps) <= 4  # (at 256, 512, 1024, 2048)
    for i in range(3000):  # weights gone as soon as made: their entries are dropped
        shared("copy", (torch.full((2,), -1.0 - i),), lambda: torch.zeros(2))
    assert len(module._MADE) <= 2 * 2000 + 1 and len(sweeps) <= 8
    assert all(shared("copy", (w,), w.clone) is m for w, m in zip(kept, made))
