"""The ONNX op table: op type -> a function computing the ONNX op with torch ops.

A handler takes the node's context and its inputs (torch tensors; None for an absent optional
input) and returns the output tensor(s). It spells out where ONNX's meaning differs from
torch's (integer division truncates, Gemm's transposes and scales, Reshape's 0, ...), and
raises ``Decline`` for a case it does not cover exactly: that node then runs as it is
(kiln.frontend.onnx.opaque). So a handler never guesses.

Arguments that must be known before the run (Reshape's shape, Slice's starts) come from
``NodeCall.ints``: values computed at import from initializers, constants and shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import onnx
from kiln.frontend.onnx.types import tensor_of
from onnx import helper

Handler = Callable[..., "torch.Tensor | tuple[torch.Tensor | None, ...]"]
HANDLERS: dict[str, Handler] = {}


class Decline(Exception):
    """This call is outside what the handler computes exactly; run the node as it is."""


def onnx_op(*op_types: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op_type in op_types:
            HANDLERS[op_type] = fn
        return fn

    return register


@dataclass
class NodeCall:
    """One node as a handler sees it."""

    proto: onnx.NodeProto
    opset: int
    known: Mapping[str, np.ndarray]  # values computed at import, by ONNX name

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def num_outputs(self) -> int:
        return len(self.proto.output)

    def wants(self, i: int) -> bool:
        """Whether output ``i`` is asked for (optional outputs may be left unnamed)."""
        return i < len(self.proto.output) and bool(self.proto.output[i])

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.proto.attribute:
            if a.name == name:
                if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS,
                              onnx.AttributeProto.SPARSE_TENSOR):
                    raise Decline(f"attribute {name} is a graph or sparse tensor")
                if a.type == onnx.AttributeProto.TENSOR:
                    return tensor_of(a.t)
                value = helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        return default

    def has_input(self, i: int) -> bool:
        return i < len(self.proto.input) and bool(self.proto.input[i])

    def value(self, i: int) -> np.ndarray | None:
        """Input ``i`` as known at import (numbers, never a traced tensor); None if absent,
        Decline if it depends on the data."""
        if not self.has_input(i):
            return None
        name = self.proto.input[i]
        if name not in self.known:
            raise Decline(f"input {name} is known only at run time")
        return self.known[name]

    def ints(self, i: int) -> list[int] | None:
        v = self.value(i)
        return None if v is None else [int(x) for x in v.reshape(-1).tolist()]

    def scalar(self, i: int) -> float | int | bool | None:
        """The one number input ``i`` holds (None if absent or empty)."""
        v = self.value(i)
        return None if v is None or v.size == 0 else v.reshape(-1)[0].item()


def axis_of(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise Decline(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def axes_of(axes: Sequence[int], rank: int) -> list[int]:
    return [axis_of(a, rank) for a in axes]
