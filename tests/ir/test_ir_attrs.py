"""kiln.ir.attrs: attribute equality tells number kinds and signed zeros apart, NaN equals NaN."""

from __future__ import annotations

import dataclasses
import math
import struct

import pytest
import torch

from kiln.ir import ATTRS_OF, NoAttrs, Op, Operand
from kiln.ir import attrs as A
from kiln.ir.types import DType

aten = torch.ops.aten


@pytest.mark.parametrize(("a", "b"), [
    (1, 1.0),
    (1, True),
    (1.0, True),
    (0, False),
    (0.0, -0.0),
    (0, 0.0),
    (math.inf, -math.inf),
    (math.nan, 0.0),
], ids=repr)
def test_scalars_of_different_kind_or_sign_differ(a: object, b: object) -> None:
    assert A.ScalarAttrs(a) != A.ScalarAttrs(b)
    assert len({A.ScalarAttrs(a), A.ScalarAttrs(b)}) == 2


@pytest.mark.parametrize("value", [0, 1, -1, 0.0, -0.0, 1.5, math.inf, -math.inf, True, False])
def test_equal_values_are_equal_and_hash_alike(value: object) -> None:
    assert A.ScalarAttrs(value) == A.ScalarAttrs(value)
    assert hash(A.ScalarAttrs(value)) == hash(A.ScalarAttrs(value))


def _nan_with_bits(bits: int) -> float:
    value = struct.unpack("<d", struct.pack("<Q", bits))[0]
    assert math.isnan(value)
    return value


def test_nan_equals_nan_whatever_its_sign_or_payload() -> None:
    nans = [math.nan, -math.nan, float("nan"), _nan_with_bits(0x7FF8_0000_0000_0001)]
    attrs = [A.ScalarAttrs(v) for v in nans]
    assert all(a == attrs[0] for a in attrs)
    assert len(set(attrs)) == 1
    assert A.ClampAttrs(math.nan, None) == A.ClampAttrs(-math.nan, None)


def test_kinds_are_told_apart_inside_tuples_and_optionals() -> None:
    assert A.ClampAttrs(0, 1) != A.ClampAttrs(0.0, 1)
    assert A.ClampAttrs(None, 0.0) != A.ClampAttrs(None, -0.0)
    assert A.ClampAttrs(None, 1) != A.ClampAttrs(1, None)
    assert A.PadAttrs((1, 1), 0.0) != A.PadAttrs((1, 1), -0.0)
    assert A.PadAttrs((1, 1), 0) != A.PadAttrs((1, 1), 0.0)
    assert A.ReduceAttrs((1,), True) != A.ReduceAttrs((1,), 1)  # type: ignore[arg-type]
    assert A.ReduceAttrs((True,), False) != A.ReduceAttrs((1,), False)  # type: ignore[arg-type]
    assert A.ReduceAttrs((1,)) == A.ReduceAttrs((1,), False)


def test_call_attrs_compare_their_argument_templates() -> None:
    def call(*args: object, **kwargs: object) -> A.CallAttrs:
        return A.CallAttrs(aten.cumsum.default, args, tuple(kwargs.items()))

    assert call(Operand(0), 1) == call(Operand(0), 1)
    assert call(Operand(0), 1) != call(Operand(0), 1.0)
    assert call(Operand(0), 1) != call(Operand(1), 1)
    assert call(Operand(0), 0, dtype=torch.float64) != call(Operand(0), 0)
    assert call(Operand(0), (0.0, math.nan)) == call(Operand(0), (0.0, math.nan))
    assert call(Operand(0), (0.0,)) != call(Operand(0), (-0.0,))
    assert A.CallAttrs(aten.cumsum.default, (Operand(0), 0)) != A.CallAttrs(
        aten.cumprod.default, (Operand(0), 0))
    assert len({call(Operand(0), 1), call(Operand(0), 1), call(Operand(0), 1.0)}) == 2


def test_attrs_of_different_classes_differ_even_with_equal_fields() -> None:
    assert A.SoftmaxAttrs(1) != A.DimAttrs(1)
    assert A.ShapeAttrs((2, 3)) != A.PermuteAttrs((2, 3))
    assert A.NoAttrs() == A.NO_ATTRS
    assert A.NoAttrs() != A.SoftmaxAttrs(0)
    assert A.SoftmaxAttrs(0) != 0 and A.SoftmaxAttrs(0) != (0,)


def test_attrs_are_frozen_and_usable_as_keys() -> None:
    attrs = A.FullAttrs((2, 2), 1.0, DType.F32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        attrs.value = 2.0  # type: ignore[misc]
    table = {attrs: "a", A.FullAttrs((2, 2), 1, DType.F32): "b"}
    assert table[A.FullAttrs((2, 2), 1.0, DType.F32)] == "a"
    assert table[A.FullAttrs((2, 2), 1, DType.F32)] == "b"


def test_every_op_with_attributes_has_an_attrs_class() -> None:
    for op, cls in ATTRS_OF.items():
        assert isinstance(op, Op)
        assert issubclass(cls, A.Attrs) and cls is not NoAttrs
    assert A.attrs_class_of(Op.RELU) is NoAttrs
    assert A.attrs_class_of(Op.SOFTMAX) is A.SoftmaxAttrs
