"""RMSNorm written out in arithmetic, found as the work of one row kernel.

Llama, Mistral, Qwen, T5, Gemma and most recent transformers write their norm by hand::

    %p = pow(%x, 2)                          (or mul(%x, %x))
    %m = mean(%p) {dims=(-1,), keepdim=True}
    %e = add(%m, eps)
    %r = rsqrt(%e)
    %n = mul(%x, %r)                         (either operand order)
    %y = mul(%w, %n)                         (optional: a weight over the last axis)

Partitioned op by op that is three kernels (squares, their mean, the scaling) and three trips
over the rows; as one pattern it is one row kernel that reads each row once
(`kiln.kernels.rows_schedule.rmsnorm_rows`), computing the same operations in the same order.
Only the mean's lane-wise sum differs from ATen's, as every generated reduction does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kiln.ir.attrs import ReduceAttrs
from kiln.ir.graph import Node, Value
from kiln.ir.ops import Op
from kiln.ir.types import DType

__all__ = ["RmsNorm", "rms_norm_at"]


@dataclass(frozen=True)
class RmsNorm:
    """One matched RMSNorm: ``x * rsqrt(mean(x ** 2) + eps) [* weight]`` over x's last axis."""

    x: Value
    eps: float
    weight: Value | None
    nodes: tuple[Node, ...]  # square, mean, add, rsqrt, product with x[, product with weight]

    @property
    def last(self) -> Node:
        return self.nodes[-1]


def rms_norm_at(mean: Node, users: Mapping[Node, Sequence[Node]], outside: Collection[Value],
                weighted: bool = True) -> RmsNorm | None:
    """The RMSNorm whose mean of squares is ``mean``, or None. ``users``: each node's readers;
    ``outside``: values read by anything else (returned values, a group's outputs): none of
    the pattern's intermediates may be, so the kernel need not write them. ``weighted``
    false: the norm ends at its scaling even where a weight's product follows."""
    attrs = mean.attrs
    if mean.op is not Op.MEAN or not isinstance(attrs, ReduceAttrs) or not attrs.keepdim:
        return None
    square = mean.inputs[0].node
    x = _squared(square)
    if x is None or x.type.dtype is not DType.F32 or x.type.rank == 0 or x.type.shape[-1] == 0:
        return None
    rank = x.type.rank
    if attrs.dims is None or len(attrs.dims) != 1 or attrs.dims[0] % rank != rank - 1:
        return None
    shape = x.type.shape
    chain = [square, mean]
    add = _sole_user(mean, users, outside)
    eps = _scalar_operand(add, mean.out()) if add is not None and add.op is Op.ADD else None
    if add is None or eps is None:
        return None
    chain.append(add)
    rsqrt = _sole_user(add, users, outside)
    if rsqrt is None or rsqrt.op is not Op.RSQRT:
        return None
    chain.append(rsqrt)
    scale = _sole_user(rsqrt, users, outside)
    if scale is None or scale.op is not Op.MUL or scale.type.shape != shape \
            or set(scale.inputs) != {x, rsqrt.out()} or len(scale.inputs) != 2:
        return None
    if _sole_user(square, users, outside) is not mean:
        return None
    chain.append(scale)
    weight = None
    product = _sole_user(scale, users, outside) if weighted else None
    if product is not None and product.op is Op.MUL and product.type.shape == shape:
        other = [v for v in product.inputs if v != scale.out()]
        w = other[0] if len(other) == 1 else None
        if w is not None and w.node.op is not Op.SCALAR and w.type.shape == shape[-1:] \
                and w.type.dtype is DType.F32:
            weight = w
            chain.append(product)
    if any(t.dtype is not DType.F32 for n in chain for t in n.types):
        return None
    return RmsNorm(x, eps, weight, tuple(chain))


def _squared(node: Node) -> Value | None:
    """x where ``node`` is ``pow(x, 2)`` or ``mul(x, x)``."""
    if node.op is Op.POW and len(node.inputs) == 2:
        exponent = node.inputs[1].node
        if exponent.op is Op.SCALAR and exponent.attrs.value == 2:  # type: ignore[attr-defined]
            return node.inputs[0]
    if node.op is Op.MUL and len(node.inputs) == 2 and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    return None


def _sole_user(node: Node, users: Mapping[Node, Sequence[Node]], outside: Collection[Value]
               ) -> Node | None:
    readers = users.get(node, ())
    if len(readers) != 1 or node.out() in outside:
        return None
    return readers[0]


def _scalar_operand(node: Node, operand: Value) -> float | None:
    """c where ``node`` is ``operand + c`` or ``c + operand`` with c a real Python number."""
    if len(node.inputs) != 2 or operand not in node.inputs:
        return None
    other = node.inputs[1] if node.inputs[0] == operand else node.inputs[0]
    if other.node.op is not Op.SCALAR:
        return None
    value = other.node.attrs.value  # type: ignore[attr-defined]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
