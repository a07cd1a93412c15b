"""kiln optimize on every quick zoo model: the ONNX it writes passes onnx.checker's full check,
runs in ONNX Runtime and matches eager PyTorch and the model as torch.onnx.export writes it;
and the ONNX-in path: an exported file, optimized, matches the file in ONNX Runtime."""

from __future__ import annotations

import functools
import warnings

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kiln import models  # noqa: E402
from kiln.export.onnx import (  # noqa: E402
    OnnxExportError,
    OptimizeResult,
    export_graph,
    op_counts,
    optimize,
    run_onnxruntime,
)
from kiln.ir import Op  # noqa: E402

NAMES = tuple(models.names(models.Origin.BUILTIN))
RTOL = 1e-4


@functools.cache
def optimized(name: str) -> OptimizeResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optimize(name)


@functools.cache
def eager(name: str) -> tuple[np.ndarray, ...]:
    model, inputs = models.build(name, quick=True, seed=0)
    with torch.no_grad():
        flat, _ = torch.utils._pytree.tree_flatten(model(*inputs))
    return tuple(t.numpy() for t in flat)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    scale = max(float(np.abs(expected).max()), 1e-30)
    return float(np.abs(actual - expected).max()) / scale


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_optimized_onnx_matches_eager(name: str) -> None:
    result = optimized(name)
    onnx.checker.check_model(result.model, full_check=True)
    outputs = run_onnxruntime(result.model, result.feeds, threads=2)
    for actual, expected in zip(outputs, eager(name), strict=True):
        assert relative_error(actual, expected) < RTOL
    assert result.max_relative_error(threads=2) < RTOL  # and the torch.onnx.export model
    assert result.nodes_after <= result.nodes_before + 12  # gelu's Erf arithmetic is longer


def test_batch_norms_fold_into_convolutions() -> None:
    result = optimized("resnet18")
    assert "batch_norm" not in result.graph.op_counts()
    assert "BatchNormalization" not in result.op_counts_after
    assert any("bn" in rule for rule in result.rules_fired), result.rules_fired


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit_b16"])
def test_attention_projections_merge_into_one_gemm(name: str) -> None:
    result = optimized(name)
    layers = 2  # the quick transformers
    assert result.rules_fired.get("merge-parallel-addmm") == layers
    splits = [n for n in result.graph.nodes if n.op is Op.SPLIT]
    assert len(splits) == layers and all(len(n.types) == 3 for n in splits)  # q, k, v
    after = result.op_counts_after
    contractions = after.get("Gemm", 0) + after.get("MatMul", 0)
    assert contractions < result.op_counts_before.get("MatMul", 0) + \
        result.op_counts_before.get("Gemm", 0)


@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenet_v2", "bert", "gpt2"])
def test_contrib_ops_run_in_onnxruntime_and_match(name: str) -> None:
    standard = optimized(name)  # optimize(name, contrib_ops=True) writes the same graph so
    model = export_graph(standard.graph, contrib_ops=True,
                         input_names=list(standard.feeds),
                         output_names=[o.name for o in standard.model.graph.output])
    contrib = {k for k in op_counts(model) if k.startswith("com.microsoft.")}
    assert contrib, op_counts(model)
    outputs = run_onnxruntime(model, standard.feeds, threads=2)
    for actual, expected in zip(outputs, eager(name), strict=True):
        assert relative_error(actual, expected) < RTOL
    assert len(model.graph.node) < len(standard.model.graph.node)


@pytest.mark.parametrize("name", ["resnet18", "bert"])
def test_onnx_file_in_optimized_file_out(name: str, tmp_path) -> None:
    pytest.importorskip("kiln.frontend.onnx")
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(optimized(name).original, str(path))  # torch.onnx.export's model
    result = optimize(str(path))
    assert result.op_counts_before == optimized(name).op_counts_before
    assert [i.name for i in result.model.graph.input] == \
        [i.name for i in result.original.graph.input if i.name in result.feeds]
    assert result.max_relative_error(threads=2) < RTOL
    out = tmp_path / f"{name}.opt.onnx"
    result.save(out)
    onnx.checker.check_model(str(out), full_check=True)
    again = run_onnxruntime(onnx.load(str(out)), result.feeds)
    for actual, expected in zip(again, run_onnxruntime(result.original, result.feeds)):
        assert relative_error(actual, expected) < RTOL


def test_unknown_zoo_name_lists_the_known_ones() -> None:
    with pytest.raises(OnnxExportError, match="resnet18"):
        optimize("resnet19")


def test_a_module_needs_example_inputs() -> None:
    with pytest.raises(OnnxExportError, match="example_inputs"):
        optimize(torch.nn.Linear(3, 4))
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    result = optimize(model, example_inputs=(x,), opt_level=1)
    (actual,) = run_onnxruntime(result.model, result.feeds)
    with torch.no_grad():
        assert relative_error(actual, model(x).numpy()) < RTOL


class _RowWrites(torch.nn.Module):
    """``out[:, i] = ...``: kiln.compile keeps the scatters (written in place); ONNX export
    decomposes them, having no form for the opaque call."""

    def forward(self, xs):
        out = torch.zeros(1, 4, 8)
        for i in range(4):
            out[:, i] = xs[:, i] * 2 + i
        return out.relu()


def test_row_writes_export_to_onnx() -> None:
    xs = torch.randn(1, 4, 8)
    result = optimize(_RowWrites(), example_inputs=(xs,))
    (actual,) = run_onnxruntime(result.model, result.feeds, threads=2)
    np.testing.assert_allclose(actual, _RowWrites()(xs).numpy(), rtol=1e-6)
