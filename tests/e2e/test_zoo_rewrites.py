"""The rewrites the zoo models are expected to get at the default level, by op counts."""

import pytest

import kiln
from kiln import models


def _counts(name: str, level: int) -> dict[str, int]:
    model, inputs = models.build(name, quick=True)
    return kiln.compile(model, inputs, kiln.Options(opt_level=level)).report.op_counts()


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "inception"])
def test_every_batch_norm_is_folded(name):
    before, after = _counts(name, 0), _counts(name, 2)
    assert before["batch_norm"] > 0
    assert "batch_norm" not in after


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit_b16"])
def test_qkv_projections_become_one_gemm_and_the_scale_is_folded(name):
    before, after = _counts(name, 0), _counts(name, 2)
    layers = before["layer_norm"] // 2  # two layer norms per block, plus a final one
    gemms = before["addmm"] + before.get("mm", 0)
    gemms_after = after.get("addmm", 0) + after.get("mm", 0) + after.get("addmm_act", 0)
    assert after["split"] == layers  # q, k, v: one wide GEMM and a split per layer
    assert gemms_after == gemms - 2 * layers
    assert after.get("mul", 0) == before["mul"] - layers  # 1/sqrt(d) went into the weights


def test_inception_parallel_1x1_convolutions_are_merged():
    before, after = _counts("inception", 0), _counts("inception", 2)
    assert after["split"] >= 3
    convs = after.get("convolution", 0) + after["conv_act"]
    assert convs < before["convolution"]


def test_resnet_residual_add_and_relu_ride_on_the_conv():
    after = _counts("resnet18", 2)
    assert "add" not in after and "relu" not in after
