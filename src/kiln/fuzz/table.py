"""Which maker builds which op, which ops no step chooses (and why), and how often each is
chosen."""

from __future__ import annotations

from collections.abc import Callable

from kiln.fuzz.generate import Draft
from kiln.fuzz.makers import (
    make_arange,
    make_arg_reduce,
    make_batch_norm,
    make_binary,
    make_call,
    make_cast,
    make_cat,
    make_clone,
    make_div,
    make_expand,
    make_full,
    make_layer_norm,
    make_pad,
    make_permute,
    make_reduce,
    make_select,
    make_slice,
    make_softmax,
    make_split,
    make_squeeze,
    make_to_layout,
    make_unary,
    make_unsqueeze,
    make_view,
    make_where,
)
from kiln.fuzz.makers_attention import make_attention
from kiln.fuzz.makers_contraction import (
    make_adaptive_pool,
    make_addmm,
    make_conv_act,
    make_convolution,
    make_embedding,
    make_mm,
    make_pool,
)
from kiln.ir.ops import Op, OpGroup

Maker = Callable[[Draft, Op], None]


def make_any_call(d: Draft, op: Op) -> None:
    """An ATen op kiln does not model: fused attention half the time (it has kernels of its
    own), else a cumsum, flip, roll or triu (`make_call`)."""
    (make_attention if d.rng.random() < 0.5 else make_call)(d, op)

# Ops no step chooses, and why. Every other op of `Op` has a maker (tests check both).
EXCLUDED: dict[Op, str] = {
    Op.INPUT: "a source: makers create graph inputs as operands",
    Op.CONSTANT: "a source: makers create weights as operands",
    Op.SCALAR: "a source: makers create Python numbers as operands",
}

MAKERS: dict[Op, Maker] = {
    **{op: make_unary for op in Op if op.is_a(OpGroup.UNARY) and op is not Op.CAST},
    Op.CAST: make_cast,
    **{op: make_binary for op in Op if op.is_a(OpGroup.BINARY) and op is not Op.DIV},
    Op.DIV: make_div,
    Op.WHERE: make_where,
    Op.SUM: make_reduce, Op.MEAN: make_reduce, Op.AMAX: make_reduce, Op.AMIN: make_reduce,
    Op.VAR: make_reduce,
    Op.ARGMAX: make_arg_reduce, Op.ARGMIN: make_arg_reduce,
    Op.SOFTMAX: make_softmax, Op.LOG_SOFTMAX: make_softmax,
    Op.LAYER_NORM: make_layer_norm, Op.BATCH_NORM: make_batch_norm,
    Op.VIEW: make_view, Op.PERMUTE: make_permute, Op.EXPAND: make_expand,
    Op.SQUEEZE: make_squeeze, Op.UNSQUEEZE: make_unsqueeze, Op.SLICE: make_slice,
    Op.SELECT: make_select, Op.SPLIT: make_split, Op.CAT: make_cat, Op.CLONE: make_clone,
    Op.TO_LAYOUT: make_to_layout, Op.PAD: make_pad,
    Op.MM: make_mm, Op.BMM: make_mm, Op.ADDMM: make_addmm, Op.ADDMM_ACT: make_addmm,
    Op.CONVOLUTION: make_convolution, Op.CONV_ACT: make_conv_act,
    Op.EMBEDDING: make_embedding,
    Op.MAX_POOL2D: make_pool, Op.AVG_POOL2D: make_pool,
    Op.ADAPTIVE_AVG_POOL2D: make_adaptive_pool,
    Op.FULL: make_full, Op.ARANGE: make_arange,
    Op.CALL: make_any_call,
}

GENERATED_OPS: tuple[Op, ...] = tuple(op for op in Op if op in MAKERS)

_WEIGHTS: dict[Op, float] = {Op.FULL: 0.3, Op.ARANGE: 0.3, Op.CALL: 1.0, Op.CAST: 1.5,
                             Op.CLONE: 0.5, Op.TO_LAYOUT: 0.5}


def weight_of(op: Op) -> float:
    if op in _WEIGHTS:
        return _WEIGHTS[op]
    if op.is_a(OpGroup.BINARY):
        return 1.5
    if op.is_a(OpGroup.CONTRACTION | OpGroup.NORMALIZATION):
        return 1.5
    return 1.0
