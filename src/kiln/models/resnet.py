"""ResNet-18 / ResNet-50 / ResNeXt-50 in the torchvision layout (conv-bn-relu, residual adds,
in-place ReLU).

ResNeXt (Xie et al., CVPR'17) is ResNet-50 with a grouped 3x3 convolution in each bottleneck:
32 groups of 4 channels in the first stage, up to 32 of 32 in the last. TASO evaluated its
graph search on it; narrow groups are what a CPU runs worst (few channels per vector).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ._common import init_cnn_

DESCRIPTION_18 = "ResNet-18, 3x224x224, batch 1"
DESCRIPTION_50 = "ResNet-50 (bottleneck blocks), 3x224x224, batch 1"
DESCRIPTION_X50 = "ResNeXt-50 32x4d (grouped 3x3 convolutions), 3x224x224, batch 1"


def conv3x3(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs + identity (or 1x1 projection) shortcut; used by ResNet-18/34."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        # One in-place ReLU module reused twice, exactly as torchvision does.
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:  # structural, not data-dependent
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (strided, grouped for ResNeXt) -> 1x1 expand (x4); used by
    ResNet-50/101/152 and ResNeXt, whose 3x3 is ``width = planes * width_per_group / 64 *
    groups`` channels wide, as torchvision's."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, downsample: nn.Module | None,
                 groups: int = 1, width_per_group: int = 64) -> None:
        super().__init__()
        width = planes * width_per_group // 64 * groups
        self.conv1 = conv1x1(cin, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride, groups)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: Sequence[int],
        widths: Sequence[int] = (64, 128, 256, 512),
        num_classes: int = 1000,
        groups: int = 1,
        width_per_group: int = 64,
    ) -> None:
        super().__init__()
        # ResNeXt's grouping, passed to every Bottleneck (BasicBlock has none)
        self.grouping = {} if groups == 1 else {"groups": groups,
                                                "width_per_group": width_per_group}
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplanes, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, widths[0], layers[0], stride=1)
        self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3] * block.expansion, num_classes)

    def _make_layer(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample, **self.grouping)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, 1, None, **self.grouping)
                   for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def _build(
    block: type[BasicBlock] | type[Bottleneck],
    layers: Sequence[int],
    quick_layers: Sequence[int],
    quick: bool,
    groups: int = 1,
    width_per_group: int = 64,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if quick:
        # Same stem/blocks, narrow and shallow; 32x32 still reaches 1x1 at layer4.
        model = ResNet(block, quick_layers, widths=(8, 16, 32, 64), num_classes=10,
                       groups=groups, width_per_group=width_per_group)
        size, calib_batch = 32, 8
    else:
        model = ResNet(block, layers, groups=groups, width_per_group=width_per_group)
        size, calib_batch = 224, 2
    init_cnn_(model, torch.randn(calib_batch, 3, size, size))
    x = torch.randn(1, 3, size, size)
    return model.eval(), (x,)


def build_resnet18(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    # Quick: layer1 keeps an identity shortcut, layers 2-4 use projection shortcuts.
    return _build(BasicBlock, (2, 2, 2, 2), (1, 1, 1, 1), quick)


def build_resnet50(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    # Quick: two blocks in layer2 so an identity-shortcut bottleneck is present too.
    return _build(Bottleneck, (3, 4, 6, 3), (1, 2, 1, 1), quick)


def build_resnext50(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    # 32x4d; quick: 4 groups of 2 to 16 channels (widths 8 to 64, as ResNet-50's quick)
    if quick:
        return _build(Bottleneck, (), (1, 2, 1, 1), quick, groups=4, width_per_group=32)
    return _build(Bottleneck, (3, 4, 6, 3), (), quick, groups=32, width_per_group=4)
