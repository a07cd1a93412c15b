"""Weight-initialisation helpers shared by the CNN families of the model zoo.

All randomness comes from torch's global RNG, which ``kiln.models.build`` seeds,
so every helper here is deterministic for a given seed.
"""

from __future__ import annotations

import torch
from torch import nn


def init_cnn_(model: nn.Module, calib_input: torch.Tensor) -> None:
    """Initialise conv/linear weights and give every BatchNorm realistic, non-trivial state.

    BatchNorm affine parameters are randomised (so folding gamma/beta is actually tested),
    then the running statistics are *calibrated* with one train-mode pass over random data.
    Calibrated stats are non-trivial (mean != 0, var != 1) yet match the activations the
    model really produces, so eval-mode outputs neither explode nor vanish in float32.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.normal_(m.bias, 0.0, 0.01)
        elif isinstance(m, nn.Linear):
            # 1/sqrt(fan_in) keeps logits O(1).
            nn.init.normal_(m.weight, 0.0, m.in_features**-0.5)
            if m.bias is not None:
                nn.init.normal_(m.bias, 0.0, 0.01)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.normal_(m.bias, 0.0, 0.1)
    calibrate_batchnorm_(model, calib_input)


@torch.no_grad()
def calibrate_batchnorm_(model: nn.Module, calib_input: torch.Tensor) -> None:
    """Set BN running stats to the batch statistics of ``calib_input``; leaves model in eval."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average: one batch -> stats == batch stats
    model.train()
    model(calib_input)
    for bn, momentum in zip(bns, momenta, strict=True):
        bn.momentum = momentum
    model.eval()
