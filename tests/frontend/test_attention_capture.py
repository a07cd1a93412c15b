"""F.scaled_dot_product_attention (Hugging Face's default attention, torch's
MultiheadAttention) stays one call of ATen's fused kernel through both capture paths."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).view(1, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(1, 16, 32))


@pytest.mark.parametrize("entry", ["compile", "dynamo"])
def test_sdpa_is_one_call_and_matches_eager_with_a_fully_masked_row(entry):
    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(1, 16, 32)
    mask = torch.zeros(1, 1, 16, 16)
    mask[..., 3, :] = float("-inf")  # a row with nothing to attend to
    with torch.no_grad():
        expected = model(x, mask)
        if entry == "compile":
            compiled = kiln.compile(model, (x, mask))
            (graph,) = compiled.report.graphs
            calls = [op for op in graph.opaque_ops if "scaled_dot_product" in op]
            assert len(calls) == 1 and not any("any" in op for op in graph.opaque_ops)
        else:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="kiln")
        torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5,
                                   equal_nan=True)
