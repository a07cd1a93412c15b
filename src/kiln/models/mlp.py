"""Multi-layer perceptron: the simplest zoo entry (Linear + bias + activation chains)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

DESCRIPTION = "MLP 784-2048-2048-10, ReLU, batch 64"


class MLP(nn.Module):
    """Linear -> ReLU repeated over ``hidden``, then a final Linear classifier."""

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_features
        for width in hidden:
            layers += [nn.Linear(prev, width), nn.ReLU()]
            prev = width
        layers.append(nn.Linear(prev, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _init(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Linear):
            # Kaiming (fan_in, relu) keeps activation variance ~constant through ReLU layers.
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.normal_(m.bias, 0.0, 0.01)


def build(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if quick:
        batch, in_features, hidden, classes = 8, 64, (128, 128), 10
    else:
        batch, in_features, hidden, classes = 64, 784, (2048, 2048), 10
    model = MLP(in_features, hidden, classes)
    _init(model)
    x = torch.randn(batch, in_features)
    return model.eval(), (x,)
