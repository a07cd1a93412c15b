"""kiln.ir.types: DType <-> torch.dtype, TensorType, and what kiln refuses to model."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import DType, TensorType, UnsupportedDType

TORCH_OF = {
    DType.F64: torch.float64,
    DType.F32: torch.float32,
    DType.F16: torch.float16,
    DType.BF16: torch.bfloat16,
    DType.I64: torch.int64,
    DType.I32: torch.int32,
    DType.I16: torch.int16,
    DType.I8: torch.int8,
    DType.U8: torch.uint8,
    DType.BOOL: torch.bool,
}


def test_every_dtype_is_mapped() -> None:
    assert set(TORCH_OF) == set(DType)


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.value)
def test_dtype_round_trips_through_torch(dtype: DType) -> None:
    assert dtype.torch is TORCH_OF[dtype]
    assert DType.from_torch(dtype.torch) is dtype
    assert DType.parse(dtype.value) is dtype
    assert dtype.itemsize == torch.empty((), dtype=dtype.torch).element_size()
    assert dtype.is_floating == dtype.torch.is_floating_point


@pytest.mark.parametrize("dtype", [
    torch.complex64, torch.complex128, torch.quint8, torch.qint8, torch.qint32,
    torch.float8_e4m3fn, torch.uint16,
], ids=str)
def test_unsupported_torch_dtypes_raise(dtype: torch.dtype) -> None:
    with pytest.raises(UnsupportedDType, match="not supported by kiln") as info:
        DType.from_torch(dtype)
    assert info.value.dtype == dtype
    assert isinstance(info.value, TypeError)


def test_type_of_complex_tensor_is_unsupported() -> None:
    with pytest.raises(UnsupportedDType):
        TensorType.of(torch.zeros(2, dtype=torch.complex64))


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions:UserWarning")
def test_type_of_quantized_tensor_is_unsupported() -> None:
    q = torch.quantize_per_tensor(torch.rand(4), scale=0.1, zero_point=0, dtype=torch.quint8)
    with pytest.raises(UnsupportedDType):
        TensorType.of(q)


def test_type_of_sparse_tensor_is_unsupported() -> None:
    with pytest.raises(UnsupportedDType, match="sparse"):
        TensorType.of(torch.eye(3).to_sparse())


def test_parse_unknown_dtype_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'f33'.*f32"):
        DType.parse("f33")


def test_tensor_type_of_a_dense_tensor() -> None:
    t = TensorType.of(torch.zeros(2, 3, dtype=torch.int32))
    assert t == TensorType((2, 3), DType.I32)
    assert (t.rank, t.numel, t.nbytes) == (2, 6, 24)
    assert str(t) == "i32[2, 3]"


def test_scalar_tensor_type() -> None:
    t = TensorType((), DType.F64)
    assert (t.rank, t.numel, t.nbytes, str(t)) == (0, 1, 8, "f64[]")


@pytest.mark.parametrize("shape", [(-1,), (2.0,), (2, None)])
def test_tensor_type_rejects_bad_shapes(shape: tuple) -> None:
    with pytest.raises(ValueError, match="non-negative ints"):
        TensorType(shape, DType.F32)


def test_tensor_types_are_hashable_values() -> None:
    a = TensorType((2, 3), DType.F32)
    assert a == TensorType((2, 3), DType.F32)
    assert a != TensorType((2, 3), DType.F64)
    assert len({a, TensorType((2, 3), DType.F32), TensorType((3, 2), DType.F32)}) == 2
