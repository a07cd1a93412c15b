"""Typed attributes: one frozen dataclass per kind of op that has attributes.

Attributes compare by value *and* kind of number: ``1``, ``1.0`` and ``True`` are different
attributes (ATen promotes them differently) and so are ``0.0`` and ``-0.0``; NaN equals NaN.
That makes attribute equality safe to use for common-subexpression elimination.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass
from typing import Any

from kiln.ir.ops import Op
from kiln.ir.types import DType

Number = bool | int | float


def canonical(value: Any) -> Any:
    """A hashable key that tells apart 1/1.0/True and 0.0/-0.0, and equates NaNs."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", struct.pack("<d", math.nan) if math.isnan(value) else
                struct.pack("<d", value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, canonical(v)) for k, v in value.items()))
    return value


class Attrs:
    """Base of all attribute classes: equality and hashing through `canonical`."""

    def _key(self) -> tuple[Any, ...]:
        # computed once per (frozen) instance: graph searches hash the same attributes often
        key = self.__dict__.get("_canonical_key")
        if key is None:
            key = (type(self),) + tuple(
                canonical(getattr(self, f.name)) for f in dataclasses.fields(self))  # type: ignore[arg-type]
            self.__dict__["_canonical_key"] = key
        return key

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._key())


def attrs_class(cls: type) -> type:
    """Frozen dataclass whose equality comes from Attrs, not from the dataclass."""
    return dataclass(frozen=True, eq=False, slots=True)(cls)


@attrs_class
class NoAttrs(Attrs):
    pass


NO_ATTRS = NoAttrs()


@attrs_class
class InputAttrs(Attrs):
    index: int


@attrs_class
class ConstantAttrs(Attrs):
    name: str  # key into Graph.constants


@attrs_class
class ScalarAttrs(Attrs):
    value: Number


@attrs_class
class FullAttrs(Attrs):
    shape: tuple[int, ...]
    value: Number
    dtype: DType


@attrs_class
class ArangeAttrs(Attrs):
    start: Number
    end: Number
    step: Number
    dtype: DType


@attrs_class
class GeluAttrs(Attrs):
    approximate: str = "none"  # "none" (erf) or "tanh"


@attrs_class
class LeakyReluAttrs(Attrs):
    negative_slope: float = 0.01


@attrs_class
class ClampAttrs(Attrs):
    min: Number | None
    max: Number | None


@attrs_class
class CastAttrs(Attrs):
    dtype: DType


@attrs_class
class DivAttrs(Attrs):
    rounding_mode: str | None = None  # None, "trunc" or "floor"


@attrs_class
class ReduceAttrs(Attrs):
    dims: tuple[int, ...] | None  # None: every dimension
    keepdim: bool = False


@attrs_class
class ArgReduceAttrs(Attrs):
    dim: int | None
    keepdim: bool = False


@attrs_class
class VarAttrs(Attrs):
    dims: tuple[int, ...] | None
    correction: Number = 1
    keepdim: bool = False


@attrs_class
class SoftmaxAttrs(Attrs):
    dim: int


@attrs_class
class LayerNormAttrs(Attrs):
    normalized_shape: tuple[int, ...]
    eps: float


@attrs_class
class BatchNormAttrs(Attrs):
    eps: float


@attrs_class
class ShapeAttrs(Attrs):
    shape: tuple[int, ...]


@attrs_class
class PermuteAttrs(Attrs):
    dims: tuple[int, ...]


@attrs_class
class SqueezeAttrs(Attrs):
    dims: tuple[int, ...]


@attrs_class
class DimAttrs(Attrs):
    dim: int


@attrs_class
class SliceAttrs(Attrs):
    dim: int
    start: int
    end: int
    step: int = 1


@attrs_class
class SelectAttrs(Attrs):
    dim: int
    index: int


@attrs_class
class SplitAttrs(Attrs):
    sizes: tuple[int, ...]
    dim: int


@attrs_class
class PadAttrs(Attrs):
    pad: tuple[int, ...]  # ATen order: last dimension first, (before, after) pairs
    value: Number = 0.0


@attrs_class
class AddmmAttrs(Attrs):
    beta: Number = 1
    alpha: Number = 1


@attrs_class
class ConvAttrs(Attrs):
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int


@attrs_class
class AddmmActAttrs(Attrs):
    """addmm, then ``activation`` (an elementwise unary op) with its ``act_args``."""

    activation: Op
    act_args: tuple[Any, ...] = ()  # gelu: (approximate,); clamp: (min, max); leaky: (slope,)
    beta: Number = 1
    alpha: Number = 1


@attrs_class
class ConvActAttrs(Attrs):
    """convolution (operands x, w[, bias][, residual]), + residual, then ``activation``."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    has_bias: bool
    has_residual: bool
    activation: Op | None
    act_args: tuple[Any, ...] = ()


@attrs_class
class LayoutAttrs(Attrs):
    channels_last: bool  # True: NHWC order in memory; False: the standard contiguous order


@attrs_class
class MaxPoolAttrs(Attrs):
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool


@attrs_class
class AvgPoolAttrs(Attrs):
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    ceil_mode: bool
    count_include_pad: bool
    divisor_override: int | None


@attrs_class
class AdaptivePoolAttrs(Attrs):
    output_size: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Operand:
    """In a call template: the operand at this position of the node's inputs."""

    index: int


@attrs_class
class CallAttrs(Attrs):
    """An ATen op kiln does not model, with its arguments as a template.

    ``args``/``kwargs`` hold the original arguments with every tensor replaced by an
    `Operand`; lists are stored as tuples so that the attributes are hashable.
    """

    target: Any  # torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


ATTRS_OF: dict[Op, type[Attrs]] = {
    Op.INPUT: InputAttrs,
    Op.CONSTANT: ConstantAttrs,
    Op.SCALAR: ScalarAttrs,
    Op.FULL: FullAttrs,
    Op.ARANGE: ArangeAttrs,
    Op.GELU: GeluAttrs,
    Op.LEAKY_RELU: LeakyReluAttrs,
    Op.CLAMP: ClampAttrs,
    Op.CAST: CastAttrs,
    Op.DIV: DivAttrs,
    Op.SUM: ReduceAttrs,
    Op.MEAN: ReduceAttrs,
    Op.AMAX: ReduceAttrs,
    Op.AMIN: ReduceAttrs,
    Op.ARGMAX: ArgReduceAttrs,
    Op.ARGMIN: ArgReduceAttrs,
    Op.VAR: VarAttrs,
    Op.SOFTMAX: SoftmaxAttrs,
    Op.LOG_SOFTMAX: SoftmaxAttrs,
    Op.LAYER_NORM: LayerNormAttrs,
    Op.BATCH_NORM: BatchNormAttrs,
    Op.VIEW: ShapeAttrs,
    Op.EXPAND: ShapeAttrs,
    Op.PERMUTE: PermuteAttrs,
    Op.SQUEEZE: SqueezeAttrs,
    Op.UNSQUEEZE: DimAttrs,
    Op.CAT: DimAttrs,
    Op.SLICE: SliceAttrs,
    Op.SELECT: SelectAttrs,
    Op.SPLIT: SplitAttrs,
    Op.PAD: PadAttrs,
    Op.ADDMM: AddmmAttrs,
    Op.CONVOLUTION: ConvAttrs,
    Op.ADDMM_ACT: AddmmActAttrs,
    Op.CONV_ACT: ConvActAttrs,
    Op.TO_LAYOUT: LayoutAttrs,
    Op.MAX_POOL2D: MaxPoolAttrs,
    Op.AVG_POOL2D: AvgPoolAttrs,
    Op.ADAPTIVE_AVG_POOL2D: AdaptivePoolAttrs,
    Op.CALL: CallAttrs,
}


def attrs_class_of(op: Op) -> type[Attrs]:
    return ATTRS_OF.get(op, NoAttrs)
