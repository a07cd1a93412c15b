"""Every quick HF architecture, compiled both ways at the default opt level, matches eager.

Each case runs with ``strict=True``, so a model kiln cannot compile fails here instead of
falling back to eager (or, for kiln.compile, to Dynamo) with a warning. Unlike the zoo's,
these run without ``debug=True`` (verify after every pass): it adds 40% to the time.
"""

import pytest
import torch

import kiln
from kiln import models

pytest.importorskip("transformers")

NAMES = models.names(models.Origin.HF)

# Opaque ATen calls kiln keeps (correct, not fused): BertEmbeddings gathers its token type ids;
# through torch.export, GPT-2's and Llama's causal masks are built at run time from a cumsum,
# an index and a bitwise and (Dynamo folds them away as constants).
MASK_OPS = {"aten.bitwise_and.Tensor", "aten.cumsum.default", "aten.index.Tensor"}
EXPECTED_OPAQUE = {"hf_bert": {"aten.gather.default"}, "hf_gpt2": MASK_OPS, "hf_llama": MASK_OPS}

# MobileNetV2's quick variant is ill-conditioned in float32: eager itself is 3.3e-4 off a float64
# run at its largest output (6.0, the relu6 clamp), and kiln's folded batch norms land nearer to
# float64 than eager does. The others match to 1e-5.
ATOL = {"hf_mobilenet_v2": 1e-3}


def _check(got: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=ATOL.get(name, 1e-4))


@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_backend_matches_eager(name: str) -> None:
    torch._dynamo.reset()
    model, inputs = models.build(name, quick=True)
    fast = torch.compile(model, backend="kiln", fullgraph=True, options={"strict": True})
    with torch.no_grad():
        expected = model(*inputs)
        _check(fast(*inputs), expected, name)
        _check(fast(*inputs), expected, name)  # a second call reuses the plan


@pytest.mark.parametrize("name", NAMES)
def test_ahead_of_time_compile_matches_eager(name: str) -> None:
    """(torch.export records each ``.to(dtype)`` of GPT-2, ViT and Llama as
    ``_assert_tensor_metadata``: checked at import against the static types, then dropped.)"""
    model, inputs = models.build(name, quick=True)
    compiled = kiln.compile(model, inputs, kiln.Options(strict=True))  # opt level 2
    with torch.no_grad():
        _check(compiled(*inputs), model(*inputs), name)
    report = compiled.report
    assert not report.fallbacks and len(report.graphs) == 1
    assert set(report.graphs[0].opaque_ops) <= EXPECTED_OPAQUE.get(name, set())
