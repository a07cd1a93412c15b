"""Correction: recompute a box of the original subprogram's output from its definition, and
write it into the mutant's output (PET, Wang et al., OSDI'21, section 6).

    fixed = corrected(sub.graph, mutant, regions.boxes)     # a standalone graph, same inputs

The box is pulled back through the subprogram op by op (`operand_boxes`): an elementwise op
needs the same box of each operand (a broadcast axis needs its single position); ``mm`` needs
the box's rows of A and columns of B, all of K; a convolution needs its receptive field, which
may reach past the input's edge, where the convolution's own zero padding is made explicit (a
``pad`` node) and the recomputed convolution runs with padding 0. The recomputation is the
original ops on those slices, so a box costs about its share of the original's work plus its
halo. Each box is written with ``slice_scatter`` (one per partial axis), which copies the
mutant's output once per box.

A box may also reach past an operand's extent (a mutant that pads a GEMM to a better shape
computes a larger output than the original): the missing positions are zeros. Every output
position inside the original's extent depends only on operand positions inside it, so the
result there is unchanged.

Ops without a rule here (views, pooling, anything opaque) make `restrict` raise `NoRegion`;
a mutant that would need such a correction is not used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from kiln.ir.attrs import CallAttrs, ConvActAttrs, ConvAttrs, Operand, PadAttrs, SliceAttrs
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.infer import InferenceError, infer_types
from kiln.ir.ops import Op, OpGroup
from kiln.pet.regions import Box

__all__ = ["NoRegion", "Emitter", "corrected", "operand_boxes", "restrict", "write_box"]

aten = torch.ops.aten


class NoRegion(ValueError):
    """An op whose operand regions kiln cannot derive for a given output box."""


class Emitter:
    """Appends nodes to a standalone graph under construction, inferring their types."""

    def __init__(self, prefix: str) -> None:
        self.nodes: list[Node] = []
        self.prefix = prefix
        self._placed: set[Node] = set()

    def keep(self, value: Value) -> Value:
        """Use an existing number (SCALAR) node in the graph being built."""
        if value.node not in self._placed:
            self._placed.add(value.node)
            self.nodes.append(value.node)
        return value

    def emit(self, op: Op, inputs: Sequence[Value], attrs, name: str = "") -> Value:
        try:
            types = infer_types(op, attrs, inputs)
        except InferenceError as err:
            raise NoRegion(str(err)) from err
        node = Node(op, inputs, attrs, types, f"{self.prefix}{name or op.text}")
        self.nodes.append(node)
        return node.out()

    def take(self, value: Value, box: Box) -> Value:
        """``value`` restricted to ``box``; positions past its extent are zeros."""
        shape = value.type.shape
        for axis, (lo, hi) in enumerate(box):
            start, stop = max(lo, 0), min(hi, shape[axis])
            if stop <= start:
                raise NoRegion(f"box {box} lies outside {value} on axis {axis}")
            if (start, stop) != (0, shape[axis]):
                value = self.emit(Op.SLICE, (value,), SliceAttrs(axis, start, stop), "slice")
        pads = [(max(0, -lo), max(0, hi - shape[axis])) for axis, (lo, hi) in enumerate(box)]
        if any(before or after for before, after in pads):
            flat: list[int] = []
            first = next(a for a, p in enumerate(pads) if p != (0, 0))
            for before, after in reversed(pads[first:]):
                flat.extend((before, after))
            value = self.emit(Op.PAD, (value,), PadAttrs(tuple(flat), 0.0), "pad")
        return value


def operand_boxes(node: Node, box: Box) -> list[Box | None]:
    """For each operand of ``node``, the box of it that ``box`` of the output depends on
    (None for numbers). Intervals may reach past the operand's extent: zeros there."""
    op = node.op
    if op.is_a(OpGroup.ELEMENTWISE) and op is not Op.WHERE:
        return [_broadcast_box(v, node.type.shape, box) for v in node.inputs]
    if op in (Op.MM, Op.BMM):
        a, b = node.inputs
        k = a.type.shape[-1]
        return [(*box[:-1], (0, k)), (*box[:-2], (0, k), box[-1])]
    if op in (Op.ADDMM, Op.ADDMM_ACT):
        bias, a, b = node.inputs
        k = a.type.shape[-1]
        return [_broadcast_box(bias, node.type.shape, box), (box[0], (0, k)), ((0, k), box[1])]
    if op in (Op.CONVOLUTION, Op.CONV_ACT):
        return _conv_boxes(node, box)
    raise NoRegion(f"no region rule for {op.text} ({node.name})")


def _broadcast_box(value: Value, out_shape: Sequence[int], box: Box) -> Box | None:
    if value.node.op is Op.SCALAR:
        return None
    shape = value.type.shape
    offset = len(out_shape) - len(shape)
    return tuple((0, 1) if size == 1 and out_shape[offset + i] != 1 else box[offset + i]
                 for i, size in enumerate(shape))


def _conv_boxes(node: Node, box: Box) -> list[Box | None]:
    attrs = node.attrs
    assert isinstance(attrs, (ConvAttrs, ConvActAttrs))
    if isinstance(attrs, ConvAttrs) and attrs.transposed:
        raise NoRegion(f"transposed convolution {node.name}")
    w = node.inputs[1]
    cout, cin_g = w.type.shape[0], w.type.shape[1]
    cout_g = cout // attrs.groups
    c0, c1 = box[1]
    if attrs.groups == 1:
        channels = (0, cin_g)
    elif c0 % cout_g == 0 and c1 % cout_g == 0 and c1 <= cout:
        channels = (c0 // cout_g * cin_g, c1 // cout_g * cin_g)
    else:
        raise NoRegion(f"{node.name}: channel box {box[1]} cuts a group of {cout_g}")
    spatial = []
    for d, (lo, hi) in enumerate(box[2:]):
        kernel = w.type.shape[2 + d]
        s, p, dil = attrs.stride[d], attrs.padding[d], attrs.dilation[d]
        spatial.append((lo * s - p, (hi - 1) * s - p + dil * (kernel - 1) + 1))
    boxes: list[Box | None] = [(box[0], channels, *spatial),
                               ((c0, c1), *((0, n) for n in w.type.shape[1:]))]
    rest = list(node.inputs[2:])
    if rest and (node.op is Op.CONVOLUTION or getattr(attrs, "has_bias", False)):
        boxes.append(((c0, c1),))  # the bias: one value per output channel
        rest = rest[1:]
    boxes.extend(_broadcast_box(v, node.type.shape, box) for v in rest)  # the residual
    return boxes


def _restricted_attrs(node: Node, box: Box):
    attrs = node.attrs
    if node.op not in (Op.CONVOLUTION, Op.CONV_ACT):
        return attrs
    assert isinstance(attrs, (ConvAttrs, ConvActAttrs))
    groups = attrs.groups
    if groups > 1:
        cout_g = node.inputs[1].type.shape[0] // groups
        groups = (box[1][1] - box[1][0]) // cout_g
    return dataclasses.replace(attrs, padding=tuple(0 for _ in attrs.padding), groups=groups)


def restrict(graph: Graph, output: int, box: Box, emitter: Emitter,
             sources: dict[Value, Value] | None = None) -> Value:
    """Emit the original ``graph``'s ``output`` restricted to ``box``. ``sources`` maps the
    graph's input values to the values the emitted nodes read (default: themselves)."""
    sources = sources or {}
    needed: dict[Value, Box] = {graph.outputs[output]: box}
    for node in reversed(graph.nodes):
        if node.op is Op.SCALAR or node.out() not in needed:
            continue
        if len(node.types) != 1:
            raise NoRegion(f"{node.op.text} ({node.name}) has several outputs")
        for v, b in zip(node.inputs, operand_boxes(node, needed[node.out()])):
            if b is not None:
                needed[v] = _hull(needed[v], b) if v in needed else b
    computed: dict[Value, Value] = {}

    def read(value: Value, want: Box) -> Value:
        if value.node.op is Op.SCALAR:
            return emitter.keep(value)
        if value.node.op is Op.INPUT:
            return emitter.take(sources.get(value, value), want)
        have = needed[value]
        relative = tuple((lo - h0, hi - h0) for (lo, hi), (h0, _) in zip(want, have))
        return emitter.take(computed[value], relative)

    for node in graph.nodes:
        out = node.out()
        if node.op is Op.SCALAR or out not in needed:
            continue
        want = needed[out]
        operands = [read(v, b) if b is not None else emitter.keep(v)
                    for v, b in zip(node.inputs, operand_boxes(node, want))]
        computed[out] = emitter.emit(node.op, operands, _restricted_attrs(node, want),
                                     f"{node.name}.part")
    return computed[graph.outputs[output]]


def _hull(a: Box, b: Box) -> Box:
    return tuple((min(x0, y0), max(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))


def write_box(base: Value, part: Value, box: Box, emitter: Emitter) -> Value:
    """``base`` with ``box`` replaced by ``part`` (one ``slice_scatter`` per partial axis)."""
    axes = [a for a, (lo, hi) in enumerate(box) if (lo, hi) != (0, base.type.shape[a])]
    if not axes:
        return part
    axis, (lo, hi) = axes[0], box[axes[0]]
    if len(axes) > 1:
        inner = emitter.emit(Op.SLICE, (base,), SliceAttrs(axis, lo, hi), "slice")
        inner_box = tuple((0, hi - lo) if a == axis else iv for a, iv in enumerate(box))
        part = write_box(inner, part, inner_box, emitter)
    attrs = CallAttrs(aten.slice_scatter.default, (Operand(0), Operand(1), axis, lo, hi, 1))
    return emitter.emit(Op.CALL, (base, part), attrs, "pet_fix")


def corrected(original: Graph, mutant: Graph, boxes: Sequence[Sequence[Box]]) -> Graph:
    """``mutant`` (over the same inputs as ``original``) with every box of ``boxes[i]`` of
    output ``i`` recomputed from ``original``."""
    emitter = Emitter("fix.")
    outputs = list(mutant.outputs)
    for i, output_boxes in enumerate(boxes):
        for box in output_boxes:
            part = restrict(original, i, box, emitter)
            outputs[i] = write_box(outputs[i], part, box, emitter)
    if not emitter.nodes:
        return mutant
    present = set(mutant.nodes)
    added = [n for n in emitter.nodes if n not in present]
    return Graph(mutant.inputs, [*mutant.nodes, *added], outputs, mutant.constants,
                 mutant.device)
