"""1-D convolutions as 2-D ones over a row of height 1, so that the passes and kernels made
for 2-D convolutions take them: the channels-last layout, the 1x1 GEMMs, and the generated
direct and depthwise convolutions (audio front ends: Whisper's two input convolutions,
wav2vec 2.0's feature encoder; ConvBERT's and Mamba's depthwise ones).

    %y = conv_act(%x, %w, %b) {stride=(2,), padding=(1,), gelu}      f32[1, 512, 1500]
      ->
    %x4 = view(%x) {shape=(1, 512, 1, 3000)}                         (a view)
    %w4 = view(%w) {shape=(512, 512, 1, 3)}                          (folded: a constant)
    %y4 = conv_act(%x4, %w4, %b) {stride=(1, 2), padding=(0, 1), gelu} f32[1, 512, 1, 1500]
    %y  = view(%y4) {shape=(1, 512, 1500)}

ATen runs a 1-D convolution as this 2-D one itself, so the library's call costs the same;
the views are free where the layout is standard, and where the layout pass makes the
convolution channels-last, a view of its [N, C, 1, L] result keeps the strides ([N, C, L]
with the channels innermost), which the transpose that usually follows (to [N, L, C])
turns into a contiguous tensor. A weight computed at run time gets a view as well.
"""

from __future__ import annotations

import dataclasses

from kiln.ir.attrs import ConvActAttrs, ConvAttrs, ShapeAttrs
from kiln.ir.graph import Graph, Node, Value, transform
from kiln.ir.ops import Op
from kiln.ir.types import TensorType
from kiln.options import Options

__all__ = ["conv1d_as_conv2d"]


def conv1d_as_conv2d(graph: Graph, options: Options | None = None) -> Graph:
    """Every 1-D convolution (not transposed) as views around a 2-D one."""
    del options  # (the pass has no settings)
    if not any(_is_1d(n) for n in graph.nodes):
        return graph

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        return _as_2d(node, inputs) if _is_1d(node) else None
    return transform(graph, rewrite)


def _is_1d(node: Node) -> bool:
    if node.op not in (Op.CONVOLUTION, Op.CONV_ACT) or len(node.type.shape) != 3:
        return False
    return not getattr(node.attrs, "transposed", False)


def _as_2d(node: Node, inputs: tuple[Value, ...]) -> list[Value]:
    a = node.attrs
    x, w, *rest = inputs
    n, c_out, length = node.type.shape
    residual = rest.pop() if isinstance(a, ConvActAttrs) and a.has_residual else None
    operands = [_row(x, f"{node.name}_x"), _row(w, f"{node.name}_w"), *rest]
    if residual is not None:
        operands.append(_row(residual, f"{node.name}_residual"))
    attrs = dataclasses.replace(a, stride=(1, *a.stride), padding=(0, *a.padding),  # type: ignore
                                dilation=(1, *a.dilation))
    if isinstance(attrs, ConvAttrs):
        attrs = dataclasses.replace(attrs, output_padding=(0, *attrs.output_padding))
    dtype = node.type.dtype
    conv = Node(node.op, tuple(operands), attrs, (TensorType((n, c_out, 1, length), dtype),),
                node.name).out()
    return [_view(conv, (n, c_out, length), f"{node.name}_1d")]


def _row(value: Value, name: str) -> Value:
    """[N, C, L] as [N, C, 1, L] (a weight [CO, CI, K] as [CO, CI, 1, K])."""
    n, c, length = value.type.shape
    return _view(value, (n, c, 1, length), name)


def _view(value: Value, shape: tuple[int, ...], name: str) -> Value:
    return Node(Op.VIEW, (value,), ShapeAttrs(shape),
                (TensorType(shape, value.type.dtype),), name).out()
