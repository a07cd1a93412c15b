"""Mutants: other programs over a subprogram's inputs, built from its own ops plus layout ops
(reshape, transpose, concatenation, slicing, zero padding), with the same output types
(PET, Wang et al., OSDI'21, section 4).

    for mutant in mutants(sub):
        mutant.name     # "merge_batch(h)", "split(h, 2, naive)", "pad(0, 16)", ...
        mutant.graph    # standalone, over sub.graph's inputs

PET enumerates operator sequences blindly and keeps those whose output shapes fit. kiln
enumerates *layout sandwiches*: layout ops on the inputs, the subprogram's own ops on the
result (each node applied as it is, its output type inferred anew), and layout ops that bring
the output back to the original's type. Every kind below is enumerated over the output's axes
and a few parameters, bounded by `MAX_MUTANTS`; a combination whose shapes do not work out
(type inference refuses it, or the output type differs) is dropped. Whether a mutant computes
the original's values is not assumed anywhere: `kiln.pet.regions` tests it.

* ``merge_batch(h|w)`` - the batch joined into a spatial axis: N images of H rows become one
  image of N*H rows, one convolution instead of N. Wrong on the rows whose receptive field
  crosses into the neighbouring image (PET's first example).
* ``split(axis, 2, naive)`` - every input cut in two along the axis, the subprogram run on each
  half, the halves concatenated. Along a convolution's spatial axis the rows next to the cut see
  zero padding instead of their neighbours: wrong on a band (PET's second example).
* ``split(axis, 2, exact)`` - each half computed from the inputs it needs (its receptive field,
  or the weight rows for output channels); equal everywhere.
* ``pad(axis, m)`` - the output axis extended to a multiple of ``m`` (zero rows or columns of
  the operands that carry it), the original extent sliced back (a GEMM padded to a better
  shape, PET's third example).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kiln.ir.attrs import NO_ATTRS, DimAttrs, PermuteAttrs, ShapeAttrs, SliceAttrs
from kiln.ir.graph import Graph, Value
from kiln.ir.ops import Op
from kiln.pet.correct import Emitter, NoRegion, restrict
from kiln.pet.regions import interval_boxes
from kiln.pet.split import Subprogram

__all__ = ["MAX_MUTANTS", "Mutant", "mutants"]

MAX_MUTANTS = 16
PAD_MULTIPLES = (8, 16, 64)
MAX_PAD_GROWTH = 0.25  # pad an axis by at most this fraction of its size
BATCH_OPS = frozenset({Op.CONVOLUTION, Op.CONV_ACT, Op.ADD, Op.SUB, Op.MUL, Op.NEG})


@dataclass(frozen=True)
class Mutant:
    name: str
    graph: Graph


def mutants(sub: Subprogram, limit: int = MAX_MUTANTS) -> list[Mutant]:
    """The mutants of a single-output subprogram, at most ``limit`` (none for several
    outputs)."""
    graph = sub.graph
    if len(graph.outputs) != 1:
        return []
    found: list[Mutant] = []
    for name, build in _candidates(sub):
        emitter = Emitter("pet.")
        try:
            out = build(emitter)
        except NoRegion:
            continue
        if out is None or out.type != graph.outputs[0].type:
            continue
        found.append(Mutant(name, Graph(graph.inputs, emitter.nodes, [out],
                                        device=graph.device)))
        if len(found) >= limit:
            break
    return found


def _candidates(sub: Subprogram) -> Iterator[tuple[str, object]]:
    shape = sub.graph.outputs[0].type.shape
    ops = {n.op for n in sub.graph.nodes if n.op is not Op.SCALAR}
    if len(shape) == 4 and shape[0] > 1 and ops <= BATCH_OPS:
        for axis, label in ((2, "h"), (3, "w")):
            yield f"merge_batch({label})", lambda e, a=axis: _merge_batch(sub, a, e)
    for axis, size in enumerate(shape):
        if size < 2:
            continue
        if len(shape) == 4 and axis != 1:
            yield f"split({axis}, 2, naive)", lambda e, a=axis: _split_naive(sub, a, e)
        yield f"split({axis}, 2, exact)", lambda e, a=axis: _split_exact(sub, a, e)
    pad_axes = range(len(shape)) if len(shape) <= 3 else (1,)
    for axis in pad_axes:
        for multiple in PAD_MULTIPLES:
            padded = -(-shape[axis] // multiple) * multiple
            if shape[axis] < padded <= shape[axis] * (1 + MAX_PAD_GROWTH):
                yield (f"pad({axis}, {multiple})",
                       lambda e, a=axis, p=padded: _pad(sub, a, p, e))
                break


def replay(graph: Graph, inputs: dict[Value, Value], emitter: Emitter) -> Value:
    """Emit ``graph``'s body on other operands (types inferred anew); its single output."""
    env = dict(inputs)
    for node in graph.nodes:
        if node.op is Op.SCALAR:
            env[node.out()] = emitter.keep(node.out())
            continue
        env[node.out()] = emitter.emit(node.op, [env.get(v, v) for v in node.inputs], node.attrs,
                                       node.name)
    return env[graph.outputs[0]]


def _activations(sub: Subprogram) -> list[Value]:
    return [n.out() for i, n in enumerate(sub.graph.inputs) if i not in sub.constant_inputs]


def _merge_batch(sub: Subprogram, axis: int, e: Emitter) -> Value | None:
    """(N, C, H, W) -> (C, N, H, W) -> (1, C, N*H, W), and back; W likewise."""
    n = sub.graph.outputs[0].type.shape[0]
    to_front = (1, 0, 2, 3) if axis == 2 else (1, 2, 0, 3)
    inputs: dict[Value, Value] = {}
    for v in _activations(sub):
        shape = v.type.shape
        if len(shape) == 4 and shape[0] == n:
            moved = e.emit(Op.PERMUTE, (v,), PermuteAttrs(to_front))
            moved = e.emit(Op.CLONE, (moved,), NO_ATTRS)
            c, h, w = shape[1], shape[2], shape[3]
            tall = (1, c, n * h, w) if axis == 2 else (1, c, h, n * w)
            inputs[v] = e.emit(Op.VIEW, (moved,), ShapeAttrs(tall))
        elif len(shape) == 4 and shape[0] != 1:
            return None
    out = replay(sub.graph, inputs, e)
    k, h_out, w_out = sub.graph.outputs[0].type.shape[1:]
    if out.type.shape != ((1, k, n * h_out, w_out) if axis == 2 else (1, k, h_out, n * w_out)):
        return None
    split = (k, n, h_out, w_out) if axis == 2 else (k, h_out, n, w_out)
    back = (1, 0, 2, 3) if axis == 2 else (2, 0, 1, 3)
    out = e.emit(Op.VIEW, (out,), ShapeAttrs(split))
    out = e.emit(Op.PERMUTE, (out,), PermuteAttrs(back))
    return e.emit(Op.CLONE, (out,), NO_ATTRS)


def _split_naive(sub: Subprogram, axis: int, e: Emitter) -> Value | None:
    """Every input cut at the same relative position along ``axis``; the halves joined."""
    size = sub.graph.outputs[0].type.shape[axis]
    cut = size // 2
    halves = []
    for lo, hi in ((0, cut), (cut, size)):
        inputs: dict[Value, Value] = {}
        for v in _activations(sub):
            shape = v.type.shape
            if len(shape) != 4 or shape[axis] == 1:
                continue
            if (shape[axis] * lo) % size or (shape[axis] * hi) % size:
                return None
            start, stop = shape[axis] * lo // size, shape[axis] * hi // size
            inputs[v] = e.emit(Op.SLICE, (v,), SliceAttrs(axis, start, stop))
        halves.append(replay(sub.graph, inputs, e))
    return e.emit(Op.CAT, tuple(halves), DimAttrs(axis))


def _split_exact(sub: Subprogram, axis: int, e: Emitter) -> Value:
    shape = sub.graph.outputs[0].type.shape
    boxes = interval_boxes(shape, axis, [shape[axis] // 2])
    parts = tuple(restrict(sub.graph, 0, box, e) for box in boxes)
    return e.emit(Op.CAT, parts, DimAttrs(axis))


def _pad(sub: Subprogram, axis: int, padded: int, e: Emitter) -> Value:
    shape = sub.graph.outputs[0].type.shape
    box = tuple((0, padded) if a == axis else (0, s) for a, s in enumerate(shape))
    wide = restrict(sub.graph, 0, box, e)
    return e.emit(Op.SLICE, (wide,), SliceAttrs(axis, 0, shape[axis]))

