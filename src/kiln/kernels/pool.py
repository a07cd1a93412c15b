"""Generated pooling: a ``max_pool2d`` (its indices unused), ``avg_pool2d``, or ``mean`` over H
and W (keepdim: a global average pool) whose input is channels-last at run time becomes the
kernel of `kiln.kernels.pool_schedule`: one more candidate of `kiln.kernels.contractions`,
used only where it measures fastest against the node's ATen call on its shapes.

    %y, %idx = max_pool2d(%x_nhwc) {kernel=(3, 3), stride=(2, 2), padding=(1, 1)}
      -> kiln_maxpool_64x112x112_k3x3_s2 (x NHWC, out NHWC; %idx has no reader)

Why: ATen's channels-last pooling runs far below the memory's speed on the CNNs' shapes
(ResNet-50's 3x3/2 max pool over 64x112x112: 193 us, where one pass over its 3.2 MB input
at the rate other kernels reach takes about 50; Inception v3 spends 1.7 ms in pools), and
the window loop is the depthwise kernel's without the weights.

What it takes, and why the rest stays a library call:

* fp32 and a 4-d input, NHWC at run time (`kiln.passes.layout.channels_last_values`): in
  NCHW memory a vector of channels is a gather.
* Max pooling only where nothing reads the indices (the kernel does not produce them).
* No ceil mode, unless it gives the same output size (then the windows are the same).
* ``mean`` only over dims (2, 3) with keepdim: its output [N, C, 1, 1] is the pool's.
"""

from __future__ import annotations

import torch

from kiln.codegen.isa import target_isa
from kiln.ir.attrs import AvgPoolAttrs, MaxPoolAttrs, ReduceAttrs
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.kernels.build import checked_candidate
from kiln.kernels.checks import Checks
from kiln.kernels.outcome import Built, Skipped, SkipReason
from kiln.kernels.plan import KernelPlan
from kiln.kernels.pool_schedule import PoolShape
from kiln.options import Options
from kiln.passes.layout import channels_last_values
from kiln.passes.partition import KernelGroup, singles
from kiln.tune.apply import tuned_or_default
from kiln.tune.space_window import WindowSpace

__all__ = ["plan_pool", "pool_candidate", "pool_groups", "pool_shape", "pool_space", "refusal"]

PoolPlanned = tuple[KernelPlan, tuple[Value, ...], dict]
POOLS = (Op.MAX_POOL2D, Op.AVG_POOL2D, Op.MEAN)


def pool_groups(graph: Graph) -> list[KernelGroup]:
    """One group per pool the generated kernel takes (`refusal` is None)."""
    if graph.device.type != "cpu":
        return []
    nhwc = channels_last_values(graph)
    read = {v for n in graph.nodes for v in n.inputs} | set(graph.outputs)
    return singles(graph, lambda node: node.op in POOLS
                   and refusal(node, nhwc, read) is None)


def refusal(node: Node, nhwc: set[Value], read: set[Value]) -> str | None:
    """Why the generated kernel does not take this pool; None where it does. ``read``: the
    values something reads (or the graph returns)."""
    x = node.inputs[0]
    if x.type.dtype is not DType.F32 or len(x.type.shape) != 4:
        return "not a 4-d fp32 input"
    if any(d == 0 for d in (*x.type.shape, *node.types[0].shape)):
        return "an empty tensor"
    if node.op is Op.MEAN:
        a = node.attrs
        assert isinstance(a, ReduceAttrs)
        if a.dims is None or {d % 4 for d in a.dims} != {2, 3} or not a.keepdim:
            return "a mean that is not over H and W with keepdim"
    elif node.op is Op.MAX_POOL2D and len(node.outputs) > 1 and node.out(1) in read:
        return "its indices are read"
    shape = pool_shape(node)
    if shape is None or tuple(node.types[0].shape[2:]) != shape.out:
        return "ceil mode changes the output size"
    if x not in nhwc:
        return "an input that is not channels-last at run time"
    return None


def pool_shape(node: Node) -> PoolShape | None:
    """The node's pool; None for an op that is not one."""
    n, c, h, w = node.inputs[0].type.shape
    a = node.attrs
    if node.op is Op.MEAN:
        return PoolShape(n, c, h, w, (h, w), (1, 1), (0, 0), kind="avg")
    if isinstance(a, MaxPoolAttrs):
        return PoolShape(n, c, h, w, tuple(a.kernel), tuple(a.stride),  # type: ignore[arg-type]
                         tuple(a.padding), tuple(a.dilation))  # type: ignore[arg-type]
    if isinstance(a, AvgPoolAttrs):
        return PoolShape(n, c, h, w, tuple(a.kernel), tuple(a.stride),  # type: ignore[arg-type]
                         tuple(a.padding), kind="avg",  # type: ignore[arg-type]
                         count_include_pad=a.count_include_pad,
                         divisor_override=a.divisor_override)
    return None


def plan_pool(graph: Graph, group: KernelGroup, options: Options) -> PoolPlanned | Skipped:
    """The plan of the generated kernel for a one-node pool group, and its input."""
    node = group.last
    read = {v for n in graph.nodes for v in n.inputs} | set(graph.outputs)
    why = refusal(node, channels_last_values(graph), read)
    if why is not None:
        return Skipped(group, SkipReason.NOT_LOWERABLE, why)
    plan, _ = tuned_or_default(pool_space(node, options), options)
    return plan, (node.inputs[0],), {}


def pool_space(node: Node, options: Options) -> WindowSpace:
    """The design space of the generated kernel for a pool it takes; its default point is
    `DepthwiseConfig.default` (the same tile), `kiln tune` searches the rest."""
    shape = pool_shape(node)
    assert shape is not None
    (kh, kw), (sh, sw) = shape.kernel, shape.stride
    return WindowSpace("pool", shape, target_isa(options), torch.get_num_threads(), None,
                       f"kiln_{shape.kind}pool_{shape.c}x{shape.h}x{shape.w}_k{kh}x{kw}_s{sh}x{sw}")


def pool_candidate(graph: Graph, group: KernelGroup, options: Options,
                   checks: Checks | None = None,
                   planned: PoolPlanned | Skipped | None = None) -> Built | Skipped:
    """The generated pool for a one-node group, compiled and checked against the node's ATen
    call on channels-last operands once per source, not yet measured."""
    planned = planned if planned is not None else plan_pool(graph, group, options)
    return checked_candidate(graph, group, options, planned, checks)
