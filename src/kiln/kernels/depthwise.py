"""Generated depthwise convolutions: a ``convolution`` / ``conv_act`` node with groups = in
channels = out channels, whose input is channels-last at run time (the `layout` pass made it
so), becomes the kernel of `kiln.kernels.depthwise_schedule`: one more candidate of
`kiln.kernels.contractions`, used only where it measures fastest against the node's ATen
call and oneDNN on its shapes, on this machine.

    %y = conv_act(%x_nhwc, %w, %b) {stride=(2, 2), padding=(1, 1), groups=96, clamp(0, 6)}
      -> kiln_depthwise_96x112x112_k3x3_s2 (x NHWC, w packed once to [3, 3, 96], bias;
                                           clamp in the write-back; out NHWC)

The weight is packed once, at compile time, into ``[KH, KW, C]`` (`pack_depthwise_weight`),
bound to the kernel as the GEMM's packed panels are. The kernel's buffers carry NHWC strides,
so the runtime checks its input's strides and falls back to the node's ATen call where they
differ, and gives the output NHWC, as ATen's convolution does on an NHWC input.

What it takes, and why the rest stays a library call:

* fp32; a 4-d input; a constant weight [C, 1, KH, KW] with every value finite (ATen's NHWC
  convolution skips the zero padding where the NCHW one multiplies it by the weight; the
  kernel skips it too, which is the same sum only for finite weights); any kernel size,
  stride, padding and dilation; a bias (constant or not); the activations of
  `kiln.ir.fused.ACTIVATIONS` that have a loop form.
* Only an input that is NHWC at run time (`kiln.passes.layout.channels_last_values`): in
  NCHW memory a vector of channels is a gather, and a kernel vectorized along the row
  instead would need strided loads at stride 2; such convolutions stay with oneDNN.
* No residual input (``conv_act`` with ``has_residual``): MobileNet's residual adds follow
  the 1x1 projection, not the depthwise convolution. One input channel (groups = 1) is an
  ordinary convolution.

A zero ``pad`` of the spatial dims read by the convolution alone (TensorFlow's "same"
padding, which HF's MobileNets write before each strided depthwise convolution: one row and
one column at the end) joins its group (`folded_pad`): the kernel reads the unpadded input,
and the pad's rows and columns are more of its skipped taps (`DepthwiseShape.padding_after`).
ATen's pad of an NHWC image took 0.24 ms of HF MobileNetV2's 5.3, for a convolution of 0.1.
"""

from __future__ import annotations

import torch

from kiln.codegen.isa import target_isa
from kiln.ir.attrs import ConvActAttrs, ConvAttrs, PadAttrs
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.shared import all_finite, packed
from kiln.ir.types import DType
from kiln.kernels.build import checked_candidate
from kiln.kernels.checks import Checks
from kiln.kernels.depthwise_schedule import DepthwiseShape, pack_depthwise_weight
from kiln.kernels.outcome import Built, Skipped, SkipReason
from kiln.kernels.plan import Epilogue, KernelPlan
from kiln.options import Options
from kiln.passes.layout import channels_last_values
from kiln.passes.partition import KernelGroup, chain
from kiln.tir.lower_elementwise import activation
from kiln.tir.te import NotLowerable
from kiln.tune.apply import tuned_or_default
from kiln.tune.space_window import WindowSpace

__all__ = ["conv_bias", "conv_residual", "depthwise_candidate", "depthwise_groups",
           "depthwise_shape", "depthwise_space", "direct_refusal", "epilogue_of", "folded_pad",
           "plan_depthwise", "refusal"]

DepthwisePlanned = tuple[KernelPlan, tuple[Value, ...], dict[Value, torch.Tensor]]


def depthwise_groups(graph: Graph) -> list[KernelGroup]:
    """One group per depthwise convolution the generated kernel takes (`refusal` is None):
    the convolution, after its `folded_pad` where it has one."""
    if graph.device.type != "cpu":
        return []
    nhwc = channels_last_values(graph)
    users = graph.users()
    returned = set(graph.outputs)
    groups = []
    for node in graph.nodes:
        if _is_depthwise(node) and refusal(graph, node, nhwc) is None:
            pad = folded_pad(node, users, returned, nhwc)
            groups.append(chain(graph, [node] if pad is None else [pad, node]))
    return groups


def folded_pad(node: Node, users: dict[Node, list[Node]], returned: set[Value],
               nhwc: set[Value] | None) -> Node | None:
    """The zero ``pad`` node whose result ``node`` (a depthwise convolution, a dense one, or
    the copy that makes a dense one's input channels-last) alone reads, where it pads only
    the two spatial dims, by nothing negative, of an input that is channels-last at run
    time (in ``nhwc``; any layout where that is None: the caller checks); else None."""
    pad = node.inputs[0].node
    attrs = pad.attrs
    if pad.op is not Op.PAD or not isinstance(attrs, PadAttrs) or attrs.value != 0:
        return None
    if len(attrs.pad) != 4 or min(attrs.pad) < 0 or len(pad.inputs[0].type.shape) != 4 \
            or (nhwc is not None and pad.inputs[0] not in nhwc):
        return None
    if users[pad] != [node] or pad.out() in returned:
        return None
    return pad


def _is_depthwise(node: Node) -> bool:
    if node.op not in (Op.CONVOLUTION, Op.CONV_ACT) or len(node.inputs[0].type.shape) != 4:
        return False
    channels = node.inputs[0].type.shape[1]
    return node.attrs.groups == channels > 1 and node.type.shape[1] == channels  # type: ignore


def refusal(graph: Graph, node: Node, nhwc: set[Value] | None = None) -> str | None:
    """Why the generated kernel does not take this depthwise convolution; None where it does."""
    if not _is_depthwise(node):
        return "not a depthwise convolution (groups = in channels = out channels > 1)"
    c = node.inputs[0].type.shape[1]
    return direct_refusal(graph, node, (c, 1), nhwc)


def direct_refusal(graph: Graph, node: Node, weight_dims: tuple[int, int],
                   nhwc: set[Value] | None = None, residual: bool = False) -> str | None:
    """What a generated direct convolution (depthwise, or dense in `kiln.kernels.conv`)
    does not take, whatever its grouping: ``weight_dims`` are the weight's first two dims
    it needs (out channels, in channels per group); ``residual``: whether it takes a
    residual input (channels-last at run time, of the output's shape)."""
    a = node.attrs
    x, w = node.inputs[0], node.inputs[1]
    if any(v.type.dtype is not DType.F32 for v in node.inputs if v.node.op is not Op.SCALAR):
        return "not fp32"
    if isinstance(a, ConvAttrs) and a.transposed:
        return "transposed"
    if isinstance(a, ConvActAttrs):
        if a.has_residual:
            if not residual:
                return "a residual input"
            r = conv_residual(node)
            nhwc = channels_last_values(graph) if nhwc is None else nhwc
            if r is None or r.type.shape != node.type.shape or r not in nhwc:
                return "a residual input not channels-last at run time, of the output's shape"
        if a.activation is not None:
            try:
                activation(a.activation, a.act_args)
            except NotLowerable:
                return f"no loop form for {a.activation.text}"
    bias = conv_bias(node)
    if bias is not None and bias.type.shape != (node.type.shape[1],):
        return "a bias not of shape [C_out]"
    if w.node.op is not Op.CONSTANT or w.type.shape[:2] != weight_dims:
        return f"a weight that is not a constant [{weight_dims[0]}, {weight_dims[1]}, KH, KW]"
    if any(d == 0 for d in (*x.type.shape, *node.type.shape)):
        return "an empty tensor"
    if not all_finite(graph.constant(w.node)):
        return "non-finite weights (the padding would meet them)"
    nhwc = channels_last_values(graph) if nhwc is None else nhwc
    if x not in nhwc:
        return "an input that is not channels-last at run time"
    return None


def conv_residual(node: Node) -> Value | None:
    """A ``conv_act`` node's residual input, or None."""
    a = node.attrs
    if not isinstance(a, ConvActAttrs) or not a.has_residual:
        return None
    return node.inputs[3 if a.has_bias else 2]


def conv_bias(node: Node) -> Value | None:
    """A convolution node's bias input, or None."""
    a = node.attrs
    if isinstance(a, ConvActAttrs):
        return node.inputs[2] if a.has_bias else None
    return node.inputs[2] if len(node.inputs) > 2 else None


def depthwise_shape(node: Node, pad: Node | None = None) -> DepthwiseShape:
    """The convolution's sizes; over the input of ``pad`` (its `folded_pad`), with that
    pad's rows and columns added to the convolution's own padding."""
    a = node.attrs
    kh, kw = node.inputs[1].type.shape[2:]
    ph, pw = a.padding  # type: ignore[attr-defined]
    if pad is None:
        n, c, h, w = node.inputs[0].type.shape
        before, after = (ph, pw), None
    else:
        n, c, h, w = pad.inputs[0].type.shape
        left, right, top, bottom = pad.attrs.pad  # type: ignore[attr-defined]
        before, after = (ph + top, pw + left), (ph + bottom, pw + right)
    return DepthwiseShape(n, c, h, w, (kh, kw), tuple(a.stride), before,  # type: ignore
                          tuple(a.dilation), conv_bias(node) is not None,  # type: ignore
                          padding_after=after)


def plan_depthwise(graph: Graph, group: KernelGroup, options: Options
                   ) -> DepthwisePlanned | Skipped:
    """The plan of the generated kernel for a depthwise group (the convolution, after its
    `folded_pad` where it has one), its inputs (x, the weight, the bias), and the weight
    packed for it."""
    node = group.last
    why = refusal(graph, node)
    if why is not None:
        return Skipped(group, SkipReason.NOT_LOWERABLE, why)
    pad = group.nodes[0] if len(group.nodes) == 2 else None
    plan, _ = tuned_or_default(depthwise_space(node, options, pad), options)
    w = node.inputs[1]
    bias = conv_bias(node)
    x = node.inputs[0] if pad is None else pad.inputs[0]
    inputs = (x, w) if bias is None else (x, w, bias)
    return plan, inputs, {w: packed(pack_depthwise_weight, graph.constant(w.node))}


def depthwise_space(node: Node, options: Options, pad: Node | None = None) -> WindowSpace:
    """The design space of the generated kernel for a depthwise convolution it takes (after
    its `folded_pad`, if given); its default point is `DepthwiseConfig.default`, `kiln tune`
    searches the rest."""
    shape = depthwise_shape(node, pad)
    (kh, kw), (sh, sw) = shape.kernel, shape.stride
    padded = "" if shape.padding_after is None else \
        "_p" + "x".join(str(p) for p in (*shape.padding, *shape.padding_after))
    return WindowSpace("depthwise", shape, target_isa(options), torch.get_num_threads(),
                       epilogue_of(node), f"kiln_depthwise_{shape.c}x{shape.h}x{shape.w}_k{kh}"
                       f"x{kw}_s{sh}x{sw}{padded}")


def epilogue_of(node: Node) -> Epilogue | None:
    """A ``conv_act``'s activation as its kernel's write-back epilogue (None: none)."""
    a = node.attrs
    act = a.activation if isinstance(a, ConvActAttrs) else None
    return Epilogue(act, a.act_args) if act is not None else None  # type: ignore[union-attr]


def depthwise_candidate(graph: Graph, group: KernelGroup, options: Options,
                        checks: Checks | None = None,
                        planned: DepthwisePlanned | Skipped | None = None) -> Built | Skipped:
    """The generated depthwise kernel for a group of `depthwise_groups`, compiled and checked
    against its nodes' ATen calls on channels-last operands (``checks`` remembers the
    answers), not yet measured."""
    planned = planned if planned is not None else plan_depthwise(graph, group, options)
    return checked_candidate(graph, group, options, planned, checks)
