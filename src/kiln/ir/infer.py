"""Type inference: run an op's ATen meaning on meta tensors (shape and dtype, no data)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kiln.ir.attrs import Attrs
from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.ir.semantics import lower_to_aten, run_call
from kiln.ir.types import TensorType

META = torch.device("meta")


class InferenceError(TypeError):
    """The op cannot be applied to operands of these types."""


def meta_operand(value: Value) -> Any:
    if value.node.op is Op.SCALAR:
        return value.node.attrs.value  # type: ignore[attr-defined]
    t = value.type
    return torch.empty(t.shape, dtype=t.dtype.torch, device=META)


def infer_types(op: Op, attrs: Attrs, inputs: Sequence[Value]) -> tuple[TensorType, ...]:
    """Output types of ``op`` applied to ``inputs``; InferenceError says why not."""
    scalars = frozenset(i for i, v in enumerate(inputs) if v.node.op is Op.SCALAR)
    call = lower_to_aten(op, attrs, len(inputs), scalars)
    operands = [meta_operand(v) for v in inputs]
    try:
        results = run_call(call, operands, META)
    except Exception as err:  # ATen reports bad shapes with many exception types
        shapes = ", ".join(str(v.type) for v in inputs)
        raise InferenceError(f"{op.text}({shapes}) with {attrs}: {err}") from err
    return tuple(TensorType.of(r) for r in results)
