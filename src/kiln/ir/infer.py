"""Type inference: run an op's ATen meaning on meta tensors (shape and dtype, no data)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kiln.ir.attrs import Attrs, canonical
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
    key = _memo_key(op, attrs, inputs)
    known = _KNOWN.get(key) if key is not None else None
    if isinstance(known, str):
        raise InferenceError(known)
    if known is not None:
        return known
    scalars = frozenset(i for i, v in enumerate(inputs) if v.node.op is Op.SCALAR)
    call = lower_to_aten(op, attrs, len(inputs), scalars)
    operands = [meta_operand(v) for v in inputs]
    try:
        results = run_call(call, operands, META)
    except Exception as err:  # ATen reports bad shapes with many exception types
        shapes = ", ".join(str(v.type) for v in inputs)
        message = f"{op.text}({shapes}) with {attrs}: {err}"
        _remember(key, message)
        raise InferenceError(message) from err
    types = tuple(TensorType.of(r) for r in results)
    _remember(key, types)
    return types


# Inference is a function of the op, its attributes and its operands' types (scalars: their
# values): the meta call costs ~50 us, and the rule generator's type checks and the search
# build the same nodes over and over. A failure is kept as its message.
_KNOWN: dict[tuple[Any, ...], tuple[TensorType, ...] | str] = {}
_KNOWN_MAX = 65536


def _memo_key(op: Op, attrs: Attrs, inputs: Sequence[Value]) -> tuple[Any, ...] | None:
    parts: list[Any] = [op, attrs]
    for v in inputs:
        if v.node.op is Op.SCALAR:
            value = v.node.attrs.value  # type: ignore[attr-defined]
            parts.append(("scalar", type(value), canonical(value)))
        else:
            parts.append(v.type)
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:  # an attribute holding something unhashable: not remembered
        return None
    return key


def _remember(key: tuple[Any, ...] | None, result: tuple[TensorType, ...] | str) -> None:
    if key is None:
        return
    if len(_KNOWN) >= _KNOWN_MAX:
        _KNOWN.clear()
    _KNOWN[key] = result
