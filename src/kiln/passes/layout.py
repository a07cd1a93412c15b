"""Channels-last (NHWC) memory layout for convolution chains, where it measures faster.

    before                                        after
    %y = conv_act(%x, %w, %b) ...                 %x_cl = to_layout(%x) {channels_last=True}
    %z = conv_act(%y, %w2, %b2) ...               %w_cl = to_layout(%w) {channels_last=True}
    %f = view(%z) {shape=(1, 512)}                %y = conv_act(%x_cl, %w_cl, %b) ...
                                                  ...
                                                  %z_c = clone(%z)      (contiguous again)
                                                  %f = view(%z_c) {shape=(1, 512)}

The IR has no layout: ATen carries it at run time (a convolution with channels-last weights
runs in NHWC and returns NHWC; elementwise ops, pooling and cat keep their input's layout).
The pass converts the weights (folded at compile time) and the data entering the chain, and
puts a contiguous copy before every reader that could depend on the layout: a view its
strides would not allow, an opaque ATen call, and a graph output (eager returns NCHW).

Whether to do it is measured, not assumed: each convolution of the graph is timed both
ways on this machine, and the layout changes only if the total is at least 5% lower
(mobilenet_v2: 18.6 ms -> 15.5 ms in eager; resnet50: no change).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from kiln.cost.measure import Budget, interleaved
from kiln.cost.measured import kept_seconds
from kiln.ir import calls
from kiln.ir.attrs import NO_ATTRS, Attrs, LayoutAttrs
from kiln.ir.graph import Graph, Node, Value, transform
from kiln.ir.infer import META
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op, OpGroup
from kiln.ir.shared import all_finite
from kiln.options import Options
from kiln.rules.movement import dense_result

CONVS = frozenset({Op.CONVOLUTION, Op.CONV_ACT})
# ops whose result takes the layout of their (4-d) operands at run time (ATen 2.13's
# constant_pad_nd too: TF-style explicit pads before MobileNetV2's stride-2 convolutions)
KEEPS_LAYOUT = frozenset({Op.CONV_ACT, Op.CONVOLUTION, Op.CAT, Op.BATCH_NORM, Op.PAD})
# opaque calls that run NHWC on an NHWC input and return NHWC (ATen's upsamplings): one
# that feeds convolutions only upsamples NHWC from its input's copy, where the copy of its
# output was the larger (ViTPose's head: a 4x bilinear upsampling before a 3x3
# convolution, 9.8 ms of copy after an 18 ms upsampling)
_aten = torch.ops.aten
RELAYOUT_CALLS = frozenset({_aten.upsample_bilinear2d.default, _aten.upsample_bilinear2d.vec,
                            _aten.upsample_nearest2d.default, _aten.upsample_nearest2d.vec})
REQUIRED_GAIN = 0.95
# per convolution, both layouts; no full garbage collection first: at compile time, with the
# compiler's objects alive, one costs more than the timing (0.35 s each on Inception)
LAYOUT_BUDGET = Budget(min_rounds=3, max_rounds=3, collect_first=False)


def to_channels_last(graph: Graph, options: Options | None = None,
                     decide: bool | None = None) -> Graph:
    """Rewrite for NHWC when measured faster; ``decide`` skips the measurement (tests)."""
    convs = [n for n in graph.nodes if _nhwc_capable(n, graph)]
    if not convs:
        return graph
    if decide is None:
        options = options if options is not None else Options()
        decide = _measured_faster(convs, options)
    if not decide:
        return graph
    return _rewrite(graph, set(convs))


def _nhwc_capable(node: Node, graph: Graph) -> bool:
    if node.op not in CONVS or len(node.type.shape) != 4 or _one_channel(node):
        return False
    return not getattr(node.attrs, "transposed", False) and not _pads_nonfinite(node, graph)


def _one_channel(node: Node) -> bool:
    """One input channel: ATen 2.13's convolution on such an input (or weight) in real
    channels-last strides computes wrong values for a width stride of 2 with an output one
    wide (x: (2, 1, 7, 4), w: (1, 1, 3, 3), stride (1, 2); fuzz seed 9, graph 55743). The
    layout gains nothing there: such a convolution reads NCHW."""
    x = node.inputs[0].type
    return len(x.shape) == 4 and x.shape[1] == 1


def _pads_nonfinite(node: Node, graph: Graph) -> bool:
    """Might the zero padding meet a non-finite weight? ATen's NCHW convolution multiplies the
    padding by the weights (0 * inf is NaN) where its NHWC one skips it: the results differ."""
    if not any(node.attrs.padding):  # type: ignore[attr-defined]
        return False
    weight = weight_only(graph, node.inputs[1])
    if weight is None:
        return True  # values known only at run time
    return not all_finite(weight)


_NOT_CONSTANT = object()


def weight_only(graph: Graph, value: Value, depth: int = 8) -> torch.Tensor | None:
    """The value of a weight computed from constants only (a weight that batch norm folding
    rewrote, which `fold.rewritten` folds only after this pass), or None where it depends on
    anything else. Without it every padded convolution after a batch norm stayed NCHW (all
    of MobileNetV2's and ResNet's 3x3 convolutions), each between two layout copies."""
    found = _evaluated(graph, value, depth)
    return found if isinstance(found, torch.Tensor) else None


def _evaluated(graph: Graph, value: Value, depth: int) -> object:
    node = value.node
    if node.op is Op.CONSTANT:
        return graph.constant(node)
    if node.op is Op.SCALAR:
        return node.attrs.value  # type: ignore[attr-defined]
    if depth == 0 or node.op.is_a(OpGroup.SOURCE) or not calls.is_pure(node):
        return _NOT_CONSTANT
    args = [_evaluated(graph, v, depth - 1) for v in node.inputs]
    if any(a is _NOT_CONSTANT for a in args):
        return _NOT_CONSTANT
    with torch.no_grad():
        return evaluate_node(node, args, graph)[value.index]


def _relayout_call(node: Node) -> bool:
    return node.op is Op.CALL and node.attrs.target in RELAYOUT_CALLS  # type: ignore


def _upsampled_for_convs(graph: Graph, convs: set[Node]) -> set[Node]:
    """The upsamplings (`RELAYOUT_CALLS`) whose result only ``convs`` read, as their input:
    those upsample the NHWC copy of their input (several times smaller) instead."""
    users = graph.users()
    returned = {v.node for v in graph.outputs}
    return {node for node in graph.nodes if _relayout_call(node) and node not in returned
            and len(node.types) == 1 and len(node.types[0].shape) == 4
            and users.get(node) and all(u in convs and u.inputs[0] == node.out()
                                        and node.out() not in u.inputs[1:]
                                        for u in users[node])}


def _rewrite(graph: Graph, convs: set[Node]) -> Graph:
    lifted = _upsampled_for_convs(graph, convs)
    nhwc = _channels_last_values(graph, convs | lifted)
    made: dict[tuple[Value, bool], Value] = {}

    def converted(value: Value, to_nhwc: bool) -> Value:
        if (value, to_nhwc) not in made:
            op, attrs = (Op.TO_LAYOUT, LayoutAttrs(True)) if to_nhwc else (Op.CLONE, NO_ATTRS)
            suffix = "nhwc" if to_nhwc else "nchw"
            node = Node(op, (value,), attrs, (value.type,), f"{value.node.name}_{suffix}")
            made[(value, to_nhwc)] = node.out()
        return made[(value, to_nhwc)]

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> Node | None:
        new = list(inputs)
        if node in convs:
            if node.inputs[0] not in nhwc:
                new[0] = converted(inputs[0], True)
            new[1] = converted(inputs[1], True)
        elif node in lifted:
            if node.inputs[0] not in nhwc:
                new[0] = converted(inputs[0], True)
        else:
            # a convolution kept NCHW for its padding must also read NCHW: ATen picks the
            # algorithm by its input's layout
            kept = node.op in CONVS and _pads_nonfinite(node, graph)
            for i, original in enumerate(node.inputs):
                if original in nhwc and (kept or _needs_standard_layout(node, i)):
                    new[i] = converted(inputs[i], False)
        attrs = _plain_dilation(node) if node.op in CONVS else node.attrs
        if tuple(new) == inputs and attrs is node.attrs:
            return None
        return Node(node.op, new, attrs, node.types, node.name)

    result = transform(graph, rewrite)
    index = dict(zip(graph.outputs, result.outputs))
    fixed = [converted(index[v], False) if v in nhwc else index[v] for v in graph.outputs]
    present = set(result.nodes)
    extra = [v.node for v in fixed if v.node not in present and v.node.op is Op.CLONE]
    return result.replace(nodes=result.nodes + tuple(dict.fromkeys(extra)), outputs=fixed)


def _plain_dilation(node: Node) -> Attrs:
    """The convolution's attributes with dilation 1 where the kernel is 1 wide (the same
    convolution): ATen's NHWC convolution (oneDNN) segfaults on a dilated 1-wide kernel
    over a padded 1-wide input with stride 2, where the NCHW one computes it."""
    a = node.attrs
    kernel = node.inputs[1].type.shape[2:]
    # a transposed convolution's output padding must stay below its stride or dilation
    padding_out = getattr(a, "output_padding", None) if getattr(a, "transposed", False) \
        else None
    keep = [bool(padding_out) and padding_out[i] >= a.stride[i]  # type: ignore[attr-defined]
            for i in range(len(kernel))]
    dilation = tuple(1 if k == 1 and not kept else d
                     for k, d, kept in zip(kernel, a.dilation, keep))  # type: ignore
    if dilation == tuple(a.dilation):  # type: ignore[attr-defined]
        return a
    return dataclasses.replace(a, dilation=dilation)  # type: ignore[type-var]


def _channels_last_values(graph: Graph, convs: set[Node]) -> set[Value]:
    """Values that may be NHWC at run time once the convolutions are."""
    return _nhwc_values(graph, convs)


def channels_last_values(graph: Graph) -> set[Value]:
    """The 4-d values of a graph this pass rewrote that are NHWC at run time (as far as the
    IR tells: what a ``to_layout {channels_last}`` makes, a GEMM's result seen as NCHW
    pixels or any NCHW view of NHWC memory (`_nhwc_view`), and what convolutions,
    elementwise ops and pooling make of it, up to the contiguous copies). A kernel that
    reads such a value channels-last still checks its strides when it runs."""
    return _nhwc_values(graph, set())


def _nhwc_values(graph: Graph, convs: set[Node]) -> set[Value]:
    """One pass in graph order: the NHWC values (the seeds: ``convs``, channels-last copies,
    NCHW views of dense NHWC memory; then what keeps their layout), and beside them the
    [N, H, W, C] values that are dense at run time although ATen's rules alone do not say
    so: ``permute(v) {(0, 2, 3, 1)}`` of an NHWC ``v``, and elementwise results of such
    values and dense ones (a ConvNeXt stage's first residual add, reading the downsampling
    convolution's output through that permute)."""
    nhwc: set[Value] = set()
    dense: set[Value] = set()
    for node in graph.nodes:
        four_d = len(node.types) >= 1 and len(node.types[0].shape) == 4
        if not four_d:
            continue
        seed = node in convs or _nhwc_view(node, graph, dense) or (
            node.op is Op.TO_LAYOUT and getattr(node.attrs, "channels_last", False)) or (
            _viewed_back(node) in nhwc)
        if seed:
            nhwc.add(node.out())
        elif (node.op in KEEPS_LAYOUT or node.op.is_a(OpGroup.ELEMENTWISE)
              or node.op.is_a(OpGroup.POOLING)) and any(v in nhwc for v in node.inputs):
            nhwc.update(v for v in node.outputs if len(v.type.shape) == 4)
        elif _relayout_call(node) and node.inputs and node.inputs[0] in nhwc:
            nhwc.update(v for v in node.outputs if len(v.type.shape) == 4)
        elif node.op is Op.PERMUTE and tuple(node.attrs.dims) == (0, 2, 3, 1) \
                and node.inputs[0] in nhwc:  # type: ignore[attr-defined]
            dense.add(node.out())
        elif node.op.is_a(OpGroup.ELEMENTWISE) and any(v in dense for v in node.inputs) \
                and all(v in dense or v.node.op is Op.SCALAR or dense_result(v, graph)
                        for v in node.inputs):
            dense.add(node.out())
    return nhwc


def _nhwc_view(node: Node, graph: Graph, dense: set[Value]) -> bool:
    """``permute(x) {(0, 3, 1, 2)}`` of an [N, H, W, C] value ``x`` that is contiguous at
    run time (ATen makes it so, or it is in ``dense``): the NCHW view of NHWC memory.
    `kiln.passes.pointwise`'s GEMM result seen as an image (``x`` a view of the [N*H*W, C]
    matrix); ConvNeXt's blocks, which normalize and project their channels as the last
    dim, then permute back to NCHW."""
    if node.op is not Op.PERMUTE or tuple(node.attrs.dims) != (0, 3, 1, 2):  # type: ignore
        return False
    return node.inputs[0] in dense or dense_result(node.inputs[0], graph)


def _viewed_back(node: Node) -> Value | None:
    """The 4-d value that views which only drop or insert dims of size 1 (so never copy)
    took away from its shape and back, ``node`` the last of them: a 1-d convolution's
    result between two 2-d ones (`kiln.passes.conv1d`), ``view(view(y) {[N, C, L]})
    {[N, C, 1, L]}``. None where there is none."""
    if node.op is not Op.VIEW:
        return None
    shape = node.type.shape
    source = node.inputs[0]
    while source.type.shape != shape:
        if source.node.op is not Op.VIEW or _sizes(source.type.shape) != _sizes(shape):
            return None
        source = source.node.inputs[0]
    return source


def _sizes(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _needs_standard_layout(node: Node, index: int) -> bool:
    """Could ``node`` misbehave if its ``index``-th operand were NHWC?"""
    if _relayout_call(node) and index == 0:
        return False  # (NHWC in, NHWC out: the values that follow it say so)
    if node.op is Op.CALL or node.op is Op.TO_LAYOUT:
        return True
    if node.op in CONVS and index == 0 and _one_channel(node):
        return True
    if node.op is Op.VIEW:
        t = node.inputs[index].type
        probe = torch.empty(t.shape, dtype=t.dtype.torch, device=META).contiguous(
            memory_format=torch.channels_last)
        try:  # (the view itself would copy: one explicit copy, where it shows)
            probe.view(node.attrs.shape)  # type: ignore[attr-defined]
        except (RuntimeError, ValueError):  # (meta tensors raise the latter)
            return True
    return False


def _measured_faster(convs: list[Node], options: Options) -> bool:
    """Whether the convolutions run faster in NHWC, by their times in both layouts: measured
    once per machine and kept on disk (`kiln.cost.measured.kept_seconds`), so that a
    recompile does not time them again (Inception v3's 40 took 0.8 s of each compile)."""
    standard = nhwc = 0.0
    for node in convs:
        signature = _signature(node)
        a, b = kept_seconds(options, ("conv layouts", signature, options.prepacked_library),
                            functools.partial(_conv_times, signature, options.prepacked_library))
        standard += a
        nhwc += b
    return nhwc < REQUIRED_GAIN * standard


def _signature(node: Node) -> tuple:
    a = node.attrs
    x, w = node.inputs[0].type, node.inputs[1].type
    return (x.shape, w.shape, x.dtype.torch, tuple(a.stride), tuple(a.padding),  # type: ignore
            tuple(_plain_dilation(node).dilation), a.groups)  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=512)
def _conv_times(signature: tuple, prepacked: bool = False) -> tuple[tuple[float, float], bool]:
    """Median seconds of one convolution in NCHW and in NHWC, interleaved: per layout the
    faster of ATen's convolution and, with ``prepacked``, oneDNN on a weight reordered once
    (what `kiln.kernels.library` may run it with; it gains more from NHWC than ATen does:
    ResNet-50 55.8 -> 50.1 ms with every convolution NHWC, where ATen alone shows no gain);
    and whether they were steady (`Timing.steady`; only such are kept)."""
    x_shape, w_shape, dtype, stride, padding, dilation, groups = signature
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=gen).to(dtype)
    w = torch.randn(w_shape, generator=gen).to(dtype)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    conv = torch.ops.aten.convolution.default
    args = (list(padding), list(stride), list(dilation), groups)

    def run(xi: torch.Tensor, wi: torch.Tensor) -> Callable[[], object]:
        return lambda: conv(xi, wi, None, list(stride), list(padding), list(dilation), False,
                            [0, 0], groups)

    contenders = [run(x, w), run(x_cl, w_cl)]
    if prepacked and dtype is torch.float32 and torch.backends.mkldnn.is_available():
        mkldnn = torch.ops.mkldnn
        packed = mkldnn._reorder_convolution_weight(w, *args, list(x_shape))

        def onednn(xi: torch.Tensor) -> Callable[[], object]:
            return lambda: mkldnn._convolution_pointwise(xi, packed, None, *args, "none", [],
                                                         "")
        contenders += [onednn(x), onednn(x_cl)]
    with torch.no_grad():
        timings = interleaved(contenders, LAYOUT_BUDGET)
    times = [t.median_s for t in timings]
    steady = all(t.steady() for t in timings)
    return (min(times[0::2]), min(times[1::2])), steady
