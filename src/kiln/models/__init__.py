"""Built-in model zoo: plain-PyTorch models with seeded random weights (no downloads).

Usage::

    from kiln import models
    model, inputs = models.build("resnet50", quick=False, seed=0)
    out = model(*inputs)

``quick=True`` builds a much smaller variant of the same architecture (same block types,
fewer layers/channels, small inputs) for fast tests.

Next to the built-in models are Hugging Face ``transformers`` architectures (``hf_bert``,
``hf_llama``, ...; see `kiln.models.hf`), built from configs with random weights. They are
listed by `names` only where ``transformers`` is installed (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import hf, inception, mlp, mobilenet, resnet, transformer
from .hf import MissingDependency

__all__ = ["ModelSpec", "Origin", "MissingDependency", "names", "get", "build"]

BuildFn = Callable[[bool], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


class Origin(enum.Enum):
    BUILTIN = "built-in"  # plain PyTorch modules in this package
    HF = "hf"  # Hugging Face transformers architectures; need the optional [hf] extra


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str  # one line describing the default (quick=False) configuration
    build_fn: BuildFn  # build_fn(quick) -> (model in eval mode, example inputs)
    origin: Origin = Origin.BUILTIN

    def available(self) -> bool:
        """Whether this model can be built here (HF models need transformers installed)."""
        return self.origin is not Origin.HF or hf.available()


_BUILTIN_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("mlp", mlp.DESCRIPTION, mlp.build),
    ModelSpec("resnet18", resnet.DESCRIPTION_18, resnet.build_resnet18),
    ModelSpec("resnet50", resnet.DESCRIPTION_50, resnet.build_resnet50),
    ModelSpec("resnext50", resnet.DESCRIPTION_X50, resnet.build_resnext50),
    ModelSpec("mobilenet_v2", mobilenet.DESCRIPTION, mobilenet.build),
    ModelSpec("bert", transformer.DESCRIPTION_BERT, transformer.build_bert),
    ModelSpec("gpt2", transformer.DESCRIPTION_GPT2, transformer.build_gpt2),
    ModelSpec("vit_b16", transformer.DESCRIPTION_VIT, transformer.build_vit_b16),
    ModelSpec("inception", inception.DESCRIPTION, inception.build),
)
_HF_SPECS: tuple[ModelSpec, ...] = tuple(
    ModelSpec(name, description, build_fn, Origin.HF)
    for name, (build_fn, description) in hf.BUILDERS.items()
)
_SPECS = _BUILTIN_SPECS + _HF_SPECS
_REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def names(origin: Origin | None = None) -> list[str]:
    """Names of the models that can be built here, in registry order: the built-in ones, then
    the HF ones if transformers is installed. ``origin`` keeps only the models of one origin."""
    return [
        spec.name
        for spec in _SPECS
        if (origin is None or spec.origin is origin) and spec.available()
    ]


def get(name: str) -> ModelSpec:
    """The spec for ``name``; raises ValueError listing the known names if it does not exist,
    and `MissingDependency` (a ValueError too) saying what to install if it cannot be built."""
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(names())}")
    if not spec.available():
        raise MissingDependency(
            f"model {name!r} needs the transformers package, which is not installed; "
            f"install it with: {hf.INSTALL_HINT}"
        )
    return spec


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
