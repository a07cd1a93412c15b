"""Input values for fuzzed graphs: special floats, and the layouts inputs arrive in.

Values come in *profiles*, one per tensor: ``tame`` normal numbers, ``special`` normal
numbers sprinkled with NaN, ±inf, ±0.0 and subnormals, ``wide`` magnitudes from subnormal to
near overflow, and ``integral`` small whole numbers (rounding modes, floor, exact compares).
Integer tensors stay well away from the type's minimum: ``INT_MIN // -1`` traps (SIGFPE) in
ATen's integer division, which would kill the process, not report a mismatch.

A graph input arrives in a `Layout`: contiguous, a permuted copy viewed back into place
(non-contiguous strides), every other element of a larger buffer, an offset into a larger
buffer, a size-1 dimension expanded (stride 0), or the very tensor of an earlier input
(aliased). The logical values are the same in every layout; only the memory differs.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass

import torch

from kiln.ir.types import DType, TensorType


class Profile(enum.Enum):
    TAME = "tame"
    SPECIAL = "special"
    WIDE = "wide"
    INTEGRAL = "integral"


class LayoutKind(enum.Enum):
    CONTIGUOUS = "contiguous"
    PERMUTED = "permuted"  # a copy in reversed dimension order, permuted back: odd strides
    STRIDED = "strided"  # every other element along one dimension of a buffer twice as large
    OFFSET = "offset"  # starts a few elements into a larger buffer (contiguous strides)
    EXPANDED = "expanded"  # one dimension broadcast with stride 0 (values repeat along it)
    ALIAS = "alias"  # the same tensor object as an earlier input of the same type


@dataclass(frozen=True)
class Layout:
    kind: LayoutKind = LayoutKind.CONTIGUOUS
    arg: int = 0  # STRIDED / EXPANDED: the dimension; ALIAS: the earlier input's position

    def __str__(self) -> str:
        if self.kind in (LayoutKind.STRIDED, LayoutKind.EXPANDED, LayoutKind.ALIAS):
            return f"{self.kind.value}({self.arg})"
        return self.kind.value


CONTIGUOUS = Layout()

_FLOAT_SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0)


def float_specials(dtype: DType) -> tuple[float, ...]:
    """NaN, ±inf, ±0, subnormals, and the largest and smallest normal magnitudes of ``dtype``."""
    info = torch.finfo(dtype.torch)
    subnormal = info.smallest_normal / 4
    return _FLOAT_SPECIALS + (subnormal, -subnormal, info.smallest_normal, info.max, -info.max,
                              info.max / 2, 1.0, -1.0)


def random_values(type_: TensorType, profile: Profile, gen: torch.Generator) -> torch.Tensor:
    """A contiguous tensor of ``type_`` whose values follow ``profile``."""
    shape, dtype = type_.shape, type_.dtype
    if dtype is DType.BOOL:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if not dtype.is_floating:
        return _integers(shape, dtype, profile, gen)
    if profile is Profile.INTEGRAL:
        x = torch.randint(-4, 5, shape, generator=gen).double()
        x = torch.where(torch.rand(shape, generator=gen) < 0.1, -0.0 * x.abs(), x)  # some -0.0
        return x.to(dtype.torch)
    if profile is Profile.WIDE:
        info = torch.finfo(dtype.torch)
        lo, hi = math.log2(info.smallest_normal) - 3, math.log2(info.max) - 0.5
        exponent = lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)
        sign = torch.randint(0, 2, shape, generator=gen).double() * 2 - 1
        return (sign * torch.exp2(exponent)).to(dtype.torch)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype.torch)
    if profile is Profile.SPECIAL and x.numel():
        specials = torch.tensor(float_specials(dtype), dtype=dtype.torch)
        pick = torch.randint(0, len(specials), shape, generator=gen)
        x = torch.where(torch.rand(shape, generator=gen) < 0.3, specials[pick], x)
    return x


def _integers(shape: tuple[int, ...], dtype: DType, profile: Profile,
              gen: torch.Generator) -> torch.Tensor:
    info = torch.iinfo(dtype.torch)
    if profile is Profile.WIDE:  # large, but no product of two reaches the int64 minimum
        lo, hi = max(info.min + 1, -(1 << 20)), min(info.max, 1 << 20)
    else:
        lo, hi = max(info.min + 1, -5), min(info.max, 6)
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype.torch)


def index_values(type_: TensorType, bound: int, gen: torch.Generator) -> torch.Tensor:
    """Indices in [0, bound) (embedding lookups)."""
    return torch.randint(0, max(bound, 1), type_.shape, generator=gen).to(type_.dtype.torch)


def positive_values(type_: TensorType, gen: torch.Generator) -> torch.Tensor:
    """Integers in [1, 9]: divisors for integer division with a rounding mode."""
    return torch.randint(1, 10, type_.shape, generator=gen).to(type_.dtype.torch)


def random_layout(rng: random.Random, values: torch.Tensor) -> Layout:
    """A layout other than ALIAS for an input holding ``values`` (the generator decides
    aliasing itself: it needs an earlier input of the same type)."""
    kinds = [LayoutKind.CONTIGUOUS] * 4 + [LayoutKind.OFFSET]
    if values.dim() >= 2:
        kinds += [LayoutKind.PERMUTED] * 2
    if values.dim() >= 1:
        kinds += [LayoutKind.STRIDED] * 2
    repeated = [d for d, n in enumerate(values.shape) if n > 1 and _constant_along(values, d)]
    if repeated:
        kinds += [LayoutKind.EXPANDED] * 2
    kind = rng.choice(kinds)
    if kind is LayoutKind.STRIDED:
        return Layout(kind, rng.randrange(values.dim()))
    if kind is LayoutKind.EXPANDED:
        return Layout(kind, rng.choice(repeated))
    return Layout(kind)


def repeat_along(values: torch.Tensor, dim: int) -> torch.Tensor:
    """``values`` with every slice along ``dim`` equal to the first (so EXPANDED can hold it)."""
    return values.narrow(dim, 0, 1).expand(values.shape).contiguous()


def _constant_along(values: torch.Tensor, dim: int) -> bool:
    first = values.narrow(dim, 0, 1).expand_as(values)
    if values.is_floating_point():  # bitwise: NaN equals NaN, -0.0 differs from 0.0
        return bool(torch.equal(bits(values), bits(first)))
    return bool(torch.equal(values, first))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a floating tensor as integers (so NaN == NaN and -0.0 != 0.0)."""
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view)


def materialize(values: torch.Tensor, layout: Layout,
                earlier: list[torch.Tensor]) -> torch.Tensor:
    """A fresh tensor with ``values`` in ``layout`` (ALIAS returns the earlier tensor)."""
    kind = layout.kind
    if kind is LayoutKind.ALIAS:
        return earlier[layout.arg]
    if kind is LayoutKind.PERMUTED and values.dim() >= 2:
        order = list(reversed(range(values.dim())))
        return values.permute(order).contiguous().permute(order)
    if kind is LayoutKind.STRIDED and values.dim() >= 1:
        d = layout.arg
        shape = list(values.shape)
        shape[d] *= 2
        buffer = _garbage(shape, values)
        view = buffer.as_strided(values.shape, [s * (2 if i == d else 1)
                                                for i, s in enumerate(buffer.stride())])
        view.copy_(values)
        return view
    if kind is LayoutKind.OFFSET:
        flat = _garbage([values.numel() + 3], values)
        view = flat[3:].view(values.shape)
        view.copy_(values)
        return view
    if kind is LayoutKind.EXPANDED and values.dim() > layout.arg:
        return values.narrow(layout.arg, 0, 1).clone().expand(values.shape)
    return values.clone()


def _garbage(shape: list[int], like: torch.Tensor) -> torch.Tensor:
    """A buffer whose unused elements hold values no correct result depends on."""
    if like.dtype.is_floating_point:
        return torch.full(shape, 12345.0, dtype=like.dtype)
    if like.dtype is torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    return torch.full(shape, 77, dtype=like.dtype)
