"""Generated direct convolutions: a ``convolution`` / ``conv_act`` node, dense or grouped with
whole register panels a group (`grouped_refusal`), whose input is channels-last at run time
(the `layout` pass made it so), becomes the kernel of `kiln.kernels.conv_schedule`: one more
candidate of `kiln.kernels.contractions`, used only where it measures fastest against the
node's ATen call and oneDNN on a weight reordered once.

    %y = conv_act(%x_nhwc, %w, %b) {stride=(2, 2), padding=(1, 1), groups=1, clamp(0, 6)}
      -> kiln_conv_3x224x224_32_k3x3_s2 (x NHWC, w packed once into [1, 3, 3, 3, 32],
                                         bias; clamp in the write-back; out NHWC)

Which convolutions get a candidate: those whose reduction per output (CI * KH * KW) is at
most `MAX_REDUCTION`, which covers every dense layer of ResNet-50, VGG and Inception v3
(the longest: 512 x 3 x 3). Measured at compile time against ATen's and oneDNN's (on a weight
reordered once), the generated kernel won each of ResNet-50's 3x3 layers (56x56x64: 1.09 ms,
ATen 1.27, oneDNN 1.17; 7x7x512: 0.90, ATen 2.06), and in-process A/B against offering it only
up to a reduction of 160 (first layers): ResNet-50 44.9 vs 46.2 ms, Inception v3 60.0 vs
62.9. It costs cold compiles the C compilation of one kernel per distinct layer (0.1-0.5 s
each, two at a time) and their measurements: ResNet-50 8.8 -> 12.4 s, Inception v3 14.4 ->
19.4 s. On a short reduction (a network's first layer, 3 input channels) the libraries fall
to 30-60% of peak (MobileNetV2's: 119 us, ATen 199, oneDNN 330); ResNet's 7x7 stem, with
its input copied once into a padded workspace, runs in 1094-1188 us against oneDNN's
1360-1470.

The rest is as for the depthwise kernel (`kiln.kernels.depthwise.direct_refusal`): fp32, a
constant finite weight, an activation with a loop form, any kernel size, stride, padding and
dilation. A residual input (``conv_act`` with ``has_residual``: ResNet's basic block, whose
shortcut is added after a 3x3 convolution) starts the accumulator with the bias, where it
reads the residual's channels-last pixels; before, those layers kept ATen's convolution and
add, 1.20-1.25 ms against the generated 0.99-1.02 for the same layer without one
(ResNet-18). A 1x1 convolution rarely gets here: `kiln.passes.pointwise`
makes those GEMMs.

A zero ``pad`` of the spatial dims read by the convolution alone (or by the copy that makes
its input channels-last) joins the group as it does a depthwise convolution's
(`kiln.kernels.depthwise.folded_pad`): HF's MobileNets pad their image a row and a column
at the end (TensorFlow's "same" padding), and the kernel reads the image as it is, the pad
its padding after (`ConvShape.padding_after`). Zen 3: HF MobileNetV2's first layer 0.175 ms
for the three nodes, the library's pad, copy and convolution 0.471.
"""

from __future__ import annotations

import dataclasses

import torch

from kiln.codegen.isa import target_isa
from kiln.cost.machine import full_rate_512
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.shared import packed
from kiln.kernels.build import checked_candidate
from kiln.kernels.checks import Checks
from kiln.kernels.conv_config import MIN_GROUP_LANES, ConvShape
from kiln.kernels.conv_schedule import pack_conv_weight
from kiln.kernels.depthwise import (
    conv_bias,
    conv_residual,
    depthwise_shape,
    direct_refusal,
    epilogue_of,
    folded_pad,
)
from kiln.kernels.outcome import Built, Skipped, SkipReason
from kiln.kernels.plan import KernelPlan
from kiln.kernels.streaming import streams_weights
from kiln.kernels.strides import runtime_strides
from kiln.options import Options
from kiln.passes.layout import channels_last_values
from kiln.passes.partition import KernelGroup, chain, singles
from kiln.tir.nodes import contiguous_strides
from kiln.tune.apply import tuned_or_default
from kiln.tune.space_window import WindowSpace

__all__ = ["MAX_REDUCTION", "NCHW_MAX_CI", "conv_candidate", "conv_groups", "conv_space",
           "group_space", "layout_prologue", "plan_conv", "refusal", "source_strides"]

ConvPlanned = tuple[KernelPlan, tuple[Value, ...], dict[Value, torch.Tensor]]

# the longest reduction per output (CI * KH * KW) that gets a generated candidate: the
# longest measured (see the module docstring; ResNet-50's and VGG's 512 x 3 x 3)
MAX_REDUCTION = 4608
# the most input channels a kernel reads from an NCHW input in place (`layout_prologue`):
# an image's RGB(A)
NCHW_MAX_CI = 4


def conv_groups(graph: Graph) -> list[KernelGroup]:
    """One group per dense convolution the generated kernel takes (`refusal` is None): the
    convolution, after the copy that makes its input channels-last where the kernel reads
    that copy's NCHW source instead (`layout_prologue`)."""
    if graph.device.type != "cpu":
        return []
    nhwc = channels_last_values(graph)
    users = graph.users()
    returned = set(graph.outputs)
    groups = []
    for group in singles(graph, lambda node: _is_direct(node)
                         and refusal(graph, node, nhwc) is None):
        copy = layout_prologue(graph, group.last, users)
        first = copy or group.last
        pad = folded_pad(first, users, returned, nhwc if copy is None else None)
        if pad is not None and copy is not None \
                and runtime_strides(graph, pad.inputs[0]) is not None:
            pad = None  # (the kernel reads an NCHW source only when it is contiguous)
        nodes = (*([pad] if pad is not None else []), *([copy] if copy else []), group.last)
        groups.append(group if len(nodes) == 1 else chain(graph, nodes))
    return groups


def layout_prologue(graph: Graph, node: Node, users: dict[Node, list[Node]]) -> Node | None:
    """The ``to_layout {channels_last}`` copy of a value feeding ``node`` alone, where the
    kernel reads that value in place (`source_strides`). The copy then need not run. None
    where there is no such copy."""
    copy = node.inputs[0].node
    if copy.op is not Op.TO_LAYOUT or not getattr(copy.attrs, "channels_last", False) \
            or users.get(copy) != [node] or copy.out() in graph.outputs:
        return None
    return copy if source_strides(graph, copy.inputs[0]) is not None else None


def source_strides(graph: Graph, source: Value) -> tuple[int, ...] | None:
    """The strides with which a convolution reads ``source`` (the value its channels-last
    copy is made of) in place; None where it cannot. A contiguous NCHW source of at most
    `NCHW_MAX_CI` channels (a network's image input), whose rows of each channel the taps
    read in order (MobileNetV2: 68 us of 5 ms; Inception v3: 173 us). Or a view whose channels are
    adjacent in memory (a channel split of a channels-last value: Inception's branches
    after their merged 1x1 convolutions, 24-81 us a copy, 20 of them), which the tiles read
    as they read channels-last data, only with a longer step between pixels."""
    strides = runtime_strides(graph, source)
    if strides is None:
        nchw = source.type.shape
        return contiguous_strides(nchw) if len(nchw) == 4 and nchw[1] <= NCHW_MAX_CI else None
    if len(strides) == 4 and strides[1] == 1 and source.type.shape[1] > 1 \
            and min(strides[2], strides[3]) >= source.type.shape[1]:
        return strides
    return None


def _is_direct(node: Node) -> bool:
    """A 2-d convolution that is not depthwise (whose kernel is `kiln.kernels.depthwise`)."""
    if node.op not in (Op.CONVOLUTION, Op.CONV_ACT) or len(node.inputs[0].type.shape) != 4:
        return False
    groups = node.attrs.groups  # type: ignore[attr-defined]
    return groups == 1 or node.inputs[0].type.shape[1] // groups > 1


def grouped_refusal(node: Node, lanes: int = MIN_GROUP_LANES) -> str | None:
    """Why a grouped convolution's groups do not suit the kernel: each group's output
    channels must fill whole vectors (`kiln.kernels.conv_config.panel_within_group`), at
    least `MIN_GROUP_LANES` wide (the tiles narrow their vectors to the groups:
    `kiln.kernels.conv_config.group_lanes`), or, 4 channels a group in and out, a vector
    spans whole groups (`kiln.kernels.conv_config.broadcast_group`). ResNeXt-50's 3x3
    layers have 4, 8, 16 and 32 output channels a group: all four qualify."""
    groups = node.attrs.groups  # type: ignore[attr-defined]
    per_group = node.type.shape[1] // groups
    if groups > 1 and per_group % lanes:
        return (f"{groups} groups of {per_group} output channels: not whole vectors of "
                f"{lanes}")
    return None


def refusal(graph: Graph, node: Node, nhwc: set[Value] | None = None) -> str | None:
    """Why the generated kernel does not take this convolution; None where it does."""
    if not _is_direct(node):
        return "not a dense or grouped 2-d convolution (a depthwise one has its own kernel)"
    groups = node.attrs.groups  # type: ignore[attr-defined]
    if groups > 1:
        why = grouped_refusal(node)
        if why:
            return why
    ci = node.inputs[0].type.shape[1] // groups
    kh, kw = node.inputs[1].type.shape[2:]
    if ci * kh * kw > MAX_REDUCTION:
        return (f"a reduction of {ci * kh * kw} per output (> {MAX_REDUCTION}): oneDNN's "
                f"kernels measured ahead there")
    return direct_refusal(graph, node, (node.type.shape[1], ci), nhwc, residual=True)


def conv_shape(node: Node, pad: Node | None = None) -> ConvShape:
    """The convolution's sizes, its input channels-last; over the input of ``pad`` (its
    `kiln.kernels.depthwise.folded_pad`), with that pad's rows and columns added to the
    convolution's own padding."""
    a = node.attrs
    depthwise = depthwise_shape(node, pad)  # (the same sizes, padding and pad folded in)
    return ConvShape(depthwise.n, depthwise.c, depthwise.h, depthwise.w, node.type.shape[1],
                     depthwise.kernel, depthwise.stride, depthwise.padding,
                     tuple(a.dilation), conv_bias(node) is not None,  # type: ignore
                     residual=conv_residual(node) is not None,
                     padding_after=depthwise.padding_after,
                     groups=a.groups)  # type: ignore[attr-defined]


def plan_conv(graph: Graph, group: KernelGroup, options: Options) -> ConvPlanned | Skipped:
    """The plan of the generated kernel for a one-node dense convolution group, its inputs
    (x, the weight, the bias, the residual), and the weight packed for it."""
    node = group.last
    why = refusal(graph, node)
    if why is not None:
        return Skipped(group, SkipReason.NOT_LOWERABLE, why)
    x = group.nodes[0].inputs[0]  # (the copy's source, where the group starts with it)
    plan, decisions = tuned_or_default(group_space(graph, group, options), options)
    w = node.inputs[1]
    bias = conv_bias(node)
    inputs = (x, w) if bias is None else (x, w, bias)
    residual = conv_residual(node)
    inputs += (residual,) if residual is not None else ()
    return plan, inputs, {w: packed(pack_conv_weight, graph.constant(w.node), decisions["nr"])}


def group_space(graph: Graph, group: KernelGroup, options: Options) -> WindowSpace:
    """`conv_space` of the group's convolution, reading its input as the group gets it:
    where the group holds the copy `layout_prologue` finds, what the group reads (that copy's
    source, or the source of the pad before it), with its strides (`source_strides`)."""
    pad = group.nodes[0] if group.nodes[0].op is Op.PAD else None
    copied = any(n.op is Op.TO_LAYOUT for n in group.nodes)
    strides = source_strides(graph, group.nodes[0].inputs[0]) if copied else None
    return dataclasses.replace(conv_space(group.last, options, strides, pad),
                               streamed=streams_weights(graph, group))


def conv_space(node: Node, options: Options, x_strides: tuple[int, ...] | None = None,
               pad: Node | None = None) -> WindowSpace:
    """The design space of the generated kernel for a dense convolution the kernel takes
    (reading its input with ``x_strides``, where given: else channels-last; the input of
    ``pad``, where given); its default point is `ConvConfig.default`, `kiln tune` searches
    the rest."""
    shape = dataclasses.replace(conv_shape(node, pad), x_strides=x_strides)
    (kh, kw), (sh, sw) = shape.kernel, shape.stride
    padded = "" if shape.padding_after is None else \
        "_p" + "x".join(str(p) for p in (*shape.padding, *shape.padding_after))
    return WindowSpace("conv", shape, target_isa(options), torch.get_num_threads(),
                       epilogue_of(node), f"kiln_conv_{shape.ci}x{shape.h}x{shape.w}_{shape.co}"
                       f"{f'_g{shape.groups}' if shape.groups > 1 else ''}"
                       f"_k{kh}x{kw}_s{sh}x{sw}{padded}{'_r' if shape.residual else ''}",
                       full_rate_512=full_rate_512(options))


def conv_candidate(graph: Graph, group: KernelGroup, options: Options,
                   checks: Checks | None = None,
                   planned: ConvPlanned | Skipped | None = None) -> Built | Skipped:
    """The generated dense convolution for a one-node group, compiled and checked against the
    node's ATen call on channels-last operands, not yet measured."""
    planned = planned if planned is not None else plan_conv(graph, group, options)
    return checked_candidate(graph, group, options, planned, checks)
