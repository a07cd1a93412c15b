"""kiln.ir.infer: output types from the op's ATen meaning, remembered per (op, attributes,
operand types, scalar values)."""

from __future__ import annotations

import pytest

from kiln.ir import infer
from kiln.ir.attrs import NO_ATTRS, PermuteAttrs
from kiln.ir.builder import GraphBuilder
from kiln.ir.infer import InferenceError, infer_types
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType


def f32(*shape: int) -> TensorType:
    return TensorType(shape, DType.F32)


def test_remembered_types_are_the_inferred_ones(monkeypatch) -> None:
    monkeypatch.setattr(infer, "_KNOWN", {})  # nothing remembered from other tests
    b = GraphBuilder()
    x, w = b.input("x", f32(3, 4)), b.input("w", f32(4, 5))
    assert infer_types(Op.MM, NO_ATTRS, [x, w]) == (f32(3, 5),)
    calls = []

    def counted(*args: object) -> None:
        calls.append(args)
        raise ValueError("not run here")
    monkeypatch.setattr(infer, "run_call", counted)
    # the same op on the same types (other values) is not run again
    y, v = b.input("y", f32(3, 4)), b.input("v", f32(4, 5))
    assert infer_types(Op.MM, NO_ATTRS, [y, v]) == (f32(3, 5),)
    assert not calls
    # other types or other attributes are
    with pytest.raises(InferenceError):
        infer_types(Op.MM, NO_ATTRS, [b.input("z", f32(3, 6)), v])
    with pytest.raises(InferenceError):
        infer_types(Op.PERMUTE, PermuteAttrs((1, 0)), [x])
    assert len(calls) == 2


def test_a_failure_is_remembered_with_its_message(monkeypatch) -> None:
    monkeypatch.setattr(infer, "_KNOWN", {})
    b = GraphBuilder()
    x, w = b.input("x", f32(3, 4)), b.input("w", f32(5, 5))
    with pytest.raises(InferenceError) as first:
        infer_types(Op.MM, NO_ATTRS, [x, w])
    with pytest.raises(InferenceError) as again:
        infer_types(Op.MM, NO_ATTRS, [x, w])
    assert str(again.value) == str(first.value)
    assert "mm(f32[3, 4], f32[5, 5])" in str(first.value)


def test_scalars_are_told_apart_by_value_and_kind() -> None:
    b = GraphBuilder()
    x = b.input("x", TensorType((2,), DType.I64))
    as_int = infer_types(Op.MUL, NO_ATTRS, [x, b.scalar(2)])
    as_float = infer_types(Op.MUL, NO_ATTRS, [x, b.scalar(2.0)])
    assert as_int == (TensorType((2,), DType.I64),)
    assert as_float == (TensorType((2,), DType.F32),)
