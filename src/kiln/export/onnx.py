"""kiln's optimized graph as standard ONNX: ``kiln optimize in.onnx -o out.onnx``.

    result = optimize("model.onnx", opt_level=2)      # or a zoo name: optimize("resnet18")
    result.save("model.opt.onnx")
    result.nodes_before, result.nodes_after, result.op_counts_after, result.rules_fired

The graph is kiln's after its graph-level passes (constant folding, batch norms folded into
convolutions, parallel GEMMs merged, epilogues fused), written as opset-17 ONNX: a fused op
becomes its standard sequence (Conv, Add, Relu), or with ``contrib_ops=True`` ONNX Runtime's
com.microsoft op where one computes exactly that (FusedConv, FusedGemm, Gelu, FastGelu,
BiasGelu). The layout pass does not run: ONNX values have no memory layout, a runtime picks
its own. No pass packs weights (kiln packs them in its kernel stage, which export skips), so
every weight is a plain initializer. Every model is checked with onnx.checker's full check.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch

from kiln.export.onnx_context import OnnxExportError
from kiln.export.onnx_graph import DEFAULT_OPSET, check_model, export_graph, save_model
from kiln.export.onnx_sources import prepare
from kiln.ir.graph import Graph
from kiln.options import Options
from kiln.passes.pipeline import PIPELINE, PassRecord, run_pipeline

__all__ = ["DEFAULT_OPSET", "EXPORT_PIPELINE", "OnnxExportError", "OptimizeResult",
           "check_model", "export_graph", "op_counts", "optimize", "run_onnxruntime"]

# The graph passes minus "layout" (and "pointwise", which reads its NHWC values as GEMM
# rows): channels-last is a memory layout, which ONNX cannot say;
# and minus "pet" and "attention": their choices are timed on this machine's ATen calls, not
# the kernels of whichever runtime loads the file (which fuses attention itself).
EXPORT_PIPELINE = tuple(p for p in PIPELINE
                        if p.name not in ("layout", "pointwise", "pet", "attention"))


@dataclass
class OptimizeResult:
    """The optimized model and what changed. Node counts leave out Constant nodes (data)."""

    model: onnx.ModelProto
    original: onnx.ModelProto  # the input model (for a PyTorch model, torch.onnx.export's)
    graph: Graph  # kiln's optimized graph, which ``model`` writes out
    passes: list[PassRecord]
    feeds: dict[str, np.ndarray]  # example inputs by name, for both models
    rules_fired: dict[str, int] = field(default_factory=dict)

    @property
    def op_counts_before(self) -> dict[str, int]:
        return op_counts(self.original)

    @property
    def op_counts_after(self) -> dict[str, int]:
        return op_counts(self.model)

    @property
    def nodes_before(self) -> int:
        return _computing_nodes(self.original)

    @property
    def nodes_after(self) -> int:
        return _computing_nodes(self.model)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model; weights go to ``<path>.data`` if the file would pass 2 GiB."""
        save_model(self.model, path)

    def max_relative_error(self, threads: int | None = None) -> float:
        """Run both models in ONNX Runtime on ``feeds``; the largest relative difference of
        an output (max |a - b| / max |b|; integer outputs must be equal)."""
        after = run_onnxruntime(self.model, self.feeds, threads)
        before = run_onnxruntime(self.original, self.feeds, threads)
        return max((_relative_error(a, b) for a, b in zip(after, before, strict=True)),
                   default=0.0)


def optimize(source: str | os.PathLike[str] | onnx.ModelProto | torch.nn.Module, *,
             opt_level: int = 2, shapes: Mapping[str, Sequence[int]] | None = None,
             quick: bool = True, contrib_ops: bool = False,
             example_inputs: Sequence[torch.Tensor] | None = None,
             opset: int = DEFAULT_OPSET) -> OptimizeResult:
    """Optimize an ONNX model (a path or ModelProto; ``shapes`` fixes its dynamic dims), a
    zoo model by name (built with ``quick``) or an nn.Module (with ``example_inputs``)."""
    prepared = prepare(source, shapes=shapes, quick=quick, example_inputs=example_inputs,
                       opset=opset)
    graph, records, _ = run_pipeline(prepared.graph, Options(opt_level=opt_level),
                                     EXPORT_PIPELINE)
    model = export_graph(graph, input_names=prepared.input_names,
                         output_names=prepared.output_names, opset=opset,
                         contrib_ops=contrib_ops)
    fired: Counter[str] = Counter()
    for record in records:
        for rule, stats in record.rules.items():
            if stats.fired:
                fired[rule] += stats.fired
    return OptimizeResult(model, prepared.original, graph, records, prepared.feeds,
                          dict(fired.most_common()))


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each op type (``com.microsoft.FusedConv`` for a contrib op)."""
    counts = Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type
                     for n in model.graph.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _computing_nodes(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type != "Constant")


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                    threads: int | None = None) -> list[np.ndarray]:
    """The model's outputs in ONNX Runtime on the CPU; ``threads`` caps its intra-op pool."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def _relative_error(actual: Any, expected: Any) -> float:
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return float("inf")
    if not np.issubdtype(expected.dtype, np.floating):
        return 0.0 if np.array_equal(actual, expected) else float("inf")
    if expected.size == 0:
        return 0.0
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    if np.isnan(diff).any() and not np.array_equal(np.isnan(actual), np.isnan(expected)):
        return float("inf")
    scale = max(float(np.nanmax(np.abs(expected.astype(np.float64)))), 1e-30)
    return float(np.nanmax(diff)) / scale
