"""F.unfold / F.fold over patches that tile the image are views; other geometries stay
ATen's calls. Both against eager, both entry points."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln


class Patches(nn.Module):
    def __init__(self, kernel: int, stride: int, padding: int) -> None:
        super().__init__()
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x):
        geometry = dict(kernel_size=self.kernel, stride=self.stride, padding=self.padding)
        cols = F.unfold(x, **geometry)
        return F.fold(cols * 2 + 1, output_size=x.shape[-2:], **geometry)


@pytest.mark.parametrize("entry", ["compile", "dynamo"])
@pytest.mark.parametrize("geometry, opaque", [((2, 2, 0), set()),
                                              ((3, 1, 1), {"aten.im2col.default",
                                                           "aten.col2im.default"})])
def test_unfold_and_fold(entry, geometry, opaque):
    model, x = Patches(*geometry), torch.randn(2, 3, 8, 6)
    with torch.no_grad():
        if entry == "compile":
            compiled = kiln.compile(model, (x,))
            assert set(compiled.report.graphs[0].opaque_ops) == opaque
        else:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="kiln")
        torch.testing.assert_close(compiled(x), model(x))
