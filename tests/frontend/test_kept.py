"""kiln.frontend.kept: the ATen ops a capture keeps whole run as one call of ATen's kernel,
as eager runs them; upsamplings included, which torch decomposes while tracing whatever the
decomposition table says."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._C import DispatchKey

import kiln
from kiln.frontend.export import capture
from kiln.frontend.kept import KEPT_WHOLE, traced_whole

aten = torch.ops.aten
MODES = [("bilinear", False), ("bilinear", True), ("nearest", None), ("bicubic", False)]


class Upsample(nn.Module):
    def __init__(self, mode: str, align_corners: bool | None) -> None:
        super().__init__()
        self.mode, self.align_corners = mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(x, scale_factor=2, mode=self.mode, align_corners=self.align_corners)
        return up * 2.0 + 1.0


def _input() -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 9, 7)
    x[0, 0, 0, 0], x[0, 1, 4, 4], x[0, 2, -1, -1] = float("nan"), float("inf"), -float("inf")
    return x


def _compiled(model: nn.Module, inputs: tuple[torch.Tensor, ...], entry: str) -> object:
    """``model`` compiled through ``entry`` ("kiln.compile" or "torch.compile"), its
    results checked equal to eager's (NaN where eager has NaN)."""
    torch._dynamo.reset()
    with torch.no_grad():
        fast = kiln.compile(model, inputs) if entry == "kiln.compile" else \
            torch.compile(model, backend="kiln")
        got, want = fast(*inputs), model(*inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)
    return fast


@pytest.fixture
def one_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture may not trace the model a second time (through the decomposition table)."""
    from torch.export import ExportedProgram

    def second_trace(*args: object, **kwargs: object) -> None:
        raise AssertionError("the capture traced the model a second time")
    monkeypatch.setattr(ExportedProgram, "run_decompositions", second_trace)


@pytest.mark.parametrize(("mode", "align_corners"), MODES)
def test_an_upsampling_is_captured_as_one_call(mode: str, align_corners: bool | None) -> None:
    program = capture(Upsample(mode, align_corners), (_input(),))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert f"aten.upsample_{mode}2d.default" in targets
    assert "aten.index.Tensor" not in targets  # (the decomposition's gathers)


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
@pytest.mark.parametrize(("mode", "align_corners"), MODES)
def test_a_compiled_upsampling_matches_eager(mode: str, align_corners: bool | None,
                                             entry: str) -> None:
    fast = _compiled(Upsample(mode, align_corners).eval(), (_input(),), entry)
    if entry == "kiln.compile":
        assert f"aten.upsample_{mode}2d.default" in fast.report.graphs[0].opaque_ops


def test_the_trace_leaves_torchs_decompositions_as_they_were() -> None:
    before = {op: dict(op.py_kernels) for op in KEPT_WHOLE}
    assert DispatchKey.Autograd in aten.upsample_bilinear2d.default.py_kernels
    with pytest.raises(RuntimeError, match="inside"), traced_whole():
        assert DispatchKey.Autograd not in aten.upsample_bilinear2d.default.py_kernels
        raise RuntimeError("a failed trace inside")
    assert {op: dict(op.py_kernels) for op in KEPT_WHOLE} == before
    x = _input()  # (and eager's own upsampling runs as before)
    torch.testing.assert_close(F.interpolate(x, scale_factor=2, mode="bilinear"),
                               F.interpolate(x.double(), scale_factor=2,
                                             mode="bilinear").float(), equal_nan=True)


class Shifted(nn.Module):
    """Swin's shifted window (a roll over two dims) and a reflection and a replication pad."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rolled = torch.roll(x, shifts=(3, -2), dims=(2, 3)) * 2.0
        reflected = F.pad(rolled, (1, 2, 2, 1), mode="reflect")
        return F.pad(reflected + 1.0, (1, 1, 1, 1), mode="replicate").tanh()


def test_roll_and_reflection_padding_are_captured_in_one_trace(one_trace: None) -> None:
    program = capture(Shifted(), (_input(),))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"aten.roll.default", "aten.reflection_pad2d.default",
            "aten.replication_pad2d.default"} <= targets
    assert "aten.index_select.default" not in targets and "aten.index.Tensor" not in targets


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
def test_compiled_roll_and_padding_match_eager(entry: str) -> None:
    fast = _compiled(Shifted().eval(), (_input(),), entry)
    if entry == "kiln.compile":
        assert "aten.roll.default" in fast.report.graphs[0].opaque_ops


class WeightNormed(nn.Module):
    """wav2vec2's positional convolution: a grouped Conv1d under weight normalization."""

    def __init__(self) -> None:
        super().__init__()
        from torch.nn.utils.parametrizations import weight_norm

        self.conv = weight_norm(nn.Conv1d(16, 16, 5, padding=2, groups=4), dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.conv(x))


def test_weight_normalization_is_folded_without_a_second_trace(one_trace: None) -> None:
    compiled = _compiled(WeightNormed().eval(), (torch.randn(1, 16, 50),), "kiln.compile")
    assert not compiled.report.fallbacks
    assert "call" not in compiled.report.graphs[0].ops  # folded into the weight


class Gated(nn.Module):
    """Mamba's step sizes (softplus) and causal masks (tril, triu) of an activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(x * 2.0)
        return torch.tril(dt, -1) + torch.triu(x.exp(), 2) * 0.5


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
def test_softplus_and_triangles_are_one_call_each_in_one_trace(entry: str,
                                                               one_trace: None) -> None:
    x = torch.randn(2, 6, 6) * 20  # (softplus' linear branch above 20 too)
    x[0, 1, 0], x[1, 4, 2], x[0, 5, 1] = float("nan"), float("inf"), -float("inf")
    fast = _compiled(Gated().eval(), (x,), entry)
    if entry == "kiln.compile":
        assert not fast.report.fallbacks
        assert {"aten.softplus.default", "aten.tril.default", "aten.triu.default"} <= set(
            fast.report.graphs[0].opaque_ops)


class Assorted(nn.Module):
    """Ops the sweeps' models left to the decomposition table: glu (Conformer), std,
    masked_fill with a tensor value, logsumexp (Reformer), log-sigmoid (xLSTM), all
    (RT-DETR), index_add, the constants linspace and eye, fill with a tensor (ZoeDepth) and
    linear upsampling (SAM's relative positions)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gated = F.glu(x, dim=-1) + x.std(-1, keepdim=True)
        filled = x.masked_fill(mask, torch.tensor(-3.0))
        ramp = torch.linspace(0, 1, x.shape[-1]) + torch.eye(x.shape[-1])[0]
        added = torch.zeros(4, x.shape[-1]).index_add(0, torch.tensor([0, 2, 2]), x[0, :3])
        constant = torch.empty_like(x).fill_(x[0, 0, 1]) + torch.empty(3).fill_(x[1, 1, 1])[0]
        stretched = F.interpolate(x, scale_factor=2, mode="linear")
        return (gated, filled * ramp, torch.logsumexp(x, -1), F.logsigmoid(x),
                (x > 0).all(-1), added, constant, stretched)


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
def test_assorted_ops_are_captured_in_one_trace(entry: str, one_trace: None) -> None:
    torch.manual_seed(0)
    x, mask = torch.randn(2, 5, 8), torch.rand(2, 5, 8) > 0.7
    x[0, 1, 2], x[1, 3, 5], x[1, 0, 0] = float("nan"), float("inf"), -float("inf")
    fast = _compiled(Assorted().eval(), (x, mask), entry)
    if entry == "kiln.compile":
        assert not fast.report.fallbacks
