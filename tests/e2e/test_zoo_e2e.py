"""Every built-in zoo model, compiled both ways and at every opt level, matches eager PyTorch
(the HF architectures: test_hf_e2e.py).

Float32 relative L2 error: below 1e-5 where only exact rewrites run (level 0), below 1e-4 where
ieee rules fold batch norms and merge GEMMs (they round differently; 1.2e-5 measured at worst).
"""

import pytest
import torch

import kiln
from kiln import models

TOLERANCE = {0: 1e-5, 1: 1e-5, 2: 1e-4, 3: 1e-4}


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", models.names(models.Origin.BUILTIN))
def test_torch_compile_backend_matches_eager(name):
    torch._dynamo.reset()
    model, inputs = models.build(name, quick=True)
    fast = torch.compile(model, backend="kiln", options={"debug": True, "strict": True})
    with torch.no_grad():
        expected = model(*inputs)
        assert _rel(fast(*inputs), expected) < TOLERANCE[2]
        assert _rel(fast(*inputs), expected) < TOLERANCE[2]  # a second call reuses the plan


@pytest.mark.parametrize("name", models.names(models.Origin.BUILTIN))
@pytest.mark.parametrize("opt_level", [0, 1, 2, 3])
def test_ahead_of_time_compile_matches_eager(name, opt_level):
    model, inputs = models.build(name, quick=True)
    options = kiln.Options(opt_level=opt_level, debug=True, strict=True)
    compiled = kiln.compile(model, inputs, options)
    with torch.no_grad():
        assert _rel(compiled(*inputs), model(*inputs)) < TOLERANCE[opt_level]
    report = compiled.report
    assert not report.fallbacks and len(report.graphs) == 1
    graph = report.graphs[0]
    assert graph.opaque_ops == (), f"{name} should need no opaque ATen calls"
    assert graph.planned_peak_bytes <= graph.intermediate_bytes


def test_batchnorm_is_a_kiln_op_at_level_0():
    model, inputs = models.build("resnet18", quick=True)
    counts = kiln.compile(model, inputs, kiln.Options(opt_level=0)).report.op_counts()
    assert counts["convolution"] == counts["batch_norm"] > 0
