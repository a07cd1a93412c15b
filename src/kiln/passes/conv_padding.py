"""A convolution's explicit zero padding moves into the convolution.

    %p = pad(%x) {pad=(1, 1, 1, 1), value=0.0}         %y = conv_act(%x, %w, %b) {padding=(1, 1),
    %y = conv_act(%p, %w, %b) {padding=(0, 0), ...}  ->                          ...}

TF-style "same" padding (HF's MobileNetV2 and EfficientNet ports) pads explicitly before each
convolution. The pad is a copy of the whole activation, and in NHWC it also cost a layout copy
on each side, since kiln's depthwise kernel and oneDNN then saw an unpadded convolution of a
fresh NCHW tensor. Moved into the convolution, the kernels skip the padding instead.

When it is the same: the pad adds zeros, symmetric per spatial side (a convolution's padding
is), on the last two dims of a 4-d input, the convolution is not transposed, and every weight
is finite. With an infinite or NaN weight the explicit zeros give 0 * inf = NaN, while an NHWC
convolution skips its implicit padding (see `kiln.passes.layout`); the weight is evaluated at
compile time (a weight computed at run time stays as it is). The sums are the same up to
their order.

Asymmetric pads (TF "same" at stride 2 pads only after: (0, 1, 0, 1)) stay explicit: a
convolution's padding cannot say them.
"""

from __future__ import annotations

import dataclasses

from kiln.ir.graph import Graph, Node, Value, transform
from kiln.ir.ops import Op
from kiln.ir.shared import all_finite
from kiln.options import Options
from kiln.passes.layout import CONVS, weight_only

__all__ = ["pads_into_convolutions"]


def pads_into_convolutions(graph: Graph, options: Options | None = None) -> Graph:
    """Fold every explicit zero pad `_foldable` accepts into the convolution reading it (a
    pad read elsewhere too stays for those readers)."""
    chosen = {n for n in graph.nodes if _foldable(graph, n)}
    if not chosen:
        return graph

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> Node | None:
        if node not in chosen:
            return None
        pad = node.inputs[0].node.attrs.pad  # type: ignore[attr-defined]
        # ATen's pad order is (left, right, top, bottom): the last dim first
        padding = tuple(p + extra for p, extra in zip(node.attrs.padding,  # type: ignore
                                                      (pad[2], pad[0])))
        attrs = dataclasses.replace(node.attrs, padding=padding)  # type: ignore[type-var]
        return Node(node.op, (inputs[0].node.inputs[0], *inputs[1:]), attrs, node.types,
                    node.name)
    return transform(graph, rewrite)


def _foldable(graph: Graph, node: Node) -> bool:
    if node.op not in CONVS or len(node.inputs[0].type.shape) != 4:
        return False
    padded = node.inputs[0].node
    if padded.op is not Op.PAD or getattr(node.attrs, "transposed", False):
        return False
    a = padded.attrs
    pad = tuple(a.pad)  # type: ignore[attr-defined]
    if a.value != 0 or len(pad) != 4 or pad[0] != pad[1] or pad[2] != pad[3] \
            or min(pad) < 0:  # type: ignore[attr-defined]
        return False
    if len(padded.inputs[0].type.shape) != 4:
        return False
    weight = weight_only(graph, node.inputs[1])
    return weight is not None and all_finite(weight)
