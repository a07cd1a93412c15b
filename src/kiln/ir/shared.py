"""Tensors made from a model's weights once, and shared by all its compiles.

A graph that Dynamo hands over with symbolic shapes is compiled once per input shape
(`kiln.frontend.fx_compile`), and each compile folded and packed its own copy of every
weight: HF BERT under ``torch.compile`` grew by about 350 MB of resident memory for each
new sequence length (1.3 GB after the first, 4.6 GB after ten). Folding
(`kiln.passes.fold`) and packing (`kiln.kernels`) ask `shared` instead of computing: it
returns what an earlier call made from the same sources by the same recipe, where

* each tensor source has the same memory, shape, strides, dtype and version (a weight
  changed in place since is made again, as `kiln.frontend.fx_compile` recompiles for it),
  and the same owner, still alive (the tensor itself, or the base of the view it is: a
  Linear weight's transpose): a tensor allocated at a freed one's address is not it;
* each other source has the same type and text (so -0.0 is not 0.0, and NaN is NaN);
* the recipe (a function, an op and the text of its attributes) is the same.

Nothing here keeps a tensor alive: what was made lives as long as a compiled graph holds it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

from kiln.ir.memory import in_memory_order

__all__ = ["all_finite", "packed", "shared"]

Made = TypeVar("Made", torch.Tensor, tuple[torch.Tensor, ...], list[torch.Tensor])
# the owners' refs, the results' refs, and what held them (None: a lone tensor)
_Entry = tuple[tuple["weakref.ref[torch.Tensor]", ...], tuple["weakref.ref[torch.Tensor]", ...],
               type | None]
_MADE: dict[Hashable, _Entry] = {}
# the table is swept for dead entries when it reaches this size, which then doubles what
# stays alive: a sweep per insertion made compiling quadratic in a model's weights (Inception
# v3, compiled a third time in one process: 1.7 s of 5.5 sweeping ~900 times)
_SWEEP_FROM = 256
_sweep_at = _SWEEP_FROM
# `all_finite`'s answers by the same key, with their owner's ref; swept the same way
_FINITE: dict[Hashable, tuple[weakref.ref[torch.Tensor], bool]] = {}
_finite_sweep_at = _SWEEP_FROM


def shared(recipe: Hashable, sources: Sequence[Any], make: Callable[[], Made]) -> Made:
    """``make()``, or what it made earlier from the same ``sources`` by the same ``recipe``
    (see the module docstring). Not shared: results that are not tensors, or sources
    without a version (inference tensors)."""
    key = _key(recipe, sources)
    owners = tuple(_owner(s) for s in sources if isinstance(s, torch.Tensor))
    found = _MADE.get(key) if key is not None else None
    if found is not None:
        owner_refs, made_refs, holder = found
        made = tuple(r() for r in made_refs)
        if all(r() is o for r, o in zip(owner_refs, owners)) and None not in made:
            return made[0] if holder is None else holder(made)  # type: ignore[return-value]
    result = make()
    holder = None if isinstance(result, torch.Tensor) else type(result)
    parts = (result,) if holder is None else tuple(result)
    if key is not None and holder in (None, tuple, list) \
            and all(isinstance(t, torch.Tensor) for t in parts):
        if len(_MADE) >= _sweep_at:
            _drop_dead()
        _MADE[key] = (tuple(weakref.ref(o) for o in owners),
                      tuple(weakref.ref(t) for t in parts), holder)
    return result


def packed(pack: Callable[..., torch.Tensor], weight: torch.Tensor, *params: Any
           ) -> torch.Tensor:
    """``pack(weight, *params)`` (a kernel's weight layout), shared as `shared` says."""
    return shared(pack, (weight, *params), lambda: pack(weight, *params))


def all_finite(t: torch.Tensor) -> bool:
    """``torch.isfinite(t).all()``, remembered per tensor by `shared`'s key (the same memory,
    shape, strides, dtype and version, the owner still alive): the layout pass, the
    padding fold and the direct-convolution and library refusals each ask it of the same
    weights, several times a compile."""
    key = _key(all_finite, (t,))
    owner = _owner(t)
    found = _FINITE.get(key) if key is not None else None
    if found is not None and found[0]() is owner:
        return found[1]
    answer = bool(torch.isfinite(in_memory_order(t)).all())
    if key is not None:
        global _finite_sweep_at
        if len(_FINITE) >= _finite_sweep_at:
            _finite_sweep_at = _swept(_FINITE, lambda entry: entry[0]() is None)
        _FINITE[key] = (weakref.ref(owner), answer)
    return answer


def _owner(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def _key(recipe: Hashable, sources: Sequence[Any]) -> Hashable | None:
    parts: list[Hashable] = [recipe]
    for s in sources:
        if isinstance(s, torch.Tensor):
            try:
                version = s._version
            except RuntimeError:  # an inference tensor: no version to tell a change by
                return None
            parts.append((s.data_ptr(), tuple(s.shape), tuple(s.stride()), s.dtype, version))
        else:
            parts.append((type(s), repr(s)))
    try:
        hash(tuple(parts))
    except TypeError:
        return None
    return tuple(parts)


def _drop_dead() -> None:
    """Forget the entries whose owner or result is gone (`_swept`)."""
    global _sweep_at
    _sweep_at = _swept(_MADE, lambda entry: any(r() is None for r in (*entry[0], *entry[1])))


def _swept(table: dict[Hashable, Any], dead: Callable[[Any], bool]) -> int:
    """Forget ``table``'s ``dead`` entries; the size at which to sweep again: when the live
    ones have doubled. Over a copy of the entries, and tolerant of keys gone meanwhile:
    another thread may compile at the same time."""
    for k in [k for k, entry in list(table.items()) if dead(entry)]:
        table.pop(k, None)
    return max(_SWEEP_FROM, 2 * len(table))
