"""Library variants: the same contraction through another library entry point that reads a
weight prepared once, at compile time, in the library's own layout.

    conv_act(x, W, b, r){relu}  ->  relu_(mkldnn._convolution_pointwise.binary(x, r, W', b,
                                    ..., "add", ...))        W' = W reordered for oneDNN
    addmm_act(b, x, Wt){gelu}   ->  gelu_(mkldnn._linear_pointwise(x, W', b, "none", ...))

ATen's ``convolution`` and ``addmm`` reorder (oneDNN) or pack (MKL) the weight on every call;
these variants do it once, and run the bias and the residual add as the library's post-ops.
The activation runs afterwards, in place, with ATen's own kernel (`kiln.ir.fused`): oneDNN's
relu post-op turns NaN into 0 where torch.relu keeps NaN, so fusing it would change results.
A variant replaces the node only where `kiln.kernels.contractions` measures it fastest, the
node's own ATen call included, on its shapes, on this machine; its result is checked against
that call first (`validate`).

Each variant is a `LibraryKernel`: a callable of the node's non-weight operands, in order,
with the prepared weights bound.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.attrs import AddmmActAttrs, AddmmAttrs, ConvActAttrs, ConvAttrs
from kiln.ir.fused import ACTIVATIONS, apply_activation
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.shared import all_finite
from kiln.ir.types import DType
from kiln.kernels.checks import Checks
from kiln.kernels.outcome import Built, Skipped, SkipReason
from kiln.passes.partition import KernelGroup, singles

__all__ = ["LibraryKernel", "library_candidate", "library_candidates", "library_groups"]

mkldnn = torch.ops.mkldnn

@dataclass(frozen=True)
class LibraryKernel:
    """A library entry point standing for one node: ``fn(*operands)`` returns its output.
    Its weights are reordered into the library's layout on first use, by ``pack`` (a run, a
    check, or `packed_bytes`): a compile whose kept decision and check chose another kernel
    never reorders them (GPT-2's 50257-column head: 154 MB)."""

    name: str  # e.g. "onednn_conv_packed"
    fn: Callable[..., torch.Tensor]
    description: str  # the call, as text, for reports
    # the tensors its weights live in, the reordered one last, made once and then kept as
    # long as the kernel (the library's reordered tensor may be a view of the source's memory)
    pack: Callable[[], tuple[torch.Tensor, ...]] = field(repr=False, compare=False)

    @property
    def source(self) -> str:
        return self.description

    @property
    def packed_bytes(self) -> int:
        """The weights it holds in the library's layout."""
        return _nbytes(self.pack()[-1])


def library_groups(graph: Graph) -> list[KernelGroup]:
    """One group per fp32 convolution / addmm / mm whose weight is a constant."""
    if graph.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return []
    return singles(graph, lambda node: bool(_variants(graph, node)))


def library_candidates(graph: Graph, group: KernelGroup, checks: Checks | None = None
                       ) -> list[Built | Skipped]:
    """The prepared-weight library kernels for a one-node group, each checked against the
    node's ATen call (``checks`` remembers the answers), not yet measured (a Skipped saying
    why for one that fails)."""
    checks = Checks() if checks is None else checks
    node = group.last
    makers = _variants(graph, node)
    if not makers:
        return [Skipped(group, SkipReason.NO_RECIPE, "no library variant takes this node")]
    found: list[Built | Skipped] = []
    for make in makers:
        try:
            kernel, inputs = make(graph, node)
        except RuntimeError as err:  # the library refuses these shapes
            found.append(Skipped(group, SkipReason.NOT_LOWERABLE, str(err)))
            continue
        built = Built(group, kernel, tuple(inputs), (node.out(),), None)
        try:
            agreed = checks.agrees(graph, built)
        except RuntimeError as err:  # the library refuses these shapes (reordering or running)
            found.append(Skipped(group, SkipReason.NOT_LOWERABLE, str(err)))
            continue
        found.append(built if agreed else Skipped(group, SkipReason.DISAGREED))
    return found


def library_candidate(graph: Graph, group: KernelGroup) -> Built | Skipped:
    """The first of `library_candidates` (one node has one variant, but for pixel rows)."""
    return library_candidates(graph, group)[0]


Variant = Callable[[Graph, Node], tuple[LibraryKernel, list[Value]]]


def _variants(graph: Graph, node: Node) -> list[Variant]:
    """The library variants that take ``node``: the convolution's or the inner product's; and
    for a GEMM over the pixels of an NHWC image (`kiln.passes.pointwise`), the 1x1
    convolution it was, so the GEMM forms compete with it."""
    first = _variant(graph, node)
    if first is None:
        return []
    if first is _linear and _pixel_rows(node):
        return [first, _pixels_conv]
    return [first]


def _variant(graph: Graph, node: Node) -> Variant | None:
    if any(v.type.dtype is not DType.F32 for v in node.inputs if v.node.op is not Op.SCALAR):
        return None
    if node.op in (Op.CONVOLUTION, Op.CONV_ACT):
        w = node.inputs[1]
        if w.node.op is not Op.CONSTANT or len(w.type.shape) != 4:
            return None
        if not all_finite(graph.constant(w.node)):
            return None  # 0 * inf: oneDNN and ATen make NaN of different elements
        if node.op is Op.CONVOLUTION and (node.attrs.transposed  # type: ignore[attr-defined]
                                          or len(node.inputs[0].type.shape) != 4):
            return None
        act = node.attrs.activation if node.op is Op.CONV_ACT else None  # type: ignore
        return _conv if act is None or act in ACTIVATIONS else None
    if node.op in (Op.ADDMM, Op.ADDMM_ACT, Op.MM):
        w = node.inputs[-1]
        x = node.inputs[-2]
        if w.node.op is not Op.CONSTANT or len(x.type.shape) != 2:
            return None
        attrs = node.attrs
        if isinstance(attrs, (AddmmAttrs, AddmmActAttrs)):
            bias = node.inputs[0]
            if attrs.beta != 1 or attrs.alpha != 1:
                return None
            if bias.type.shape != (w.type.shape[1],):  # [M, N]: the residual of a 1x1 conv
                return _pixels_conv if bias.type.shape == node.type.shape \
                    and _pixel_rows(node) else None
        if isinstance(attrs, AddmmActAttrs) and attrs.activation not in ACTIVATIONS:
            return None
        return _linear
    return None


def _conv(graph: Graph, node: Node) -> tuple[LibraryKernel, list[Value]]:
    """oneDNN convolution on a weight reordered once; bias, residual, activation as post-ops."""
    a = node.attrs
    x, w = node.inputs[0], node.inputs[1]
    if isinstance(a, ConvActAttrs):
        bias = node.inputs[2] if a.has_bias else None
        residual = node.inputs[-1] if a.has_residual else None
        act, act_args = a.activation, a.act_args
    else:
        assert isinstance(a, ConvAttrs)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        residual, act, act_args = None, None, ()
    stride, padding = list(a.stride), list(a.padding)
    dilation = onednn_dilation(w.type.shape, a.dilation)
    weight = graph.constant(w.node)

    @functools.cache
    def pack() -> tuple[torch.Tensor, ...]:
        # the reordered weight may share the source's memory (no reorder needed): the kernel
        # holds both, so the source outlives every call
        source = weight.contiguous()
        return source, mkldnn._reorder_convolution_weight(source, padding, stride, dilation,
                                                          a.groups, list(x.type.shape))
    b = graph.constant(bias.node).contiguous() if bias is not None and \
        bias.node.op is Op.CONSTANT else None
    inputs = [x] + ([bias] if bias is not None and b is None else []) + \
        ([residual] if residual is not None else [])
    if residual is None:
        def conv(xt: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            bt = rest[0].contiguous() if b is None and rest else b  # oneDNN ignores its strides
            return mkldnn._convolution_pointwise(xt, pack()[-1], bt, padding, stride,
                                                 dilation, a.groups, "none", [], "")
    else:
        def conv(xt: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            bt = rest[0].contiguous() if b is None and bias is not None else b
            return mkldnn._convolution_pointwise.binary(
                xt, rest[-1], pack()[-1], bt, padding, stride, dilation, a.groups, "add", 1.0,
                None, [], None)
    run = _then(_like_aten(conv), act, act_args)
    text = (f"mkldnn._convolution_pointwise{'.binary' if residual is not None else ''}"
            f"(x, W reordered once, stride={stride}, padding={padding}, groups={a.groups}, "
            f"post-ops: {'bias, ' if bias is not None else ''}"
            f"{'residual add' if residual is not None else ''}){_act_text(act)}")
    return LibraryKernel("onednn_conv_packed", run, text, pack), inputs


def _like_aten(conv: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``conv`` returning NCHW for an NCHW input, as ATen's convolution does: where H or W is
    1 both layouts fit the input and oneDNN may answer NHWC, and a padded convolution after
    it would then run ATen's NHWC algorithm, which differs at non-finite values."""
    def run(xt: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        y = conv(xt, *rest)
        return y.contiguous() if xt.is_contiguous() else y
    return run


def onednn_dilation(weight_shape: tuple[int, ...], dilation: tuple[int, ...]) -> list[int]:
    """``dilation``, 1 where the kernel is 1 wide (the same convolution): oneDNN's
    convolution segfaults on a dilated 1-wide kernel over a padded 1-wide input with stride 2
    (x f32[2, 1, 1, 1], w f32[1, 1, 1, 1], padding (0, 1), stride (1, 2), dilation (1, 2))."""
    return [1 if k == 1 else d for k, d in zip(weight_shape[2:], dilation)]


def _linear(graph: Graph, node: Node) -> tuple[LibraryKernel, list[Value]]:
    """oneDNN inner product on a weight reordered once; bias and activation as post-ops."""
    x, w = node.inputs[-2], node.inputs[-1]
    bias = node.inputs[0] if node.op is not Op.MM else None
    source = graph.constant(w.node)
    m = x.type.shape[0]

    @functools.cache
    def pack() -> tuple[torch.Tensor, ...]:
        weight = source.t().contiguous()  # [N, K], as nn.Linear keeps it
        return weight, mkldnn._reorder_linear_weight(weight, m)  # (may share its memory)
    b = graph.constant(bias.node).contiguous() if bias is not None and \
        bias.node.op is Op.CONSTANT else None
    a = node.attrs
    act, act_args = (a.activation, a.act_args) if isinstance(a, AddmmActAttrs) else (None, ())
    inputs = [x] + ([bias] if bias is not None and b is None else [])

    def linear(xt: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        bt = rest[0].contiguous() if rest else b  # oneDNN ignores a bias's strides
        return mkldnn._linear_pointwise(xt, pack()[-1], bt, "none", [], "")
    run = _then(linear, act, act_args)
    text = (f"mkldnn._linear_pointwise(x, W reordered once for M={m}"
            f"{', post-op: bias' if bias is not None else ''}){_act_text(act)}")
    return LibraryKernel("onednn_linear_packed", run, text, pack), inputs


def _pixel_rows(node: Node) -> bool:
    """Is the GEMM's A the pixels of an NHWC image as rows (`kiln.passes.pointwise`):
    ``view(permute(x) {(0, 2, 3, 1)})``, strided ones through slices, or the result of such a
    GEMM (the views back to NCHW and forward again cancel: the pipeline's simplify.views)?"""
    a = node.inputs[-2].node
    if a.op in (Op.ADDMM, Op.ADDMM_ACT, Op.MM):
        return _pixel_rows(a)
    if a.op is not Op.VIEW:
        return False
    src = a.inputs[0].node
    while src.op is Op.SLICE:
        src = src.inputs[0].node
    return src.op is Op.PERMUTE and tuple(src.attrs.dims) == (0, 2, 3, 1)  # type: ignore


def _pixels_conv(graph: Graph, node: Node) -> tuple[LibraryKernel, list[Value]]:
    """oneDNN's 1x1 convolution on A's rows seen as the pixels of a [1, K, 1, M] NHWC image
    (free: A [M, K] row-major is that image), the weight reordered once; a row bias as a
    post-op, an [M, N] input (residual + bias) as a binary add; the output's [1, N, 1, M] NHWC
    image is the [M, N] result. Measured on Zen 4: the same speed and values as the
    convolution on the image's real height and width."""
    x, w = node.inputs[-2], node.inputs[-1]
    (m, k), n = x.type.shape, w.type.shape[1]
    bias = node.inputs[0] if node.op is not Op.MM else None
    matrix = bias is not None and len(bias.type.shape) == 2
    source = graph.constant(w.node)

    @functools.cache
    def pack() -> tuple[torch.Tensor, ...]:
        weight = source.t().contiguous().view(n, k, 1, 1)
        return weight, mkldnn._reorder_convolution_weight(
            weight.contiguous(memory_format=torch.channels_last), [0, 0], [1, 1], [1, 1], 1,
            [1, k, 1, m])
    b = graph.constant(bias.node).contiguous() if bias is not None and not matrix and \
        bias.node.op is Op.CONSTANT else None
    a = node.attrs
    act, act_args = (a.activation, a.act_args) if isinstance(a, AddmmActAttrs) else (None, ())
    inputs = [x] + ([bias] if bias is not None and b is None else [])

    def image(t: torch.Tensor, channels: int) -> torch.Tensor:
        return t.as_strided((1, channels, 1, m), (m * channels, 1, m * channels, channels))

    def conv(xt: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        xi = image(xt.contiguous(), k)
        if matrix:
            y = mkldnn._convolution_pointwise.binary(
                xi, image(rest[0].contiguous(), n), pack()[-1], None, [0, 0], [1, 1], [1, 1], 1,
                "add", 1.0, None, [], None)
        else:
            bt = rest[0].contiguous() if rest else b
            y = mkldnn._convolution_pointwise(xi, pack()[-1], bt, [0, 0], [1, 1], [1, 1], 1,
                                              "none", [], "")
        return y.permute(0, 2, 3, 1).reshape(m, n)  # (a view: oneDNN answers NHWC here)
    run = _then(conv, act, act_args)
    text = (f"mkldnn._convolution_pointwise{'.binary' if matrix else ''}(A's rows as a "
            f"[1, {k}, 1, {m}] NHWC image, W reordered once as a 1x1 convolution"
            f"{', post-op: bias' if bias is not None and not matrix else ''}"
            f"{', residual add' if matrix else ''}){_act_text(act)}")
    return LibraryKernel("onednn_pixels_conv_packed", run, text, pack), inputs


def _then(call: Callable[..., torch.Tensor], act: Op | None,
          act_args: tuple[Any, ...]) -> Callable[..., torch.Tensor]:
    """``call``, then the activation in place with ATen's kernel (exact, NaN kept)."""
    if act is None:
        return call

    def run(*operands: torch.Tensor) -> torch.Tensor:
        y = call(*operands)
        apply_activation(y, act, act_args)
        return y
    return run


def _act_text(act: Op | None) -> str:
    return f", then {act.text} in place (ATen)" if act is not None else ""


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()

