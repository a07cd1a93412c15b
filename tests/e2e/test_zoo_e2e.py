"""Every zoo model, compiled both ways, matches eager PyTorch (float32: relative L2 < 1e-5)."""

import pytest
import torch

import kiln
from kiln import models


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", models.names())
def test_torch_compile_backend_matches_eager(name):
    torch._dynamo.reset()
    model, inputs = models.build(name, quick=True)
    fast = torch.compile(model, backend="kiln", options={"debug": True, "strict": True})
    with torch.no_grad():
        expected = model(*inputs)
        assert _rel(fast(*inputs), expected) < 1e-5
        assert _rel(fast(*inputs), expected) < 1e-5  # a second call reuses the memory plan


@pytest.mark.parametrize("name", models.names())
@pytest.mark.parametrize("opt_level", [0, 2])
def test_ahead_of_time_compile_matches_eager(name, opt_level):
    model, inputs = models.build(name, quick=True)
    options = kiln.Options(opt_level=opt_level, debug=True, strict=True)
    compiled = kiln.compile(model, inputs, options)
    with torch.no_grad():
        assert _rel(compiled(*inputs), model(*inputs)) < 1e-5
    report = compiled.report
    assert not report.fallbacks and len(report.graphs) == 1
    graph = report.graphs[0]
    assert graph.opaque_ops == (), f"{name} should need no opaque ATen calls"
    assert graph.planned_peak_bytes <= graph.intermediate_bytes


def test_batchnorm_models_keep_batchnorm_as_a_kiln_op():
    model, inputs = models.build("resnet18", quick=True)
    counts = kiln.compile(model, inputs).report.op_counts()
    assert counts["convolution"] == counts["batch_norm"] > 0
