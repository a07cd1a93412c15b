"""What an op's ONNX emitter sees: its kiln node, its operands' ONNX names, and the builder.

An emitter returns one ONNX value name per output of the node (an existing name when the op
is an identity in ONNX, as a layout copy is; "" for an output nobody reads that it does not
compute). Operands are cast here to the dtype the ONNX op computes in, because ATen promotes
mixed dtypes (f32 tensor + Python int) and ONNX does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kiln.export.onnx_builder import ONNX_DTYPE, OnnxBuilder
from kiln.ir.graph import Node, Value
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType


class OnnxExportError(ValueError):
    """kiln cannot write this graph as ONNX; the message names the op, the node and what to do."""


class EmitContext:
    def __init__(self, builder: OnnxBuilder, node: Node, names: Mapping[Value, str],
                 read: set[Value], contrib: bool) -> None:
        self.b = builder
        self.node = node
        self.attrs: Any = node.attrs
        self.hint = node.name
        self.contrib = contrib
        self._names = names
        self._read = read

    # -- types ---------------------------------------------------------------------------------
    def in_type(self, i: int) -> TensorType:
        return self.node.inputs[i].type

    def out_type(self, i: int = 0) -> TensorType:
        return self.node.types[i]

    @property
    def out_dtype(self) -> DType:
        return self.node.types[0].dtype

    def is_scalar(self, i: int) -> bool:
        return self.node.inputs[i].node.op is Op.SCALAR

    def promoted(self, i: int, j: int) -> DType:
        """The dtype ATen computes ``op(operand i, operand j)`` in, a Python number taking
        part as ATen's wrapped numbers do (an f32 tensor and a Python float stay f32)."""
        return DType.from_torch(torch.result_type(self._example(i), self._example(j)))

    def _example(self, i: int) -> Any:
        v = self.node.inputs[i]
        if v.node.op is Op.SCALAR:
            return v.node.attrs.value  # type: ignore[attr-defined]
        return torch.empty(v.type.shape, dtype=v.type.dtype.torch, device="meta")

    # -- values --------------------------------------------------------------------------------
    def reads(self, i: int) -> bool:
        """Does anything read output ``i`` of this node?"""
        return self.node.out(i) in self._read

    def operand(self, i: int, dtype: DType | None = None) -> str:
        """The ONNX name of operand ``i``, cast to ``dtype``; a Python number becomes a
        constant of ``dtype`` (the output's by default)."""
        v = self.node.inputs[i]
        if v.node.op is Op.SCALAR:
            return self.b.literal(v.node.attrs.value, dtype or self.out_dtype)  # type: ignore
        return self.cast(self._names[v], v.type.dtype, dtype)

    def cast(self, name: str, have: DType, want: DType | None) -> str:
        if want is None or want is have:
            return name
        return self.b.one("Cast", [name], f"{self.hint}/cast", to=ONNX_DTYPE[want])

    def one(self, op_type: str, inputs: Sequence[str], *, domain: str = "",
            **attributes: Any) -> str:
        """Add a single-output node named after this kiln node."""
        return self.b.one(op_type, inputs, self.hint, domain=domain, **attributes)

    def literal(self, value: Any, dtype: DType | None = None) -> str:
        return self.b.literal(value, dtype or self.out_dtype)

    def fail(self, what: str) -> OnnxExportError:
        return OnnxExportError(f"cannot write node {self.node.name} ({self.node.op.text}) as "
                               f"ONNX: {what}")


Emitter = Callable[[EmitContext], Sequence[str]]
EmitterTable = dict[Op, Emitter]


def normalized_dims(dims: Sequence[int] | None, rank: int) -> list[int]:
    """Sorted non-negative dims; None or () means every dimension (ATen's reductions)."""
    if rank == 0:
        return []
    if not dims:
        return list(range(rank))
    return sorted({d % rank for d in dims})
