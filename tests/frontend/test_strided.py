"""as_strided reads its operand's elements, whatever layout kiln gives the operand."""

import logging

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.frontend.strided import OutsideOperand, read_positions


def _chunk(x, window):
    """Longformer's overlapping chunks: strides computed from x's strides at capture."""
    x = x.view(x.size(0), x.size(1) // (window * 2), window * 2, x.size(2))
    size, stride = list(x.size()), list(x.stride())
    size[1] = size[1] * 2 - 1
    stride[1] = stride[1] // 2
    return x.as_strided(size=size, stride=stride)


class ChunkedAttention(nn.Module):
    """Three projections of one input (kiln merges them into one GEMM; each piece is then a
    strided view of the merged result), chunked as Longformer does."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):  # x: (seq, batch, 16)
        q = _chunk(self.q(x).transpose(0, 1), 4)
        k = _chunk(self.k(x).transpose(0, 1), 4)
        scores = torch.einsum("bcxd,bcyd->bcxy", q, k)
        return scores.softmax(-1).sum(1) + self.v(x).transpose(0, 1)[:, :8].sum()


@pytest.mark.parametrize("entry", ["compile", "dynamo"])
def test_chunks_of_merged_projections_match_eager(entry):
    torch.manual_seed(0)
    model, x = ChunkedAttention().eval(), torch.randn(16, 2, 16)
    with torch.no_grad():
        expected = model(x)
        if entry == "compile":
            compiled = kiln.compile(model, (x,))
            assert compiled.report.fallbacks == []
            assert not any("as_strided" in op for g in compiled.report.graphs
                           for op in g.opaque_ops)
        else:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="kiln")
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-5)


def test_read_positions_are_logical_positions_in_the_operand():
    """A transposed operand: the addresses as_strided reads name elements by their position
    in the operand's own (row-major) order."""
    x = torch.arange(12.0).reshape(3, 4).t()  # (4, 3), strides (1, 4)
    read = read_positions(x, (2, 3), (1, 4), None)
    assert torch.equal(x.reshape(-1)[read], x.as_strided((2, 3), (1, 4)))


def test_reading_outside_the_operand_is_refused():
    x = torch.arange(10.0)[2:6]  # its neighbours are not its elements
    with pytest.raises(OutsideOperand, match="outside its operand"):
        read_positions(x, (4,), (1,), 0)


def test_a_graph_reading_outside_an_operand_runs_eagerly_with_the_reason(caplog):
    def f(x):
        y = x * 2
        return y[:, 1:].as_strided((3, 3), (4, 1), 0) + 1  # reads y[:, 0] too

    x = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        out = torch.compile(f, backend="kiln")(x)
    assert torch.equal(out, f(x))
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("as_strided" in m and "outside its operand" in m for m in messages), messages
