"""Accumulates an ONNX graph: unique value names, nodes, initializers and their types.

The export walks kiln's graph once and asks this builder for nodes; the builder knows nothing
about kiln ops, only how ONNX spells tensors, dtypes and attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from kiln.ir.types import DType, TensorType

ONNX_DTYPE: dict[DType, int] = {
    DType.F64: TensorProto.DOUBLE,
    DType.F32: TensorProto.FLOAT,
    DType.F16: TensorProto.FLOAT16,
    DType.BF16: TensorProto.BFLOAT16,
    DType.I64: TensorProto.INT64,
    DType.I32: TensorProto.INT32,
    DType.I16: TensorProto.INT16,
    DType.I8: TensorProto.INT8,
    DType.U8: TensorProto.UINT8,
    DType.BOOL: TensorProto.BOOL,
}

CONTRIB_DOMAIN = "com.microsoft"


def tensor_proto(name: str, tensor: torch.Tensor) -> onnx.TensorProto:
    """An initializer holding ``tensor``'s values as raw little-endian bytes (bf16 included,
    which numpy cannot hold)."""
    dense = tensor.detach().cpu().contiguous()
    raw = dense.reshape(-1).view(torch.uint8).numpy().tobytes() if dense.numel() else b""
    dtype = ONNX_DTYPE[DType.from_torch(dense.dtype)]
    return helper.make_tensor(name, dtype, list(dense.shape), raw, raw=True)


def value_info(name: str, type_: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_DTYPE[type_.dtype], list(type_.shape))


class OnnxBuilder:
    """Nodes and initializers of one ONNX graph, with names that never collide."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.value_infos: list[onnx.ValueInfoProto] = []
        self.uses_contrib = False
        self._taken: set[str] = set()
        self._small: dict[tuple[Any, ...], str] = {}  # small constants, shared by value

    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c in "_.:/" else "_" for c in hint) or "v"
        name, k = base, 0
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def reserve(self, name: str) -> None:
        """Claim a name chosen by the caller (a graph input or output name)."""
        if name in self._taken:
            raise ValueError(f"ONNX name {name!r} is used twice")
        self._taken.add(name)

    def add(self, op_type: str, inputs: Sequence[str], hint: str, *, outputs: int = 1,
            domain: str = "", **attributes: Any) -> list[str]:
        """Append one node; returns the names of its ``outputs`` new values."""
        names = [self.fresh(hint if outputs == 1 else f"{hint}_{i}") for i in range(outputs)]
        attrs = {k: v for k, v in attributes.items() if v is not None}
        node = helper.make_node(op_type, list(inputs), names, name=self.fresh(f"{hint}/node"),
                                domain=domain or None, **attrs)
        self.nodes.append(node)
        if domain == CONTRIB_DOMAIN:
            self.uses_contrib = True
        return names

    def one(self, op_type: str, inputs: Sequence[str], hint: str, *, domain: str = "",
            **attributes: Any) -> str:
        return self.add(op_type, inputs, hint, domain=domain, **attributes)[0]

    def initializer(self, tensor: torch.Tensor, hint: str) -> str:
        name = self.fresh(hint)
        self.initializers.append(tensor_proto(name, tensor))
        return name

    def literal(self, values: Any, dtype: DType, hint: str = "const") -> str:
        """A small constant (a number or a list of them) in ``dtype``; shared by value."""
        array = np.asarray(values)
        key = (dtype, array.shape, tuple(np.ravel(array).tolist()),
               tuple(np.signbit(np.ravel(array.astype(np.float64))).tolist()))
        if key not in self._small:
            tensor = torch.tensor(array.tolist(), dtype=dtype.torch)
            self._small[key] = self.initializer(tensor, hint)
        return self._small[key]

    def ints(self, values: Sequence[int], hint: str = "ints") -> str:
        """A 1-d int64 constant (shapes, axes, pads)."""
        return self.literal(np.asarray(list(values), dtype=np.int64).reshape(len(values)),
                            DType.I64, hint)

    def declare(self, name: str, type_: TensorType) -> None:
        self.value_infos.append(value_info(name, type_))
