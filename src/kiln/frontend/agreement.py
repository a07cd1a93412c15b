"""Does the compiled model compute what the model computes? ``kiln.compile`` calls both once
on the example inputs and compares the results, so that neither a capture that differs from
the model nor a bug of kiln's on this graph reaches the user as a wrong answer: the model
then runs eagerly, with a warning that says which of the two it was.

A capture can differ. Hugging Face's AIMv2 text tower (transformers 5.24, sdpa attention,
an all-ones attention mask) is traced by torch.export and by Dynamo (its "eager" backend
too) with a causal mask that its eager call does not apply: the similarity logit came out
0.55 against the model's -0.81.

    why = disagreement(expected, got)     # None, or which output differs, and by how much

The comparison is loose enough for kiln's kernels, which sum in other orders than ATen's
(float32 differences near 1e-6 of an output's scale), and far tighter than what a wrong graph
gives. A model that draws random numbers (dropout in training mode, a random mask) is not
compared: two calls of it differ anyway, and each draw would move the caller's RNG.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

__all__ = ["ATOL", "RTOL", "Disagreement", "disagreement", "draws_random"]

# a float output agrees where its largest difference is at most RTOL of its largest finite
# magnitude, plus ATOL
RTOL = 1e-3
ATOL = 1e-5
# float types compared in their own precision (a float32 difference's rounding, 2^-24 of
# it, is far below RTOL); narrower ones are widened to float64 first
_WIDE = (torch.float32, torch.float64)


class Disagreement(RuntimeError):
    """The compiled model's results differ from the model's on the example inputs (raised
    with ``Options(strict=True)``; otherwise the model runs eagerly)."""


def draws_random(graph: torch.fx.GraphModule) -> bool:
    """Whether a call of the graph draws random numbers (an op tagged nondeterministic_seeded:
    dropout in training mode, rand, bernoulli, randperm, ...)."""
    for node in graph.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) \
                and torch.Tag.nondeterministic_seeded in target.tags \
                and not _told_not_to_draw(node, target):
            return True
    return False


def _told_not_to_draw(node: torch.fx.Node, op: torch._ops.OpOverload) -> bool:
    """An op tagged as drawing that is told not to: a dropout with ``train=False``, or an
    attention with ``dropout_p`` 0 (ATen's fused attention kernels), which draw nothing."""
    schema = op._schema.arguments
    names = [a.name for a in schema]

    def value(name: str) -> Any:
        at = names.index(name)
        if at < len(node.args):
            return node.args[at]
        default = schema[at].default_value if schema[at].has_default_value() else None
        return node.kwargs.get(name, default)

    if "train" in names:
        return value("train") is False
    if "dropout_p" in names:
        return value("dropout_p") == 0
    return False


def disagreement(expected: Any, got: Any) -> str | None:
    """Which output of ``got`` differs from ``expected`` (the model's), and how; None where
    every output agrees: the same structure, shapes and dtypes; equal integers and booleans;
    floats with NaN and infinities where the model has them, and the finite values within
    `RTOL` of the output's largest magnitude (plus `ATOL`). Sparse tensors are compared
    dense; a tensor torch cannot compare is not compared: this never raises."""
    want, want_spec = pytree.tree_flatten(expected)
    have, have_spec = pytree.tree_flatten(got)
    if len(want) != len(have):
        return f"the model returns {len(want)} values, the compiled model {len(have)}"
    for i, (e, g) in enumerate(zip(want, have)):
        where = f"output {i}" if len(want) > 1 else "the output"
        if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
            if type(e) is not type(g) or e != g:
                return f"{where} is {g!r} where the model's is {e!r}"
            continue
        try:
            why = _tensor_disagreement(e, g)
        except Exception:  # noqa: BLE001 - a tensor torch cannot compare so is not compared
            why = None
        if why is not None:
            return f"{where}: {why}"
    if want_spec != have_spec:
        return "the outputs come in another structure than the model's"
    return None


def _tensor_disagreement(e: torch.Tensor, g: torch.Tensor) -> str | None:
    if e.shape != g.shape or e.dtype != g.dtype:
        return (f"{str(g.dtype).removeprefix('torch.')}{list(g.shape)} where the model's is "
                f"{str(e.dtype).removeprefix('torch.')}{list(e.shape)}")
    if e.layout != torch.strided or g.layout != torch.strided:  # (sparse: compared dense)
        e, g = e.to_dense(), g.to_dense()
    if e.is_complex():  # (a conjugate or negative view resolved first)
        e, g = (torch.view_as_real(x.resolve_conj().resolve_neg()) for x in (e, g))
    if not e.is_floating_point():
        differ = int((e != g).sum())
        return f"{differ} of {e.numel()} values differ" if differ else None
    e, g = e.detach(), g.detach()
    if e.dtype not in _WIDE:  # (half and bfloat16: differences taken exactly)
        e, g = e.double(), g.double()
    if not e.numel():
        return None
    # both finite everywhere (aminmax gives NaN for a NaN, an infinity for one): the largest
    # value and difference in three passes without a mask, where the general path below
    # makes about a dozen in float64 (GPT-2's 128 x 50257 logits: 0.2-0.4 s of a compile)
    e_low, e_high, g_low, g_high = torch.stack([*torch.aminmax(e), *torch.aminmax(g)]).tolist()
    if all(math.isfinite(x) for x in (e_low, e_high, g_low, g_high)):
        d_low, d_high = torch.aminmax(e - g)  # (an overflow is an infinity: a disagreement)
        return _too_far(max(-d_low.item(), d_high.item()), max(-e_low, e_high))
    e, g = e.double(), g.double()
    finite = torch.isfinite(e)
    # NaN where the model has NaN, each infinity where the model has it (with its sign)
    same_special = torch.where(finite, torch.isfinite(g),
                               (e == g) | (torch.isnan(e) & torch.isnan(g)))
    if not bool(same_special.all()):
        count = int((~same_special).sum())
        return f"NaN or infinity at {count} of {e.numel()} positions where the model's differ"
    if not bool(finite.any()):
        return None
    return _too_far(float((e - g)[finite].abs().max()), float(e[finite].abs().max()))


def _too_far(error: float, scale: float) -> str | None:
    """The finite values' verdict: the largest difference against the largest magnitude."""
    if error > RTOL * scale + ATOL or math.isnan(error):
        return f"largest difference {error:.3g} against values up to {scale:.3g}"
    return None
