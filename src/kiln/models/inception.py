"""Inception-v3 (no auxiliary head): the multi-branch CNN used as a benchmark by TASO and PET.

Every Inception block runs several branches on the *same* input -- parallel 1x1 convs,
3x3 / 5x5 / factorised 1x7-7x1 stacks, and a pooling branch -- and concatenates them along
channels. That is exactly the structure graph-substitution optimisers exploit (merging the
sibling 1x1 convs, fusing concats). Blocks are built from one generic ``Concat`` module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._common import init_cnn_

DESCRIPTION = "Inception-v3 (no aux head), multi-branch blocks, 3x299x299, batch 1"

Pad = int | tuple[int, int]
Width = Callable[[int], int]  # maps a reference (full-size) channel count to the one used


class ConvBN(nn.Module):
    """Conv(bias=False) + BatchNorm(eps=1e-3) + ReLU, as torchvision's BasicConv2d."""

    def __init__(
        self, cin: int, cout: int, kernel_size: Pad, stride: int = 1, padding: Pad = 0
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class Concat(nn.Module):
    """Runs parallel branches on the same input and concatenates the results along channels."""

    def __init__(self, *branches: nn.Module) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


def _pool_branch(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBN(cin, cout, 1))


def block_a(cin: int, pool_features: int, w: Width) -> tuple[nn.Module, int]:
    """35x35 block: 1x1 | 1x1->5x5 | 1x1->3x3->3x3 | avgpool->1x1."""
    c48, c64, c96, cp = w(48), w(64), w(96), w(pool_features)
    block = Concat(
        ConvBN(cin, c64, 1),
        nn.Sequential(ConvBN(cin, c48, 1), ConvBN(c48, c64, 5, padding=2)),
        nn.Sequential(
            ConvBN(cin, c64, 1), ConvBN(c64, c96, 3, padding=1), ConvBN(c96, c96, 3, padding=1)
        ),
        _pool_branch(cin, cp),
    )
    return block, c64 + c64 + c96 + cp


def block_b(cin: int, w: Width) -> tuple[nn.Module, int]:
    """Grid reduction 35->17: strided 3x3 | 1x1->3x3->strided 3x3 | maxpool."""
    c64, c96, c384 = w(64), w(96), w(384)
    block = Concat(
        ConvBN(cin, c384, 3, stride=2),
        nn.Sequential(
            ConvBN(cin, c64, 1), ConvBN(c64, c96, 3, padding=1), ConvBN(c96, c96, 3, stride=2)
        ),
        nn.MaxPool2d(3, stride=2),
    )
    return block, c384 + c96 + cin


def block_c(cin: int, c7: int, w: Width) -> tuple[nn.Module, int]:
    """17x17 block with 7x7 convolutions factorised into 1x7 and 7x1."""
    c192, c7 = w(192), w(c7)

    def conv_1x7(a: int, b: int) -> ConvBN:
        return ConvBN(a, b, (1, 7), padding=(0, 3))

    def conv_7x1(a: int, b: int) -> ConvBN:
        return ConvBN(a, b, (7, 1), padding=(3, 0))

    block = Concat(
        ConvBN(cin, c192, 1),
        nn.Sequential(ConvBN(cin, c7, 1), conv_1x7(c7, c7), conv_7x1(c7, c192)),
        nn.Sequential(
            ConvBN(cin, c7, 1),
            conv_7x1(c7, c7),
            conv_1x7(c7, c7),
            conv_7x1(c7, c7),
            conv_1x7(c7, c192),
        ),
        _pool_branch(cin, c192),
    )
    return block, 4 * c192


def block_d(cin: int, w: Width) -> tuple[nn.Module, int]:
    """Grid reduction 17->8."""
    c192, c320 = w(192), w(320)
    block = Concat(
        nn.Sequential(ConvBN(cin, c192, 1), ConvBN(c192, c320, 3, stride=2)),
        nn.Sequential(
            ConvBN(cin, c192, 1),
            ConvBN(c192, c192, (1, 7), padding=(0, 3)),
            ConvBN(c192, c192, (7, 1), padding=(3, 0)),
            ConvBN(c192, c192, 3, stride=2),
        ),
        nn.MaxPool2d(3, stride=2),
    )
    return block, c320 + c192 + cin


def block_e(cin: int, w: Width) -> tuple[nn.Module, int]:
    """8x8 expanded filter bank: branches themselves split into parallel 1x3 / 3x1 convs."""
    c192, c320, c384, c448 = w(192), w(320), w(384), w(448)

    def split(c: int) -> Concat:
        return Concat(ConvBN(c, c, (1, 3), padding=(0, 1)), ConvBN(c, c, (3, 1), padding=(1, 0)))

    block = Concat(
        ConvBN(cin, c320, 1),
        nn.Sequential(ConvBN(cin, c384, 1), split(c384)),
        nn.Sequential(ConvBN(cin, c448, 1), ConvBN(c448, c384, 3, padding=1), split(c384)),
        _pool_branch(cin, c192),
    )
    return block, c320 + 2 * c384 + 2 * c384 + c192


class InceptionV3(nn.Module):
    def __init__(
        self,
        width: Width = lambda c: c,
        pool_features: tuple[int, ...] = (32, 64, 64),  # one InceptionA per entry
        c7: tuple[int, ...] = (128, 160, 160, 192),  # one InceptionC per entry
        num_e: int = 2,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        w = width
        c32, c64, c80, c192 = w(32), w(64), w(80), w(192)
        self.stem = nn.Sequential(
            ConvBN(3, c32, 3, stride=2),
            ConvBN(c32, c32, 3),
            ConvBN(c32, c64, 3, padding=1),
            nn.MaxPool2d(3, stride=2),
            ConvBN(c64, c80, 1),
            ConvBN(c80, c192, 3),
            nn.MaxPool2d(3, stride=2),
        )
        blocks: list[nn.Module] = []
        cin = c192
        for pf in pool_features:
            block, cin = block_a(cin, pf, w)
            blocks.append(block)
        block, cin = block_b(cin, w)
        blocks.append(block)
        for c in c7:
            block, cin = block_c(cin, c, w)
            blocks.append(block)
        block, cin = block_d(cin, w)
        blocks.append(block)
        for _ in range(num_e):
            block, cin = block_e(cin, w)
            blocks.append(block)
        self.blocks = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)  # dropout omitted: inference only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if quick:
        # 1/8 width, one block of each kind; 75x75 is the smallest input the valid-padded
        # stem and the two grid reductions accept.
        model = InceptionV3(
            lambda c: max(4, c // 8), pool_features=(32,), c7=(128,), num_e=1, num_classes=10
        )
        size, calib_batch = 75, 8
    else:
        model = InceptionV3()
        size, calib_batch = 299, 2
    init_cnn_(model, torch.randn(calib_batch, 3, size, size))
    x = torch.randn(1, 3, size, size)
    return model.eval(), (x,)
