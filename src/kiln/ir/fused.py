"""What kiln's fused ops compute: the library op, then its epilogue applied in place.

The epilogue runs the same ATen kernels as the unfused ops, on the contraction's own output
buffer, so a fused op gives bit-identical results and saves the intermediate allocation and
one trip through memory allocation. Both functions accept ``out=`` so the memory planner can
place their result in the arena.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kiln.ir.graph import Node
from kiln.ir.memory import in_memory_order
from kiln.ir.ops import Op

aten = torch.ops.aten

# activation op -> its in-place ATen kernel, called as kernel(tensor, *act_args)
_IN_PLACE: dict[Op, Any] = {
    Op.RELU: aten.relu_.default,
    Op.GELU: lambda t, approximate="none": aten.gelu_.default(t, approximate=approximate),
    Op.SIGMOID: aten.sigmoid_.default,
    Op.TANH: aten.tanh_.default,
    Op.CLAMP: aten.clamp_.default,
    Op.LEAKY_RELU: aten.leaky_relu_.default,
    Op.HARDSWISH: aten.hardswish_.default,
}

ACTIVATIONS = frozenset(_IN_PLACE)


def activation_args(node: Node) -> tuple[Any, ...]:
    """The arguments of an activation node, as its fused epilogue keeps them."""
    a = node.attrs
    if node.op is Op.GELU:
        return (a.approximate,)  # type: ignore[attr-defined]
    if node.op is Op.CLAMP:
        return (a.min, a.max)  # type: ignore[attr-defined]
    if node.op is Op.LEAKY_RELU:
        return (a.negative_slope,)  # type: ignore[attr-defined]
    return ()


def apply_activation(t: torch.Tensor, activation: Op | None, act_args: tuple[Any, ...]) -> None:
    if activation is not None:
        _IN_PLACE[activation](t, *act_args)


def addmm_act(bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *, beta: Any, alpha: Any,
              activation: Op, act_args: tuple[Any, ...],
              out: torch.Tensor | None = None) -> torch.Tensor:
    if out is None:
        out = aten.addmm.default(bias, x, w, beta=beta, alpha=alpha)
    else:
        aten.addmm.out(bias, x, w, beta=beta, alpha=alpha, out=out)
    apply_activation(out, activation, act_args)
    return out


def conv_act(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor, stride: list[int],
             padding: list[int], dilation: list[int], groups: int, has_bias: bool,
             activation: Op | None, act_args: tuple[Any, ...]) -> torch.Tensor:
    bias = rest[0] if has_bias else None
    residual = rest[1 if has_bias else 0] if len(rest) > int(has_bias) else None
    y = aten.convolution.default(x, w, bias, stride, padding, dilation, False,
                                 [0] * len(stride), groups)
    if residual is not None:
        y.add_(residual)
    apply_activation(y, activation, act_args)
    return y


# Above this, |scores| could overflow float32 (or come close): the guard of `attention` then
# takes the decomposition, which is the graph's own definition.
_SCORE_BOUND = 1e30


@torch.library.custom_op("kiln::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v, where a bool mask selects (True: the query attends
    the key; False: its score is -inf, whatever it was, as ``masked_fill`` makes it): ATen's
    fused attention where every input is finite and no score can overflow, so that it equals
    the decomposition up to rounding; otherwise the decomposition itself. (The fused kernel
    returns 0 where a NaN or an infinity makes the decomposition's row NaN.) Keys and values
    with G heads where q has G*R (grouped-query attention) serve R query heads each, query
    head g*R + r reading head g, as ``repeat_kv`` makes them."""
    if k.dim() == 4 and k.shape[1] != q.shape[1]:
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, 1), v.repeat_interleave(repeats, 1)
    if _fused_attention_is_exact(q, k, v, mask, scale):
        return aten.scaled_dot_product_attention.default(q, k, v, mask, 0.0, False,
                                                         scale=scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, -math.inf)
    elif mask is not None:
        scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _fused_attention_is_exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              mask: torch.Tensor | None, scale: float) -> bool:
    """q, k and v hold no NaN or infinity, the mask no NaN, no +inf and no row of -inf only
    (a bool mask: no row that attends no key; the fused kernel answers such a row with 0,
    the decomposition with NaN), and |q·k · scale + mask| stays below `_SCORE_BOUND`. One
    pass over each (aminmax: NaN propagates to its result) and one sync with the host: the
    former guard, abs().amax() and isfinite().all(), allocated a temporary per operand (an
    AVX-512 Xeon, 2 threads, 8 heads x 128 tokens: the call 307 -> 221-241 us, SDPA alone
    169-187; 12 x 1500: 32.2 -> 28.4-28.9 ms, SDPA alone 27.7)."""
    if not (q.numel() and k.numel() and v.numel()) or (mask is not None and not mask.numel()):
        return False
    stats = [*torch.aminmax(in_memory_order(q)), *torch.aminmax(in_memory_order(k)),
             *torch.aminmax(in_memory_order(v))]
    if mask is not None and mask.dtype == torch.bool:  # adds nothing to the bound; the log
        # of whether every row attends a key is -inf where one does not, as a float row is
        stats += [torch.zeros((), dtype=q.dtype), mask.any(-1).all().to(q.dtype).log()]
    elif mask is not None:  # its largest value, and the least of its rows' largest
        stats += [mask.amax(), mask.amax(-1).amin()]
    qmin, qmax, kmin, kmax, vmin, vmax, *masked = torch.stack(stats).tolist()
    if not all(math.isfinite(x) for x in (qmin, qmax, kmin, kmax, vmin, vmax)):
        return False
    bound = max(-qmin, qmax) * max(-kmin, kmax) * q.shape[-1] * abs(scale)
    if masked:
        top, least_row = masked
        if not (top < _SCORE_BOUND and least_row > -math.inf):  # (False for a NaN)
            return False
        bound += max(top, 0.0)
    return bound < _SCORE_BOUND


@attention.register_fake
def _attention_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))
