"""The torch.compile backend: ``torch.compile(model, backend="kiln", options={...})``.

Dynamo hands over a Python-level fx graph; AOTAutograd lowers it to functional core ATen
(handling input mutation and aliasing outside the graph). In inference (no gradient needed),
parameters and buffers are frozen into the graph as constants; when gradients are needed the
forward and backward graphs are compiled as they are, with weights as inputs, so training
still works.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch._functorch.aot_autograd import aot_module_simplified

from kiln.frontend.fx_compile import FxGraphRunner
from kiln.frontend.kept import KEPT_WHOLE, traced_whole
from kiln.options import Options
from kiln.report import CompileReport

log = logging.getLogger("kiln")

# a member: ._modules['fc'], .__dict__['_modules']['fc'] (how Dynamo names some), or .fc
_MEMBER = re.compile(r"(?:\.__dict__\['_(?:modules|parameters|buffers)'\]|\._(?:modules|parameters"
                     r"|buffers))\['([^']+)'\]|\.(\w+)")


def weight_name(source_name: str) -> str | None:
    """``L['self']._modules['fc']._parameters['weight']`` -> ``fc.weight``; None if not a weight."""
    if not any(kind in source_name for kind in ("._parameters[", "._buffers[",
                                                 "['_parameters']", "['_buffers']")):
        return None
    rest = source_name.split("]", 1)[1] if source_name.startswith("L[") else source_name
    return ".".join(a or b for a, b in _MEMBER.findall(rest)) or source_name


def _weights(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> dict[int, tuple[str, Any]]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return {}
    frozen = {}
    bound: dict[str, Any] = {}
    for i, (node, tensor) in enumerate(zip(placeholders, example_inputs)):
        grapharg = node.meta.get("grapharg")
        source = getattr(grapharg.source, "name", None) if grapharg is not None else None
        name = weight_name(source) if isinstance(source, str) else None
        if name is not None and isinstance(tensor, torch.Tensor):
            if bound.setdefault(name, tensor) is not tensor:  # a name that says too little
                name = source
            frozen[i] = (name, tensor)
    return frozen


@functools.cache
def _decompositions() -> dict[Any, Any]:
    """Core ATen's decomposition table, built once: materializing it costs about 0.2 s, which
    every captured graph would pay again."""
    table = dict(core_aten_decompositions().items())
    for op in KEPT_WHOLE:  # (Dynamo's graphs reach the CPU flash kernel, kept as one call)
        table.pop(op, None)
    return table


def _device_of(example_inputs: list[Any]) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *,
                 options: dict[str, Any] | Options | None = None, mode: str | None = None,
                 report: CompileReport | None = None) -> Any:
    opts = options if isinstance(options, Options) else Options.from_mapping(options)
    report = report if report is not None else CompileReport()
    frozen = _weights(gm, example_inputs)
    device = _device_of(example_inputs)

    def inference_compiler(fw: torch.fx.GraphModule, inputs: list[Any]) -> FxGraphRunner:
        usable = frozen if len(inputs) == len(example_inputs) else {}
        return FxGraphRunner(fw, usable, opts, report, device)

    def training_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> FxGraphRunner:
        return FxGraphRunner(graph, {}, opts, report, device)

    try:
        with traced_whole():
            return aot_module_simplified(
                gm, example_inputs, fw_compiler=training_compiler,
                bw_compiler=training_compiler, inference_compiler=inference_compiler,
                decompositions=_decompositions())
    except torch._dynamo.exc.RestartAnalysis:
        raise  # Dynamo's own control flow (a float argument becomes a tensor): not a failure
    except Exception as err:  # noqa: BLE001 - any capture failure: run this piece eagerly
        if opts.strict:
            raise
        message = f"kiln could not capture a graph ({type(err).__name__}: {err}); it runs eagerly"
        log.warning(message)
        report.fallbacks.append(message)
        return gm.forward
