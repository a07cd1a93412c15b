"""Tests for the built-in model zoo (quick variants only, so the file runs in seconds)."""

from __future__ import annotations

import pytest
import torch

from kiln import models

EXPECTED_NAMES = [
    "mlp",
    "resnet18",
    "resnet50",
    "resnext50",
    "mobilenet_v2",
    "bert",
    "gpt2",
    "vit_b16",
    "inception",
]

# Output shapes of the quick variants.
QUICK_OUTPUT_SHAPES = {
    "mlp": (8, 10),
    "resnet18": (1, 10),
    "resnet50": (1, 10),
    "resnext50": (1, 10),
    "mobilenet_v2": (1, 10),
    "bert": (1, 16, 64),
    "gpt2": (1, 16, 512),
    "vit_b16": (1, 10),
    "inception": (1, 10),
}


def _run(
    name: str, seed: int = 0
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    model, inputs = models.build(name, quick=True, seed=seed)
    with torch.no_grad():
        out = model(*inputs)
    return model, inputs, out


def test_names_and_specs() -> None:
    assert models.names(models.Origin.BUILTIN) == EXPECTED_NAMES
    assert models.names()[: len(EXPECTED_NAMES)] == EXPECTED_NAMES  # then the HF ones, if any
    for name in models.names():
        spec = models.get(name)
        assert isinstance(spec, models.ModelSpec)
        assert spec.name == name
        assert spec.description and "\n" not in spec.description
        assert callable(spec.build_fn)


def test_unknown_name_raises() -> None:
    with pytest.raises(ValueError) as info:
        models.get("no_such_model")
    for name in EXPECTED_NAMES:
        assert name in str(info.value)
    with pytest.raises(ValueError):
        models.build("no_such_model", quick=True)


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_quick_forward(name: str) -> None:
    model, inputs, out = _run(name)
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert isinstance(inputs, tuple) and len(inputs) >= 1
    assert isinstance(out, torch.Tensor)
    assert tuple(out.shape) == QUICK_OUTPUT_SHAPES[name]
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    # Neither exploded nor collapsed to a constant.
    assert 1e-3 < out.std().item() < 1e3


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_deterministic_and_seed_dependent(name: str) -> None:
    _, inputs_a, out_a = _run(name, seed=0)
    _, inputs_b, out_b = _run(name, seed=0)
    for a, b in zip(inputs_a, inputs_b, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(out_a, out_b)
    _, _, out_c = _run(name, seed=1)
    assert not torch.allclose(out_a, out_c)


def test_input_dtypes() -> None:
    for name in ("bert", "gpt2"):
        _, (ids,) = models.build(name, quick=True)
        assert ids.dtype == torch.int64
    for name in ("resnet18", "resnet50", "mobilenet_v2", "vit_b16", "inception"):
        _, (images,) = models.build(name, quick=True)
        assert images.dtype == torch.float32 and images.dim() == 4 and images.shape[:2] == (1, 3)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "inception"])
def test_batchnorm_state_is_nontrivial(name: str) -> None:
    model, _ = models.build(name, quick=True)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns
    for bn in bns:
        assert bn.running_mean.abs().max() > 0
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
        assert bn.bias.abs().max() > 0


def test_transformers_use_separate_qkv() -> None:
    from kiln.models.transformer import SelfAttention

    for name in ("bert", "gpt2", "vit_b16"):
        model, _ = models.build(name, quick=True)
        attns = [m for m in model.modules() if isinstance(m, SelfAttention)]
        assert len(attns) == 2
        for attn in attns:
            assert all(isinstance(getattr(attn, p), torch.nn.Linear) for p in ("q", "k", "v"))


def test_gpt2_is_causal() -> None:
    model, (ids,) = models.build("gpt2", quick=True)
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 512
    with torch.no_grad():
        a, b = model(ids), model(changed)
    # Changing the last token must not affect earlier positions.
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6)
    assert not torch.allclose(a[:, -1], b[:, -1])


@pytest.mark.parametrize("name", ["gpt2", "resnet18"])
def test_torch_export(name: str) -> None:
    model, inputs = models.build(name, quick=True)
    exported = torch.export.export(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
        got = exported.module()(*inputs)
    torch.testing.assert_close(got, expected)
