"""MobileNetV2 in the torchvision layout: inverted residuals, depthwise 3x3 convs, ReLU6."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ._common import init_cnn_

DESCRIPTION = "MobileNetV2 (width 1.0), 3x224x224, batch 1"

# (expand ratio t, output channels c, repeats n, first stride s) from the MobileNetV2 paper.
DEFAULT_CONFIG: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
# Covers every block variant: t=1 (no expansion), strided, and residual (n>=2) blocks.
QUICK_CONFIG: tuple[tuple[int, int, int, int], ...] = (
    (1, 8, 1, 1),
    (6, 12, 2, 2),
    (6, 16, 2, 2),
    (6, 24, 1, 2),
)


class ConvBNReLU6(nn.Sequential):
    def __init__(
        self, cin: int, cout: int, kernel_size: int = 3, stride: int = 1, groups: int = 1
    ) -> None:
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(cin, cout, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise -> 1x1 linear projection, residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = cin * expand_ratio
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(cin, hidden, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, cout, 1, bias=False),  # linear bottleneck: no activation
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:  # fixed at construction time
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(
        self,
        config: Sequence[tuple[int, int, int, int]] = DEFAULT_CONFIG,
        stem_channels: int = 32,
        last_channels: int = 1280,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        features: list[nn.Module] = [ConvBNReLU6(3, stem_channels, stride=2)]
        cin = stem_channels
        for t, c, n, s in config:
            for i in range(n):
                features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(ConvBNReLU6(cin, last_channels, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Linear(last_channels, num_classes)  # dropout omitted: inference only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


def build(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if quick:
        model = MobileNetV2(QUICK_CONFIG, stem_channels=8, last_channels=64, num_classes=10)
        size, calib_batch = 32, 8
    else:
        model = MobileNetV2()
        size, calib_batch = 224, 2
    init_cnn_(model, torch.randn(calib_batch, 3, size, size))
    x = torch.randn(1, 3, size, size)
    return model.eval(), (x,)
