"""Tensor types of the IR: an element type (DType) and a static shape."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class DType(enum.Enum):
    """Element types kiln models; the value is the short name used in IR text."""

    F64 = "f64"
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U8 = "u8"
    BOOL = "bool"

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize

    @property
    def is_floating(self) -> bool:
        return self.torch.is_floating_point

    @staticmethod
    def from_torch(dtype: torch.dtype) -> DType:
        """The kiln DType of a torch dtype; UnsupportedDType for complex, quantized, ..."""
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise UnsupportedDType(dtype) from None

    @staticmethod
    def parse(name: str) -> DType:
        try:
            return DType(name)
        except ValueError:
            known = ", ".join(d.value for d in DType)
            raise ValueError(f"unknown dtype {name!r}; known: {known}") from None


class UnsupportedDType(TypeError):
    def __init__(self, dtype: object) -> None:
        super().__init__(f"dtype {dtype} is not supported by kiln")
        self.dtype = dtype


_TO_TORCH = {
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
_FROM_TORCH = {t: d for d, t in _TO_TORCH.items()}


@dataclass(frozen=True, slots=True)
class TensorType:
    """A dense tensor of a static shape; shape () is a scalar."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        if any(not isinstance(d, int) or d < 0 for d in self.shape):
            raise ValueError(f"shape must be non-negative ints, got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @staticmethod
    def of(tensor: torch.Tensor) -> TensorType:
        """The type of a dense strided tensor (raises UnsupportedDType / TypeError otherwise)."""
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise UnsupportedDType(f"{tensor.layout} tensor" if not tensor.is_quantized else
                                   tensor.dtype)
        return TensorType(tuple(int(d) for d in tensor.shape), DType.from_torch(tensor.dtype))

    def __str__(self) -> str:
        return f"{self.dtype.value}[{', '.join(map(str, self.shape))}]"
