"""Attention as one library call: the decomposed softmax(Q Kᵀ · s + M) V that capture leaves
becomes `kiln.ir.fused.attention`, which runs ATen's fused ``scaled_dot_product_attention``
(flash attention on CPU: the scores are never written to memory), where that measures faster.

    %s  = bmm(view(Q), view(permute(K)))          %o = kiln::attention(Q, K, V, M, c)
    %a  = add(mul(view(%s), c), M)        ->
    %p  = softmax(%a) {dim=-1}
    %o3 = bmm(view(clone(%p)), view(V))          (and views that keep %o3's shape)

A causal mask written as a ``masked_fill`` (nanoGPT, minGPT: ``where(C, -inf, scores)``, or
``where(A, scores, -inf)``) takes the add's place: M is then a bool mask, True where a query
attends (``~C``, a constant folded here where C is one), and selects as the fill did.

Eager PyTorch runs HF models' attention through that same call; capture decomposes it, and
at long sequences the decomposition writes and reads the L x S score matrix twice (Whisper's
encoder: 1500 x 1500 per head).

When it applies, and why it is safe:
* float32, softmax over the last axis, every intermediate read by the chain only;
* the scale is a number multiplying (or dividing) the scores before the mask is added (a
  Python number, or a one-element constant as the ONNX importer leaves it);
* the mask, if any, is float32 (or the bool condition of a fill with -inf exactly) and
  broadcasts to the scores without growing them; a constant one (a causal mask folded at
  compile time) has no NaN, no +inf and no row that masks every key (the fused kernel
  returns 0 for a fully masked row where the decomposition returns NaN); one computed at run
  time (a padded batch's mask) is checked so by the fused call each time.
The fused kernel returns 0 where a NaN or infinity in Q, K or V makes the decomposition's row
NaN, so `fused.attention` checks at run time that its inputs are finite, its mask has no such
row, and no score can overflow, and runs the decomposition otherwise: results differ by
rounding only (a different summation order of the softmax), and NaN and infinities propagate
exactly as in the graph (tests/passes/test_passes_attention.py).
With ``Options.measure_kernels`` the fused call replaces the chain only where the op timings of
this machine (`kiln.cost.measured`) say it is faster, or where kiln's generated attention may
run it (`kiln.kernels.attention`, timed against ATen's call in the kernel stage: values of
whole vectors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kiln.cost.analytic import AnalyticCost, Roofline
from kiln.cost.graph import GraphCost
from kiln.cost.measured import MeasuredCost
from kiln.ir import fused
from kiln.ir.attrs import NO_ATTRS, CallAttrs, Operand, PermuteAttrs, ShapeAttrs, SoftmaxAttrs
from kiln.ir.graph import Graph, Node, Value, make_constant, substitute
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.options import Options

__all__ = ["fuse_attention"]

MARGIN = 0.95  # the fused call must measure at most this fraction of the chain's time


@dataclass(frozen=True)
class _Match:
    q: Value  # (BH, L, E), the first bmm's left operand
    kt: Value  # (BH, E, S), its right operand
    v: Value  # (BH, S, Ev)
    scale: float
    mask: Value | None  # float32 (added), or bool (selects: see `_selection`)
    attends_where_false: bool  # a bool mask that is the fill's condition: the call reads ~M
    out: Value  # the second bmm's output, (BH, L, Ev)
    shape: tuple[int, int, int, int, int, int]  # B, H, L, S, E, Ev (LeViT: Ev = 2 E)
    chain: tuple[Node, ...]  # the nodes the fused call replaces


def fuse_attention(graph: Graph, options: Options) -> Graph:
    users = graph.users()
    outputs = {v.node for v in graph.outputs}
    matches = [m for n in graph.nodes if n.op is Op.SOFTMAX
               for m in [_match(n, users, outputs, graph)] if m is not None]
    if not matches:
        return graph
    scorer = None
    if options.measure_kernels:
        analytic = AnalyticCost(Roofline.of_machine(options))
        scorer = GraphCost(MeasuredCost.open(options, analytic, budget_s=2.0))
    mapping: dict[Value, Value] = {}
    constants: dict[str, torch.Tensor] = {}
    for m in matches:
        fused, new_nodes = _fused(m, graph, constants)
        if scorer is not None and not (options.generated_kernels and _generated_may_take(m)):
            chain = scorer.seconds(Graph([], list(m.chain), []))
            if scorer.seconds(Graph([], new_nodes, [])) > MARGIN * chain:
                continue
        mapping[m.out] = fused
    return substitute(graph, mapping, constants) if mapping else graph


def _generated_may_take(m: _Match) -> bool:
    """Whether kiln's generated attention may run the call (`kiln.kernels.attention`: values
    of whole vectors): the kernel stage then times it
    against ATen's fused call and uses the faster, so the call is kept without timing it
    against the chain here.
    Zen 4, 2 threads, the generated kernel against the chain of generated kernels (two bmms
    and the softmax) and ATen's fused call: 12 heads x 128 tokens 0.290 / 0.322 / 0.44 ms,
    197 tokens 0.75 / 0.82 / 1.0."""
    return m.shape[5] % 16 == 0


def _only_user(value: Value, users: dict[Node, list[Node]], outputs: set[Node]) -> Node | None:
    found = users.get(value.node, [])
    if len(found) != 1 or value.node in outputs or len(value.node.types) != 1:
        return None
    return found[0]


def _skip_clones(value: Value) -> Value:
    while value.node.op is Op.CLONE:
        value = value.node.inputs[0]
    return value


def _match(softmax: Node, users, outputs, graph: Graph) -> _Match | None:
    attrs = softmax.attrs
    assert isinstance(attrs, SoftmaxAttrs)
    t = softmax.type
    if t.dtype is not DType.F32 or len(t.shape) != 4 or attrs.dim not in (3, -1):
        return None
    chain = [softmax]
    x, mask, scale, inverted = softmax.inputs[0], None, 1.0, False
    if x.node.op is Op.ADD and _only_user(x, users, outputs):
        a, b = x.node.inputs
        if not _reads_scores(graph, a):
            a, b = b, a
        if _reads_scores(graph, a) and _usable_mask(graph, b, t.shape):
            chain.append(x.node)
            x, mask = a, b
    elif x.node.op is Op.WHERE and _only_user(x, users, outputs):
        selection = _selection(graph, x.node, t.shape)
        if selection is not None:
            chain.append(x.node)
            x, mask, inverted = selection
    scaled = _scaled(graph, x.node)
    if scaled is not None and _only_user(x, users, outputs):
        chain.append(x.node)
        x, scale = scaled
    if x.node.op is not Op.VIEW or not _only_user(x, users, outputs):
        return None
    chain.append(x.node)
    scores = x.node.inputs[0]
    if scores.node.op is not Op.BMM or not _only_user(scores, users, outputs):
        return None
    chain.append(scores.node)
    q, kt = scores.node.inputs
    batch, heads, length, keys = t.shape
    if scores.type.shape != (batch * heads, length, keys):
        return None
    # forward: softmax -> [clone] -> view -> bmm(., V)
    node = _only_user(softmax.out(), users, outputs)
    while node is not None and node.op is Op.CLONE:
        chain.append(node)
        node = _only_user(node.out(), users, outputs)
    if node is None or node.op is not Op.VIEW or node.type.shape != scores.type.shape:
        return None
    chain.append(node)
    bmm = _only_user(node.out(), users, outputs)
    if bmm is None or bmm.op is not Op.BMM or bmm.inputs[0] != node.out():
        return None
    chain.append(bmm)
    v = bmm.inputs[1]
    depth, v_depth = q.type.shape[2], v.type.shape[2]
    if v.type.shape[:2] != (batch * heads, keys) or \
            kt.type.shape != (batch * heads, depth, keys):
        return None
    return _Match(q, kt, v, scale, mask, inverted, bmm.out(),
                  (batch, heads, length, keys, depth, v_depth), tuple(chain))


def _reads_scores(graph: Graph, value: Value) -> bool:
    """Whether ``value`` is the scores as the chain makes them: bmm, view, then perhaps a
    scale (the side of the mask's add that `_match` follows)."""
    scaled = _scaled(graph, value.node)
    node = scaled[0].node if scaled is not None else value.node
    return node.op is Op.VIEW and node.inputs[0].node.op is Op.BMM


def _scaled(graph: Graph, node: Node) -> tuple[Value, float] | None:
    """``node`` as (x, c) where it is x times a number c other than 0, or x divided by one
    (c its inverse): a Python number, or a one-element float constant (as the ONNX importer
    and constant folding leave it); None otherwise."""
    if node.op not in (Op.MUL, Op.DIV):
        return None
    sides = [(0, 1), (1, 0)] if node.op is Op.MUL else [(0, 1)]
    for x, c in sides:
        number = _number(graph, node.inputs[c])
        if number:  # (not None, not 0)
            return node.inputs[x], number if node.op is Op.MUL else 1.0 / number
    return None


def _number(graph: Graph, value: Value) -> float | None:
    node = value.node
    if node.op is Op.SCALAR:
        return float(node.attrs.value)  # type: ignore[attr-defined]
    if node.op is Op.CONSTANT and value.type.dtype in (DType.F32, DType.F64) \
            and math.prod(value.type.shape) == 1:
        return float(graph.constant(node).reshape(()))
    return None


def _usable_mask(graph: Graph, mask: Value, shape: tuple[int, ...]) -> bool:
    """A float32 mask that broadcasts to the scores' [B, H, L, S] without growing them; a
    constant one also passes `_safe_mask`. One computed at run time is checked by the fused
    call itself, each call (`fused.attention`)."""
    dims = mask.type.shape
    if mask.type.dtype is not DType.F32 or len(dims) > 4 \
            or any(n not in (1, want) for n, want in zip(reversed(dims), reversed(shape))):
        return False
    return mask.node.op is not Op.CONSTANT or _safe_mask(graph, mask, shape)


def _selection(graph: Graph, where: Node,
               shape: tuple[int, ...]) -> tuple[Value, Value, bool] | None:
    """A ``masked_fill`` of the scores with -inf as (scores, its bool condition, whether the
    query attends where the condition is False): ``where(C, -inf, scores)`` or
    ``where(A, scores, -inf)``. The condition broadcasts to the scores without growing them,
    and a constant one leaves every query a key. None where the node is no such fill."""
    cond, picked, other = where.inputs
    inverted = _is_minus_inf(graph, picked)
    scores = other if inverted else picked
    if not (inverted or _is_minus_inf(graph, other)) or not _reads_scores(graph, scores) \
            or scores.type.shape != tuple(shape) or cond.type.dtype is not DType.BOOL:
        return None
    dims = cond.type.shape
    if len(dims) > 4 or any(n not in (1, want) for n, want in zip(reversed(dims),
                                                                   reversed(shape))):
        return None
    if cond.node.op is Op.CONSTANT:
        attends = graph.constant(cond.node)
        attends = ~attends if inverted else attends
        full = attends.reshape((1,) * (4 - attends.dim()) + tuple(attends.shape))
        if not bool(full.expand(*full.shape[:2], *shape[-2:]).any(-1).all()):
            return None  # (a row that attends no key: NaN in the graph, kept as it is)
    return scores, cond, inverted


def _is_minus_inf(graph: Graph, value: Value) -> bool:
    """Whether ``value`` is -inf: a one-element float constant (capture folds the fill's
    number, ``masked_fill``'s or ``torch.where``'s, into one)."""
    return _number(graph, value) == -math.inf


def _safe_mask(graph: Graph, mask: Value, shape: tuple[int, ...]) -> bool:
    m = graph.constant(mask.node)
    if m.dtype != torch.float32 or m.dim() > 4:
        return False
    try:
        full = m.expand(shape[-2:] if m.dim() <= 2 else (*m.shape[:-2], *shape[-2:]))
    except RuntimeError:
        return False
    if bool(torch.isnan(m).any()) or bool((m == float("inf")).any()):
        return False
    return not bool((full == -float("inf")).all(dim=-1).any())


def _fused(m: _Match, graph: Graph,
           constants: dict[str, torch.Tensor]) -> tuple[Value, list[Node]]:
    """The fused call's nodes, the view of its result in the chain's shape first; a constant
    mask the call reads inverted goes into ``constants`` (once for all calls that read it)."""
    batch, heads, length, keys, depth, v_depth = m.shape
    f32 = DType.F32
    nodes: list[Node] = []

    def add(op: Op, inputs, attrs, shape, name: str, dtype: DType = f32) -> Value:
        node = Node(op, inputs, attrs, (TensorType(shape, dtype),), name)
        nodes.append(node)
        return node.out()

    mask = m.mask
    if mask is not None and m.attends_where_false and mask.node.op is Op.CONSTANT:
        name = f"{mask.node.attrs.name}.attends"  # type: ignore[attr-defined]
        constants.setdefault(name, ~graph.constant(mask.node))
        mask = make_constant(name, constants[name]).out()
    elif mask is not None and m.attends_where_false:
        mask = add(Op.LOGICAL_NOT, (mask,), NO_ATTRS, mask.type.shape, "attn_attends",
                   DType.BOOL)

    q = add(Op.VIEW, (m.q,), ShapeAttrs((batch, heads, length, depth)), (batch, heads, length,
                                                                           depth), "attn_q")
    kt = add(Op.VIEW, (m.kt,), ShapeAttrs((batch, heads, depth, keys)),
             (batch, heads, depth, keys), "attn_kt")
    k = add(Op.PERMUTE, (kt,), PermuteAttrs((0, 1, 3, 2)), (batch, heads, keys, depth),
            "attn_k")
    v = add(Op.VIEW, (m.v,), ShapeAttrs((batch, heads, keys, v_depth)),
            (batch, heads, keys, v_depth), "attn_v")
    operands = (q, k, v) if mask is None else (q, k, v, mask)
    mask_arg = None if mask is None else Operand(3)
    attrs = CallAttrs(fused.attention._opoverload,
                      (Operand(0), Operand(1), Operand(2), mask_arg, m.scale))
    out = add(Op.CALL, operands, attrs, (batch, heads, length, v_depth), "attention")
    out3 = add(Op.VIEW, (out,), ShapeAttrs((batch * heads, length, v_depth)),
               (batch * heads, length, v_depth), "attn_out")
    return out3, nodes
