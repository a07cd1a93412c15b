"""Built-in model zoo: plain-PyTorch models with seeded random weights (no downloads).

Usage::

    from kiln import models
    model, inputs = models.build("resnet50", quick=False, seed=0)
    out = model(*inputs)

``quick=True`` builds a much smaller variant of the same architecture (same block types,
fewer layers/channels, small inputs) for fast tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import inception, mlp, mobilenet, resnet, transformer

__all__ = ["ModelSpec", "names", "get", "build"]

BuildFn = Callable[[bool], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str  # one line describing the default (quick=False) configuration
    build_fn: BuildFn  # build_fn(quick) -> (model in eval mode, example inputs)


_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("mlp", mlp.DESCRIPTION, mlp.build),
    ModelSpec("resnet18", resnet.DESCRIPTION_18, resnet.build_resnet18),
    ModelSpec("resnet50", resnet.DESCRIPTION_50, resnet.build_resnet50),
    ModelSpec("mobilenet_v2", mobilenet.DESCRIPTION, mobilenet.build),
    ModelSpec("bert", transformer.DESCRIPTION_BERT, transformer.build_bert),
    ModelSpec("gpt2", transformer.DESCRIPTION_GPT2, transformer.build_gpt2),
    ModelSpec("vit_b16", transformer.DESCRIPTION_VIT, transformer.build_vit_b16),
    ModelSpec("inception", inception.DESCRIPTION, inception.build),
)
_REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def names() -> list[str]:
    """Names of all built-in models, in registry order."""
    return [spec.name for spec in _SPECS]


def get(name: str) -> ModelSpec:
    """The spec for ``name``; raises ValueError listing the known names if it does not exist."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(names())}") from None


def build(
    name: str, quick: bool = False, seed: int = 0
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Build model ``name`` and example inputs, deterministically from ``seed``.

    The global torch RNG is seeded once, before both the weights and the inputs are drawn.
    Returns the model in eval mode (float32) and a tuple of example inputs (batch 1 unless
    the model's description says otherwise).
    """
    spec = get(name)
    torch.manual_seed(seed)
    model, inputs = spec.build_fn(quick)
    return model.float().eval(), inputs
