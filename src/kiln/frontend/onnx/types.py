"""ONNX element types <-> torch dtypes, and ONNX tensors <-> torch tensors."""

from __future__ import annotations

import numpy as np
import torch

import onnx
from kiln.frontend.onnx.errors import OnnxImportError
from onnx import TensorProto, numpy_helper

_TO_TORCH = {
    TensorProto.FLOAT: torch.float32, TensorProto.DOUBLE: torch.float64,
    TensorProto.FLOAT16: torch.float16, TensorProto.BFLOAT16: torch.bfloat16,
    TensorProto.INT64: torch.int64, TensorProto.INT32: torch.int32,
    TensorProto.INT16: torch.int16, TensorProto.INT8: torch.int8,
    TensorProto.UINT8: torch.uint8, TensorProto.UINT16: torch.uint16,
    TensorProto.UINT32: torch.uint32, TensorProto.UINT64: torch.uint64,
    TensorProto.BOOL: torch.bool,
    TensorProto.COMPLEX64: torch.complex64, TensorProto.COMPLEX128: torch.complex128,
}
_TO_ONNX = {t: e for e, t in _TO_TORCH.items()}


def torch_dtype(elem_type: int) -> torch.dtype:
    if elem_type not in _TO_TORCH:
        name = TensorProto.DataType.Name(elem_type) if elem_type in \
            TensorProto.DataType.values() else str(elem_type)
        raise OnnxImportError(f"kiln does not take ONNX element type {name}")
    return _TO_TORCH[elem_type]


def onnx_dtype(dtype: torch.dtype) -> int:
    if dtype not in _TO_ONNX:
        raise OnnxImportError(f"torch dtype {dtype} has no ONNX element type kiln knows")
    return _TO_ONNX[dtype]


# torch converts these to and from numpy only as signed integers of the same width
_UNSIGNED = {torch.uint16: (np.uint16, np.int16, torch.int16),
             torch.uint32: (np.uint32, np.int32, torch.int32),
             torch.uint64: (np.uint64, np.int64, torch.int64)}
_FROM_NUMPY = {np.dtype(u): (t, s) for t, (u, s, _) in _UNSIGNED.items()}


def to_numpy(x: torch.Tensor) -> np.ndarray:
    """bfloat16 has no numpy dtype: it travels as onnx's own (ml_dtypes) bfloat16."""
    x = x.detach().cpu().contiguous()
    if x.dtype == torch.bfloat16:
        bits = x.view(torch.int16).numpy()
        return bits.view(onnx.helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16))
    if x.dtype in _UNSIGNED:
        unsigned, _, signed = _UNSIGNED[x.dtype]
        return x.view(signed).numpy().view(unsigned)
    return x.numpy()


def from_numpy(a: np.ndarray, elem_type: int | None = None) -> torch.Tensor:
    a = np.array(a, copy=True)  # owned and contiguous: torch shares its memory
    if elem_type == TensorProto.BFLOAT16 or str(a.dtype) == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype in _FROM_NUMPY:
        unsigned, signed = _FROM_NUMPY[a.dtype]
        return torch.from_numpy(a.view(signed)).view(unsigned)
    return torch.from_numpy(a)


def tensor_of(proto: TensorProto) -> torch.Tensor:
    """A Constant's or an initializer's value, with its ONNX element type."""
    dtype = torch_dtype(proto.data_type)
    return from_numpy(numpy_helper.to_array(proto), proto.data_type).to(dtype)
