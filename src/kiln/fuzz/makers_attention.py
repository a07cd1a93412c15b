"""The attention maker: ATen's fused ``scaled_dot_product_attention`` as models call it, for
kiln's attention kernels (`kiln.kernels.attention`, and `kiln.kernels.attention_decode` for
fewer than 16 queries). Its operands come as models lay them out: fresh tensors (in the
fuzzer's random layouts), heads split out of a projection's rows (a permuted view, rows
``H * E`` apart), or one of the merged Q/K/V projection's parts (rows further apart still);
fewer key heads than query heads (grouped queries); a mask of bools or floats broadcast
over some of [B, H, L, S] (a padded batch's, per head, per query), ``is_causal``, a scale.
Float32 throughout where the kernels can take the call, now and then another float type
(the library's call, unchanged).

A third of the time the same attention comes decomposed, as capture leaves a model's eager
attention (`kiln.passes.attention` fuses it back into ``kiln::attention``)::

    bmm(view(Q), Kᵀ) -> view -> mul or div by a number -> add a float mask, or where(C,
    -inf, .) -> softmax(-1) -> [clone] -> view -> bmm(., V)
"""

from __future__ import annotations

import math

import torch

from kiln.fuzz.generate import Draft, Reject
from kiln.ir import attrs as A
from kiln.ir.attrs import Operand
from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType

SDPA = torch.ops.aten.scaled_dot_product_attention.default

# queries (and keys): below 16 the few-queries kernel, 16 a block of the query-block
# kernel, above it more than one block (K and V then copied per head where their rows lie
# apart, `attention_schedule.packs_head`)
_QUERIES = (1, 1, 2, 3, 5, 15, 16, 17, 20, 33)
_KEYS = (1, 2, 3, 7, 16, 17, 24, 40)
_DEPTHS = (1, 2, 3, 4, 8, 16, 16, 32, 64)
# the value width: the kernels take multiples of the vector width (16 or 8 lanes), the
# library the rest
_VALUE_DEPTHS = (16, 16, 16, 32, 8, 3)
# attention operands may be this many times the generator's size limit: a value width of 16
# and more than one block of queries do not fit in 512 elements
_SIZE_FACTOR = 4


def make_attention(d: Draft, op: Op) -> None:
    rng = d.rng
    dtype = DType.F32 if d.float32 or rng.random() < 0.85 else d.dtype((DType.F64, DType.BF16))
    for _ in range(20):
        batch, heads = rng.choice((1, 1, 2)), rng.choice((1, 2, 3, 4))
        queries, keys = rng.choice(_QUERIES), rng.choice(_KEYS)
        if rng.random() < 0.3:
            keys = queries  # (a causal or self-attention block: as many keys as queries)
        depth, depth_v = rng.choice(_DEPTHS), rng.choice(_VALUE_DEPTHS)
        kv_heads = heads if rng.random() < 0.7 else rng.choice(
            [h for h in range(1, heads + 1) if heads % h == 0])
        if all(_fits(d, (batch, h, n, e)) for h, n, e in (
                (heads, queries, depth), (kv_heads, keys, depth), (kv_heads, keys, depth_v))):
            break
    else:
        raise Reject("no attention shape within the size limit")
    if dtype is DType.F32 and not d.float32 and rng.random() < 0.33:
        _decomposed(d, batch, heads, queries, keys, depth, depth_v)
        return
    q = _operand(d, batch, heads, queries, depth, dtype)
    k = _operand(d, batch, kv_heads, keys, depth, dtype)
    v = _operand(d, batch, kv_heads, keys, depth_v, dtype)
    operands = [q, k, v]
    causal = False
    mask = None
    roll = rng.random()
    if roll < 0.35:
        mask = _mask(d, batch, heads, queries, keys, dtype)
        operands.append(mask)
    elif roll < 0.55:
        causal = True
    scale = None if rng.random() < 0.6 else rng.choice((1.0, 0.125, 0.5, 2.0, 1e-3))
    kwargs: list[tuple[str, object]] = []
    if scale is not None:
        kwargs.append(("scale", scale))
    if kv_heads != heads:
        kwargs.append(("enable_gqa", True))
    args = (Operand(0), Operand(1), Operand(2), Operand(3) if mask is not None else None,
            0.0, causal)
    d.emit1(op, *operands, attrs=A.CallAttrs(SDPA, args, tuple(kwargs)))


def _decomposed(d: Draft, batch: int, heads: int, queries: int, keys: int, depth: int,
                depth_v: int) -> None:
    """softmax(Q Kᵀ · c + M) V as bmm, view, scale, mask, softmax and bmm (module docstring);
    Kᵀ a transposed view now and then, as a model's ``k.transpose(-1, -2)``."""
    rng, f32 = d.rng, DType.F32
    rows = batch * heads
    q = d.source(TensorType((rows, queries, depth), f32), constant=0.1)
    if rng.random() < 0.5:
        kt = d.source(TensorType((rows, depth, keys), f32), constant=0.2)
    else:
        k = d.source(TensorType((rows, keys, depth), f32), constant=0.2)
        kt = d.emit1(Op.PERMUTE, k, attrs=A.PermuteAttrs((0, 2, 1)))
    v = d.source(TensorType((rows, keys, depth_v), f32), constant=0.2)
    scores = d.emit1(Op.VIEW, d.emit1(Op.BMM, q, kt),
                     attrs=A.ShapeAttrs((batch, heads, queries, keys)))
    if rng.random() < 0.8:
        c = rng.choice((0.125, 0.25, 2.0, 8.0))
        scores = d.emit1(Op.MUL, scores, d.number(c)) if rng.random() < 0.5 else \
            d.emit1(Op.DIV, scores, d.number(c), attrs=A.DivAttrs(None))
    roll = rng.random()
    if roll < 0.4:
        mask = _mask(d, batch, heads, queries, keys, f32)
        if mask.type.dtype is DType.BOOL:  # (a masked_fill: where the condition, -inf)
            scores = d.emit1(Op.WHERE, mask, d.number(-math.inf), scores)
        else:
            scores = d.emit1(Op.ADD, scores, mask)
    probs = d.emit1(Op.SOFTMAX, scores, attrs=A.SoftmaxAttrs(rng.choice((-1, 3))))
    if rng.random() < 0.5:
        probs = d.emit1(Op.CLONE, probs)
    probs = d.emit1(Op.VIEW, probs, attrs=A.ShapeAttrs((rows, queries, keys)))
    d.emit1(Op.BMM, probs, v)


def _fits(d: Draft, shape: tuple[int, ...]) -> bool:
    return math.prod(shape) <= _SIZE_FACTOR * d.limits.max_numel


def _operand(d: Draft, batch: int, heads: int, tokens: int, depth: int,
             dtype: DType) -> Value:
    """[batch, heads, tokens, depth]: a pool value or new source of that type, or heads
    split out of a projection's rows ([B, T, H, E] permuted), or one part of a merged
    projection ([B, T, parts, H, E], one part selected, then permuted)."""
    rng = d.rng
    shape = (batch, heads, tokens, depth)
    kind = rng.random()
    if kind < 0.4:
        return d.operand(lambda v: v.type == TensorType(shape, dtype),
                         lambda: TensorType(shape, dtype), fresh=0.6)
    rows = (batch, tokens, heads, depth)
    if kind < 0.75 or not _fits(d, (batch, tokens, 3, heads, depth)):
        projection = d.source(TensorType(rows, dtype), constant=0.1)
    else:
        parts = rng.choice((2, 3))
        merged = d.source(TensorType((batch, tokens, parts, heads, depth), dtype), constant=0.1)
        projection = d.emit1(Op.SELECT, merged,
                             attrs=A.SelectAttrs(2, rng.randrange(parts)))
    return d.emit1(Op.PERMUTE, projection, attrs=A.PermuteAttrs((0, 2, 1, 3)))


def _mask(d: Draft, batch: int, heads: int, queries: int, keys: int, dtype: DType) -> Value:
    """A mask broadcast to [B, H, L, S]: a padded batch's [B, 1, 1, S], one per query
    [B, 1, L, S] or [L, S], one per head [1, H, L, S], or whole; bools (True attends) or
    added floats (0 and -inf, or any values)."""
    rng = d.rng
    shape = rng.choice(((batch, 1, 1, keys), (batch, 1, queries, keys), (queries, keys),
                        (1, heads, queries, keys), (batch, heads, queries, keys)))
    if not _fits(d, shape):
        shape = (batch, 1, 1, keys)
    if rng.random() < 0.5:
        t = TensorType(shape, DType.BOOL)
        attend = torch.rand(shape, generator=d.gen) < rng.choice((0.6, 0.9, 1.0))
        return d.source(t, attend, constant=0.3)
    t = TensorType(shape, dtype)
    if rng.random() < 0.6:  # an attention mask made additive, as models do
        attend = torch.rand(shape, generator=d.gen) < rng.choice((0.6, 0.9, 1.0))
        fill = rng.choice((float("-inf"), torch.finfo(dtype.torch).min, -1e4))
        values = torch.zeros(shape, dtype=dtype.torch).masked_fill(~attend, fill)
        return d.source(t, values, constant=0.3)
    return d.source(t, constant=0.3)  # any values: a learned bias, NaN and inf among them
