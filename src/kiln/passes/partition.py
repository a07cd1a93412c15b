"""Partition an optimized graph into generated-kernel groups (pure graph analysis, no C).

A group is a producer->consumer DAG of elementwise ops (chains that meet at a node merge),
optionally closed by one normalization (softmax, layer norm) that reads the chain's result.
It becomes one generated kernel: values used only inside the group are never written to
memory. For GPT-2's ``ln(x + attn)`` with the sum also kept as the residual stream::

    %add_1 = add(%add, %view_17) : f32[1, 16, 64]                 group 0: add_1, ln
    %ln = layer_norm(%add_1, %w, %b) : (f32[1, 16, 64], ...)        inputs  %add, %view_17, %w, %b
    %add_2 = add(%add_1, %view_21) : f32[1, 16, 64]                 outputs %add_1, %ln#0

Everything else (GEMMs, convolutions, movement, opaque calls) stays a library call.
Rules, each there for a reason:

* float32 results only, operands float32 or bool masks (Python numbers are constants);
* a normalization ends its group: the row kernels take an elementwise prologue, no epilogue;
* every user outside the group comes after the group's last node, so the kernel can run at
  that node's place (this also keeps groups free of cycles through outside nodes);
* a last-axis mean or sum closes a group too (a row kernel's lane sums); it joins one only
  where nothing outside reads the group's other values;
* an RMSNorm written out (`kiln.passes.rms_norm`: squares, their mean, rsqrt, the scaling
  and its weight) is one group that closes like a normalization, with the open group that
  computes its rows as prologue (Llama's residual sum, written once for its later reader):
  one row kernel where op by op it was three;
* a last-axis slice or cat (`_GATHERS`) joins the group of its consumers, which read
  through it (an index shift; a select per piece of the cat): a rotary embedding's
  ``q * cos + cat(-q2, q1) * sin`` is one kernel over q. Never a group's only work, never
  in a row kernel's prologue; a slice of an outside value that is read outside too stays a
  library view (free), which the kernel reads;
* a cat along an inner axis that no group reads through (a decode step's KV cache: past
  keys and the new one along the sequence) is a copy kernel of its own (`_lone_cats`);
* a lone elementwise op is left to the library, which is about as fast (not a hardswish, a
  formula of four ops in one); a lone layer norm
  is kept (its row kernel measured 1.5x faster than ATen's at BERT size), a lone mean
  (Llama's RMSNorm: 43 us in ATen between kiln kernels, 4 us alone) and a lone softmax
  (BERT's 12x128x128 on Zen 3: 95 us against ATen's 128; ViT's 197-wide rows lose, 0.51
  against 0.30 ms, and keep the library's, as the kernel stage's timing decides).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kiln.ir import attrs as A
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.ir.types import DType
from kiln.passes.rms_norm import RmsNorm, rms_norm_at

__all__ = ["KernelGroup", "alone", "gather", "gemms", "partition", "residual_bias", "without_last"]

_NORMALIZATIONS = (Op.SOFTMAX, Op.LAYER_NORM)
_ROW_REDUCTIONS = (Op.MEAN, Op.SUM)  # over the last axis: a row kernel's sum
_CLOSERS = _NORMALIZATIONS + _ROW_REDUCTIONS  # end their group
# movement ops an elementwise kernel reads through (index arithmetic, a select per piece of a
# cat): only as operands of the group's arithmetic, never its result
_GATHERS = (Op.SLICE, Op.CAT)


@dataclass(frozen=True)
class KernelGroup:
    """Nodes (in graph order) that run as one kernel, with the values it reads and writes."""

    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]  # produced outside the group (Python numbers left out)
    outputs: tuple[Value, ...]  # used after the group or returned by the graph

    @property
    def last(self) -> Node:
        return self.nodes[-1]

    def __repr__(self) -> str:
        return f"<KernelGroup {' -> '.join(n.name for n in self.nodes)}>"


def partition(graph: Graph) -> list[KernelGroup]:
    """The groups of ``graph``, in the order of their last nodes."""
    if graph.device.type != "cpu":
        return []
    index = {node: i for i, node in enumerate(graph.nodes)}
    users = graph.users()
    returned = set(graph.outputs)
    norms = _rms_norms(graph, users, returned)
    inside = {n for norm in norms.values() for n in norm.nodes[:-1]}
    group_of: dict[Node, list[Node]] = {}
    for node in graph.nodes:
        if node in inside or not fusible(node):
            continue
        norm = norms.get(node)
        if norm is not None:
            prologue = _norm_prologue(norm, group_of, users, index, returned, norms)
            group = [*prologue, *norm.nodes]
        else:
            joinable = _joinable(node, group_of, users, index, norms)
            group = [*(joinable[0] if joinable else ()), node]
        for member in group:
            group_of[member] = group
    groups = {id(g): g for g in group_of.values()}.values()
    described = [_describe(_peel_gathers(g, users, returned), users, returned)
                 for g in groups]
    result = [g for g in described if g.nodes and _worth_it(g.nodes) and _computes(g)]
    taken = {n for g in result for n in g.nodes}
    result += [_describe([n], users, returned) for n in graph.nodes
               if n not in taken and _lone_cat(n)]
    return sorted(result, key=lambda g: index[g.last])


def _lone_cat(node: Node) -> bool:
    """A float32 cat along an inner axis: neither the first (whole pieces, one copy each in
    the library) nor the last (a gather groups read through) nor a 4-D value's channels (a
    CNN's cat, which may be laid out NHWC). Between kernels ATen's call costs several times
    its time alone: a decode step's KV cache cat, [1, 4, 127, 64] + [1, 4, 1, 64], took 36
    us in hf_llama_decode, 16 alone, the generated copy 4 (the whole step 1.40 -> 1.11 ms)."""
    if node.op is not Op.CAT or not node.types or node.types[0].dtype is not DType.F32:
        return False
    rank = node.types[0].rank
    dim = node.attrs.dim % rank if rank else 0  # type: ignore[attr-defined]
    return 1 <= dim < rank - 1 and not (rank == 4 and dim == 1) and all(
        v.node.op is not Op.SCALAR and v.type.dtype is DType.F32 and v.type.numel
        for v in node.inputs)


def fusible(node: Node) -> bool:
    """Whether ``node`` may be part of a generated kernel at all."""
    if node.op not in _CLOSERS and node.op not in _GATHERS \
            and not node.op.is_a(OpGroup.ELEMENTWISE):
        return False
    if any(t.dtype is not DType.F32 or t.numel == 0 for t in node.types):
        return False
    for v in node.inputs:
        if v.node.op is not Op.SCALAR and v.type.dtype not in (DType.F32, DType.BOOL):
            return False
    if node.op is Op.SOFTMAX:
        return _last_axis(node.attrs.dim, node.type.rank)  # type: ignore[attr-defined]
    if node.op in _ROW_REDUCTIONS:
        dims, rank = node.attrs.dims, node.inputs[0].type.rank  # type: ignore[attr-defined]
        return dims is not None and len(dims) == 1 and _last_axis(dims[0], rank)
    if node.op in _GATHERS:  # (along the last axis: a CNN's channel cats keep their copy)
        return _last_axis(node.attrs.dim, node.type.rank)  # type: ignore[attr-defined]
    if node.op is Op.LAYER_NORM:  # over the last axis, with weight and bias
        attrs = node.attrs
        assert isinstance(attrs, A.LayerNormAttrs)
        return len(attrs.normalized_shape) == 1 and len(node.inputs) == 3 and all(
            v.node.op is not Op.SCALAR for v in node.inputs)
    return True


def _last_axis(dim: int, rank: int) -> bool:
    return rank > 0 and dim % rank == rank - 1


def _joinable(node: Node, group_of: dict[Node, list[Node]], users: dict[Node, list[Node]],
              index: dict[Node, int], norms: Mapping[Node, RmsNorm]) -> list[list[Node]]:
    """The groups ``node`` may close or extend, best first: every open group producing one of
    its operands merged into one (GELU's ``0.5 * x`` and its tanh chain, both from x, meet at
    the final product), else the largest such group alone. An RMSNorm (its last node in
    ``norms``) closes its group as a normalization does."""
    operands = node.inputs[:1] if node.op in _CLOSERS else node.inputs
    open_ = list({id(g): g for v in operands if v.node in group_of
                  for g in [group_of[v.node]]
                  if g[-1].op not in _CLOSERS and g[-1] not in norms}.values())
    options = [sorted((n for g in open_ for n in g), key=index.__getitem__)] if len(open_) > 1 \
        else []
    options += sorted(open_, key=len, reverse=True)
    return [g for g in options if _may_join(g, node, users, index)]


def _may_join(group: list[Node], node: Node, users: dict[Node, list[Node]],
              index: dict[Node, int]) -> bool:
    members = set(group) | {node}
    if node.op in _CLOSERS and any(n.op in _GATHERS for n in group):
        return False  # (a row kernel's prologue reads its row input elementwise only)
    if node.op in _NORMALIZATIONS and any(v.node in members for v in node.inputs[1:]):
        return False  # weight and bias come from outside
    if node.op in _ROW_REDUCTIONS and any(u not in members for m in group for u in users[m]
                                          if m is not node.inputs[0].node):
        return False  # the row kernel writes its result and its row input, nothing else
    for member in group:
        for user in users[member]:
            if user not in members and index[user] < index[node]:
                return False  # the kernel would run after a reader of its result
    return True


def _rms_norms(graph: Graph, users: dict[Node, list[Node]], returned: set[Value]
               ) -> dict[Node, RmsNorm]:
    """The graph's RMSNorms whose nodes may all be generated, by their last node. A node is
    one norm's at most: a product two norms would take as their weight's (each the other's
    weight) goes to the first; the second ends at its scaling."""
    found: dict[Node, RmsNorm] = {}
    taken: set[Node] = set()
    for node in graph.nodes:
        if node.op is not Op.MEAN:
            continue
        norm = rms_norm_at(node, users, returned)
        if norm is not None and norm.last in taken:
            norm = rms_norm_at(node, users, returned, weighted=False)
        if norm is not None and all(fusible(n) for n in norm.nodes) \
                and not taken.intersection(norm.nodes):
            found[norm.last] = norm
            taken.update(norm.nodes)
    return found


def _norm_prologue(norm: RmsNorm, group_of: dict[Node, list[Node]],
                   users: dict[Node, list[Node]], index: dict[Node, int],
                   returned: set[Value], norms: Mapping[Node, RmsNorm]) -> list[Node]:
    """The open group that computes the norm's rows (a residual sum), where the row kernel
    can take it as its prologue: elementwise only, and nothing but the rows read after the
    norm (the kernel writes them once, as GPT-2's layer norm does its residual stream). A
    group another norm closed is no prologue (two norms of one residual sum)."""
    group = group_of.get(norm.x.node)
    if not group or group[-1].op in _CLOSERS or group[-1] in norms \
            or any(n.op in _GATHERS for n in group):
        return []
    if norm.weight is not None and norm.weight.node in group:
        return []  # the row kernel reads its weight from memory, as layer norm's
    members = set(group) | set(norm.nodes)
    for member in group:
        read_after = member is norm.x.node
        if member.out() in returned and not read_after:
            return []
        for user in users[member]:
            if user not in members and (not read_after or index[user] < index[norm.last]):
                return []
    return group


def _peel_gathers(group: list[Node], users: dict[Node, list[Node]],
                  returned: set[Value]) -> list[Node]:
    """The group without the gathers of outside values that are read outside it too: those
    stay library views (a slice costs nothing there), which the kernel then reads. A gather
    of the group's own values read outside stays in, its value written by the kernel."""
    members = set(group)
    while True:
        peel = {n for n in group if n.op in _GATHERS
                and all(v.node not in members for v in n.inputs)
                and (any(u not in members for u in users[n]) or n.out() in returned)}
        if not peel:
            return group
        group = [n for n in group if n not in peel]
        members -= peel


def _computes(group: KernelGroup) -> bool:
    """Whether the group does arithmetic: `_GATHERS` only feed a group's arithmetic."""
    return any(n.op not in _GATHERS for n in group.nodes)


def _worth_it(group: Sequence[Node]) -> bool:
    if len(group) > 1:
        return True
    # a lone hardswish too: its formula's four ops ran as one generated kernel before
    # `kiln.rules.idioms` made them one op, and ATen's call between kiln's kernels is slower
    # (HF LeViT with its 14 lone ones left to ATen: 1.028x the time, in-process A/B)
    return group[0].op in (Op.LAYER_NORM, Op.SOFTMAX, Op.HARDSWISH, *_ROW_REDUCTIONS)


def _describe(nodes: list[Node], users: dict[Node, list[Node]],
              returned: set[Value]) -> KernelGroup:
    members = set(nodes)
    inputs: dict[Value, None] = {}
    for node in nodes:
        for v in node.inputs:
            if v.node not in members and v.node.op is not Op.SCALAR:
                inputs[v] = None
    read_outside = {v for n in nodes for user in users[n] if user not in members
                    for v in user.inputs if v.node is n}
    outputs = [v for n in nodes for v in n.outputs if v in read_outside or v in returned]
    return KernelGroup(tuple(nodes), tuple(inputs), tuple(outputs))


def singles(graph: Graph, keep: Callable[[Node], bool]) -> list[KernelGroup]:
    """A one-node group for every node ``keep`` accepts, in graph order."""
    users = graph.users()
    returned = set(graph.outputs)
    return [_describe([n], users, returned) for n in graph.nodes if keep(n)]


def chain(graph: Graph, nodes: Sequence[Node]) -> KernelGroup:
    """``nodes`` (in graph order) as one group."""
    return _describe(list(nodes), graph.users(), set(graph.outputs))


def alone(graph: Graph, group: KernelGroup) -> KernelGroup:
    """The group's last node as a group of its own (a GEMM without its residual's sum)."""
    return singles(graph, lambda node: node is group.last)[0]


def gemms(graph: Graph) -> list[KernelGroup]:
    """Groups for the float32 ``mm``, ``bmm``, ``addmm`` and ``addmm_act`` (beta = alpha =
    1, bias over the columns or of the output's shape) nodes, which a generated GEMM may run
    instead of the library: one node, or two where an [M, N] bias is `residual_bias`'s sum
    (the GEMM adds the row in its init)."""
    if graph.device.type != "cpu":
        return []
    users = graph.users()
    returned = set(graph.outputs)
    found = []
    for node in graph.nodes:
        nodes = [node]
        if node.op in (Op.MM, Op.BMM):
            operands = node.inputs
        elif node.op in (Op.ADDMM, Op.ADDMM_ACT):  # (the activation: the GEMM's epilogue)
            attrs = node.attrs
            assert isinstance(attrs, (A.AddmmAttrs, A.AddmmActAttrs))
            bias = node.inputs[0]
            if attrs.beta != 1 or attrs.alpha != 1 or bias.type.shape not in (
                    node.type.shape[1:], node.type.shape):  # a row, or [M, N] (a residual)
                continue
            operands = node.inputs
            if residual_bias(bias, users, returned) is not None:
                nodes = [bias.node, node]
                operands = (*bias.node.inputs, *node.inputs[1:])
        else:
            continue
        if all(v.node.op is not Op.SCALAR and v.type.dtype is DType.F32 for v in operands):
            found.append(_describe(nodes, users, returned))
    return found


def residual_bias(bias: Value, users: dict[Node, list[Node]], returned: set[Value]
                  ) -> tuple[Value, Value] | None:
    """(matrix, row) where an addmm's [M, N] input is ``add(matrix, row)`` with a row [N]
    and nothing else reads the sum (`kiln.passes.pointwise` writes a 1x1 convolution's
    residual plus its bias so); else None."""
    add = bias.node
    if add.op is not Op.ADD or len(add.inputs) != 2 or bias in returned \
            or len(users[add]) != 1 or len(bias.type.shape) != 2:
        return None
    n = bias.type.shape[1]
    matrix, row = add.inputs
    if row.type.shape == bias.type.shape:
        matrix, row = row, matrix
    if matrix.type.shape != bias.type.shape or row.type.shape != (n,):
        return None
    return matrix, row


def without_last(group: KernelGroup) -> KernelGroup | None:
    """The group's elementwise prologue as a group of its own (its normalization left to the
    library: the last node, or an RMSNorm's nodes from its squares on), or None when there
    is no prologue."""
    cut = len(group.nodes) - 1
    inner = [i for i, n in enumerate(group.nodes[:-1]) if n.op in _ROW_REDUCTIONS]
    if inner:  # an RMSNorm's mean: the prologue ends before its squares
        cut = max(inner[0] - 1, 0)
    nodes = group.nodes[:cut]
    if not nodes:
        return None
    members = set(nodes)
    inputs = tuple(dict.fromkeys(v for n in nodes for v in n.inputs
                                 if v.node not in members and v.node.op is not Op.SCALAR))
    read_by_rest = [v for n in group.nodes[cut:] for v in n.inputs if v.node in members]
    outputs = tuple(dict.fromkeys([*(v for v in group.outputs if v.node in members),
                                   *read_by_rest]))
    return KernelGroup(nodes, inputs, outputs)


def gather(graph: Graph, groups: Sequence[KernelGroup]) -> Graph:
    """``graph`` with each group's nodes moved together, right before its last node.

    Valid because `partition` puts every outside reader of a group after the group's last
    node; the runtime then runs the kernel at that place. Returns ``graph`` if nothing moved.
    """
    moved = {n: g for g in groups for n in g.nodes[:-1]}
    if not moved:
        return graph
    last_of = {g.last: g for g in groups}
    order: list[Node] = []
    for node in graph.nodes:
        if node in moved:
            continue
        if node in last_of:
            order.extend(last_of[node].nodes[:-1])
        order.append(node)
    return graph if list(order) == list(graph.nodes) else graph.replace(nodes=order)
