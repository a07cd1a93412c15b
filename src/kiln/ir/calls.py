"""What kiln may assume of an opaque ATen call (a CALL node): effects, randomness, aliasing.

A CALL whose op mutates an argument or is registered with an effect (``_linalg_check_errors``
raising on a singular matrix, reached through ``with_effects``), or returns nothing (a run-time
assertion), must run even when nothing reads its result, in graph order; a seeded random op
must not be merged or folded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch._higher_order_ops.effects import has_effects

from kiln.ir.ops import Op

if TYPE_CHECKING:
    from kiln.ir.graph import Node


def has_effect(node: Node) -> bool:
    if node.op is not Op.CALL:
        return False
    return target_has_effect(node.attrs.target)  # type: ignore[attr-defined]


def is_pure(node: Node) -> bool:
    """Same operands, same result, nothing else changes: safe to merge, fold or drop."""
    if node.op is not Op.CALL:
        return True
    return pure_target(node.attrs.target)  # type: ignore[attr-defined]


def target_has_effect(target: Any) -> bool:
    """The ATen overload mutates an argument, is registered with an effect, or returns
    nothing (so that it exists for its effect: ``_assert_async`` raises on a false
    condition, as ``one_hot``'s bounds check does)."""
    schema = target._schema
    return bool(schema.is_mutable) or has_effects(target) or not schema.returns


def pure_target(target: Any) -> bool:
    """The ATen overload neither has an effect nor draws random numbers."""
    return torch.Tag.nondeterministic_seeded not in target.tags and not target_has_effect(
        target)


def results_alias_operands(node: Node) -> bool:
    """The op may return a view of an operand (its schema says so)."""
    schema = node.attrs.target._schema  # type: ignore[attr-defined]
    return any(r.alias_info is not None for r in schema.returns)
