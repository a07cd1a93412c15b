"""Pointwise (1x1) convolutions on channels-last data as GEMMs over the pixels.

In NHWC memory a 1x1, stride-1 convolution is a matrix product: the input is a row-major
[N*H*W, C_in] matrix, the output a [N*H*W, C_out] one, and the weight a [C_in, C_out]
matrix. Written that way in the IR, the convolution becomes an ``mm`` / ``addmm`` /
``addmm_act`` whose B is a constant, and the contraction stage can run it with kiln's GEMM
on B packed at compile time, its bias and activation in the register tile's write-back
(`kiln.kernels.gemm`), where that measures faster than the library:

    %y = conv_act(%x_nhwc, %w_nhwc, %b) {1x1, clamp(0, 6)}  f32[1, 96, 112, 112]
      ->
    %p  = permute(%x_nhwc) {dims=(0, 2, 3, 1)}      f32[1, 112, 112, 16]   (a view)
    %a  = view(%p) {shape=(12544, 16)}              f32[12544, 16]        (a view)
    %wt = permute(view(%w) {(96, 16)}) {(1, 0)}     f32[16, 96]           (folded: a constant)
    %c  = addmm_act(%b, %a, %wt) {clamp(0, 6)}      f32[12544, 96]
    %y  = permute(view(%c) {(1, 112, 112, 96)}) {(0, 3, 1, 2)}             (NHWC again)

Measured on Zen 4, 2 threads (MobileNetV2 and ResNet-50 layers, the library's NHWC
convolution against kiln's GEMM on the same data): 1.0-1.4x on MobileNetV2's 1x1 layers,
up to 2.7-4x on ResNet-50's 7x7-pixel ones, where oneDNN's convolution is slow.

A strided 1x1 convolution (ResNet's downsampling shortcuts) reads every s-th pixel. Where
generated kernels are on it stays a convolution: kiln's direct convolution reads those pixels
in place (ResNet-50's three, Zen 3, 2 threads, in the model: 1237, 1206 and 1302 us, where
the slices' copy and the GEMM took 1304, 1293 and 1422). Without them, two ``slice`` views
pick the pixels and the ``view`` into GEMM rows copies them (a quarter of the input at
stride 2), which measured far cheaper than oneDNN's strided 1x1 convolution.

Only where the value is NHWC at run time as far as the IR tells
(`kiln.passes.layout.channels_last_values`): the views are then free. If it is not, the
``view`` copies (the IR's view is a reshape: it keeps the logical order), so the result is
right either way.

A residual operand (``conv_act`` with ``has_residual``: ResNet's last 1x1 convolution of a
block, MobileNetV2's projection) becomes addmm's [N*H*W, C_out] input, with the bias added
to it first: ``addmm_act(residual + b, a, wt)``. kiln's GEMM takes the sum and the GEMM as
one kernel (`partition.gemms`) and starts its register tiles from ``r + b`` (`matmul_func`'s
``bias_matrix`` and ``bias_row``), so the residual is read once, in the tile, as oneDNN's
post-op reads it, and the sum is never written. Rounding: ``(r + b) + x@w`` where the
convolution computes ``(x@w + b) + r``.
"""

from __future__ import annotations

from kiln.ir.attrs import (
    NO_ATTRS,
    AddmmActAttrs,
    AddmmAttrs,
    ConvActAttrs,
    ConvAttrs,
    PermuteAttrs,
    ShapeAttrs,
    SliceAttrs,
)
from kiln.ir.graph import Graph, Node, Value, transform
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.options import Options
from kiln.passes.layout import channels_last_values

__all__ = ["pointwise_as_gemm", "takes"]



def pointwise_as_gemm(graph: Graph, options: Options | None = None) -> Graph:
    """Rewrite every 1x1 convolution `takes` accepts as views around a GEMM. A strided one
    stays a convolution where kiln's direct convolution may run it (generated kernels on):
    that kernel reads every s-th pixel in place, where the GEMM reads a copy of them."""
    if graph.device.type != "cpu":
        return graph
    options = options or Options()
    direct = options.generated_kernels and options.generated_gemm
    nhwc = channels_last_values(graph)
    chosen = {n for n in graph.nodes if takes(n, nhwc, strided=not direct)}
    if not chosen:
        return graph

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if node not in chosen:
            return None
        return [_as_gemm(node, inputs)]
    return transform(graph, rewrite)


def takes(node: Node, nhwc: set[Value], strided: bool = True) -> bool:
    """A 1x1, unpadded, ungrouped fp32 convolution of an NHWC value (with a bias or a
    residual where it has an activation); a strided one only with ``strided`` (see
    `pointwise_as_gemm`)."""
    if node.op not in (Op.CONVOLUTION, Op.CONV_ACT) or len(node.type.shape) != 4:
        return False
    a = node.attrs
    if isinstance(a, ConvAttrs) and a.transposed:
        return False
    if isinstance(a, ConvActAttrs) and a.activation is not None and not (
            a.has_bias or a.has_residual):
        return False  # (addmm_act needs an input to add; BN folding gives a bias)
    x, w = node.inputs[0], node.inputs[1]
    if x not in nhwc or any(v.type.dtype is not DType.F32 for v in node.inputs):
        return False
    return (tuple(w.type.shape[2:]) == (1, 1) and a.groups == 1  # type: ignore[attr-defined]
            and tuple(a.padding) == (0, 0)  # type: ignore[attr-defined]
            and (strided or tuple(a.stride) == (1, 1))  # type: ignore[attr-defined]
            and 0 not in x.type.shape and 0 not in w.type.shape)


def _as_gemm(node: Node, inputs: tuple[Value, ...]) -> Value:
    x, w = inputs[0], inputs[1]
    if w.node.op is Op.TO_LAYOUT:  # the layout pass's copy: the GEMM wants the plain weight
        w = w.node.inputs[0]
    n, c_in, h_in, w_in = x.type.shape
    c_out, h, width = node.type.shape[1:]
    m = n * h * width
    name = node.name

    def make(op: Op, operands: tuple[Value, ...], attrs, shape: tuple[int, ...],
             suffix: str) -> Value:
        return Node(op, operands, attrs, (TensorType(shape, DType.F32),),
                    f"{name}_{suffix}").out()

    rows = make(Op.PERMUTE, (x,), PermuteAttrs((0, 2, 3, 1)), (n, h_in, w_in, c_in), "pixels")
    stride = tuple(node.attrs.stride)  # type: ignore[attr-defined]
    if stride[0] > 1:  # a strided 1x1 reads every s-th pixel: the view below then copies them
        rows = make(Op.SLICE, (rows,), SliceAttrs(1, 0, h_in, stride[0]), (n, h, w_in, c_in),
                    "rows")
    if stride[1] > 1:
        rows = make(Op.SLICE, (rows,), SliceAttrs(2, 0, w_in, stride[1]), (n, h, width, c_in),
                    "columns")
    a = make(Op.VIEW, (rows,), ShapeAttrs((m, c_in)), (m, c_in), "a")
    w2 = make(Op.VIEW, (w,), ShapeAttrs((c_out, c_in)), (c_out, c_in), "w")
    b = make(Op.PERMUTE, (w2,), PermuteAttrs((1, 0)), (c_in, c_out), "wt")
    attrs = node.attrs
    fused = isinstance(attrs, ConvActAttrs)
    bias = inputs[2] if (attrs.has_bias if fused else len(inputs) > 2) else None  # type: ignore
    act = attrs.activation if fused else None  # type: ignore[union-attr]
    if fused and attrs.has_residual:  # type: ignore[union-attr]
        # addmm's input is the residual as an [M, N] matrix, with the bias added to it (one
        # pass over it: the GEMM then starts its tiles from it, as oneDNN's post-op would)
        r = make(Op.PERMUTE, (inputs[-1],), PermuteAttrs((0, 2, 3, 1)), (n, h, width, c_out),
                 "residual_pixels")
        r2 = make(Op.VIEW, (r,), ShapeAttrs((m, c_out)), (m, c_out), "residual")
        bias = r2 if bias is None else make(Op.ADD, (r2, bias), NO_ATTRS, (m, c_out),
                                            "residual_bias")
    if act is not None:  # (`takes` saw a bias or a residual: addmm_act has its input)
        out = make(Op.ADDMM_ACT, (bias, a, b), AddmmActAttrs(act, attrs.act_args),  # type: ignore
                   (m, c_out), "gemm")
    elif bias is not None:
        out = make(Op.ADDMM, (bias, a, b), AddmmAttrs(), (m, c_out), "gemm")
    else:
        out = make(Op.MM, (a, b), NO_ATTRS, (m, c_out), "gemm")
    grid = make(Op.VIEW, (out,), ShapeAttrs((n, h, width, c_out)), (n, h, width, c_out),
                "grid")
    return make(Op.PERMUTE, (grid,), PermuteAttrs((0, 3, 1, 2)), (n, c_out, h, width), "nchw")
