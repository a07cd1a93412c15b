"""What the executor knows of the strides values have at run time, and the views it need not
run.

A generated kernel takes raw pointers. A view or permute between two kernels (a pointwise
GEMM's [pixels, C] result seen as NCHW for the depthwise convolution after it) is the same
memory: where the IR fixes the strides of its source, the kernel can take the source's
pointer, and the Python call that makes the view (1-2 us each; HF MobileNetV2 has 68 of
them) and the kernel's layout check both go::

    v17 = v16.reshape((1, 112, 112, 96))
    v18 = v17.permute(0, 3, 1, 2)                          ->   v20 = buf[6].as_strided(...)
    if v18.is_contiguous(memory_format=CHANNELS_LAST):           KERNEL(v16.data_ptr(), ...)
        v20 = buf[6].as_strided(...)
        KERNEL(v18.data_ptr(), ...)
    else: ...  (the library calls)

Strides are known for a generated kernel's outputs (its buffers say them), a planned
library result (its slot: contiguous, or NHWC where the IR expects NHWC), a contiguous
value's reshape (contiguous), and a permute of a known value (its strides permuted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.kernels.outcome import Built
from kiln.tir.nodes import Buffer as TirBuffer
from kiln.tir.nodes import channels_last_strides, contiguous_strides

__all__ = ["known_strides", "laid_out_as", "views_read_in_place"]

Strides = tuple[int, ...]


def known_strides(graph: Graph, kernels: Iterable[Built], planned: Iterable[Value],
                  nhwc: set[Value]) -> dict[Value, Strides]:
    """The run-time strides of every value whose strides the IR fixes (module docstring);
    ``planned``: the values written into the memory plan's slots by library calls."""
    known: dict[Value, Strides] = {}
    members: set[Node] = set()
    for gk in kernels:
        members.update(gk.group.nodes)
        if gk.generated:
            func = gk.kernel.func  # type: ignore[union-attr]
            for value, buffer in zip(gk.outputs, func.outputs):
                shape = tuple(value.type.shape)
                if tuple(buffer.shape) == shape:
                    known[value] = buffer.elem_strides
                elif _dense(buffer):  # (a row kernel's [rows, n] of any value: row-major)
                    known[value] = contiguous_strides(shape)
    for value in planned:
        if value.node not in members:
            shape = tuple(value.type.shape)
            known[value] = channels_last_strides(shape) if value in nhwc else \
                contiguous_strides(shape)
    for node in graph.nodes:  # (in order: a view's source comes first)
        if node in members or node.op not in (Op.VIEW, Op.PERMUTE):
            continue
        source = node.inputs[0]
        strides = known.get(source)
        if strides is None:
            continue
        shape = tuple(node.out().type.shape)
        if node.op is Op.VIEW and strides == contiguous_strides(tuple(source.type.shape)):
            known[node.out()] = contiguous_strides(shape)
        elif node.op is Op.PERMUTE and len(strides) == len(shape):
            known[node.out()] = tuple(strides[d] for d in node.attrs.dims)  # type: ignore
    return known


def views_read_in_place(graph: Graph, kernels: Iterable[Built], known: Mapping[Value, Strides],
                        keep: set[Value]) -> dict[Value, Value]:
    """The views and permutes the executor need not run, each mapped to the value whose
    pointer stands for it: those whose every reader is a generated kernel that then needs no
    layout check at all (each of its inputs' known strides are its buffer's) and never runs
    its library ops instead (`Built.library_where_not_finite`: those read the view), or
    another such view. ``keep``: values the caller sees (outputs and what they alias)."""
    kernel_of = {n: gk for gk in kernels if gk.generated for n in gk.group.nodes}
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for value in node.inputs:
            readers.setdefault(value, []).append(node)
    alias: dict[Value, Value] = {}
    for node in graph.nodes:
        if node.op in (Op.VIEW, Op.PERMUTE) and node not in kernel_of:
            value, source = node.out(), node.inputs[0]
            if value not in keep and value in known and source in known:
                alias[value] = alias.get(source, source)

    def unchecked(gk: Built) -> bool:
        if gk.may_run_library:
            return False
        params = gk.kernel.func.inputs  # type: ignore[union-attr]
        return all(v.node.op is Op.CONSTANT or laid_out_as(v, b, known)
                   for v, b in zip(gk.inputs, params))

    changed = True
    while changed:  # (dropping one view can strand a view of it)
        changed = False
        for value in list(alias):
            ok = all((r.op in (Op.VIEW, Op.PERMUTE) and r.out() in alias)
                     or (r in kernel_of and unchecked(kernel_of[r]))
                     for r in readers.get(value, ()))
            if not ok or not readers.get(value):
                del alias[value]
                changed = True
    return alias


def laid_out_as(value: Value, buffer: TirBuffer, known: Mapping[Value, Strides]) -> bool:
    """Whether ``value`` is known to be laid out at run time as a kernel's ``buffer`` reads it:
    the same shape and strides, or both row-major (a row kernel's [rows, n] of a 4-d value)."""
    strides = known.get(value)
    if strides is None:
        return False
    shape = tuple(value.type.shape)
    if tuple(buffer.shape) == shape:
        return strides == buffer.elem_strides
    return _dense(buffer) and strides == contiguous_strides(shape) \
        and buffer.numel == value.type.numel


def _dense(buffer: TirBuffer) -> bool:
    return buffer.elem_strides == contiguous_strides(buffer.shape)
