"""Views of the arena made once: a view of memory the executor binds to the same place on
every call is the same tensor on every call.

An intermediate the memory plan places is written into the same slot of the per-thread
arena on every call (by a library call's ``out=``, or a generated kernel with no layout
check in front of it). A view of it (a reshape, a permute, a split of a merged QKV GEMM's
result into its heads) is then the same view every time, and so is a view of that view. The
executor asks for them with the arena's slots instead of calling ATen for them on every call,
where each call went through the dispatcher: after a kernel that streamed megabytes, those
calls found none of their code in cache (Zen 3, 2 threads: a split 54-85 us, a reshape up
to 58 us, against 2 us in a loop)::

    v28_0, v28_1, v28_2, = K_split(v27_mm, [512, 512, 512], 1)   ->   v28_0, v28_1, v28_2 = \\
    v29_view_1 = v28_0.reshape((1, 128, 8, 64))                         buf[90], buf[91], buf[92]
                                                                   v29_view_1 = buf[93]

Only a view that aliases its source qualifies: a reshape that would copy (its source's
strides do not allow the view) still runs on every call. Whether it aliases is decided on a
meta tensor with the source's strides, and checked again when the arena makes the view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op, OpGroup

__all__ = ["FixedViews"]


@dataclass
class FixedViews:
    """The values bound to the same memory on every call (arena slots and views of them),
    each with its index in the arena's tuple and a meta tensor with its strides; and the
    views to make once (their source's index, the node)."""

    first_index: int  # the first index after the slots
    index: dict[Value, int] = field(default_factory=dict)
    meta: dict[Value, torch.Tensor] = field(default_factory=dict)
    recipes: list[tuple[int, Node]] = field(default_factory=list)

    def fix_slot(self, value: Value, slot: int, strides: Sequence[int] | None) -> None:
        """``value`` is written into arena slot ``slot`` on every call, with ``strides``."""
        shape = tuple(value.type.shape)
        dtype = value.type.dtype.torch
        self.index[value] = slot
        self.meta[value] = torch.empty(shape, dtype=dtype, device="meta") if strides is None \
            else torch.empty_strided(shape, tuple(strides), dtype=dtype, device="meta")

    def derive(self, node: Node, keep: set[Value]) -> list[int] | None:
        """The arena indices of ``node``'s outputs where it is a view of a fixed value that
        aliases it (recorded to be made once); None where it must run on every call (not a
        view, a copying reshape, a source not fixed, an output in ``keep``)."""
        if not node.op.is_a(OpGroup.VIEW) or not node.inputs or not node.types:
            return None
        source = node.inputs[0]
        if source not in self.index or any(v in keep for v in node.outputs) or any(
                v.node.op is not Op.SCALAR for v in node.inputs[1:]):
            return None
        try:
            results = evaluate_node(node, _operands(node, self.meta[source]), _NO_GRAPH)
        except Exception:  # noqa: BLE001 - a view the meta device cannot make: run it
            return None
        if len(results) != len(node.outputs) or not all(
                isinstance(r, torch.Tensor) and r._is_view() for r in results):
            return None
        start = self.first_index + sum(len(n.outputs) for _, n in self.recipes)
        self.recipes.append((self.index[source], node))
        indices = list(range(start, start + len(results)))
        for value, result, i in zip(node.outputs, results, indices):
            self.index[value], self.meta[value] = i, result
        return indices

    def made(self, slots: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``slots`` and the views made of them, in index order."""
        tensors = list(slots)
        storage = slots[0].untyped_storage().data_ptr() if slots else None
        for source, node in self.recipes:
            views = evaluate_node(node, _operands(node, tensors[source]), _NO_GRAPH)
            for view in views:
                if view.untyped_storage().data_ptr() != storage:  # (never, as decided)
                    raise RuntimeError(f"kiln: the view {node.name!r} ({node.op.text}) of the "
                                       f"arena copied its source; please report this")
            tensors.extend(views)
        return tuple(tensors)


def _operands(node: Node, source: torch.Tensor) -> list[object]:
    return [source] + [v.node.attrs.value for v in node.inputs[1:]]  # type: ignore[attr-defined]


# views read no constants: the graph evaluate_node needs for those is never consulted
_NO_GRAPH = Graph((), (), ())
