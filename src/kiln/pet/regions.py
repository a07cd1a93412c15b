"""Where a mutant equals the original: for each output, the boxes of positions where it does
not, found by random tests (PET, Wang et al., OSDI'21, section 5).

    found = differing_regions(sub.graph, mutant, sub.constant_inputs)
    found.boxes[0]        # ((1, 4), (0, 64), (0, 1), (0, 56)), ...: half-open intervals per axis
    found.fraction        # differing positions / all positions

**Why a few random tests decide each position.** A subprogram holds only multi-linear ops
(`kiln.pet.split`): with its inputs and weights as variables, every output position of the
original and of a mutant (which only adds reshapes, transposes, slices, concatenations, zero
padding and copies of the same ops) is a polynomial in those variables of total degree at most
``d`` (the number of contractions and products on the longest path, plus one). Their difference
at a position is either the zero polynomial (the position is *equal for every input*) or not.
By the Schwartz-Zippel lemma, a non-zero polynomial of degree ``d`` vanishes at a point drawn
uniformly from ``S^n`` with probability at most ``d / |S|``. The tests draw every input and
every weight as an integer in ``[-R, R]`` and compute in float64, where R is chosen so that no
sum or product exceeds 2**53: the arithmetic is exact, so a position is reported equal only if
both programs agree exactly. ``t`` independent tests miss a differing position with probability
at most ``(d / (2R + 1)) ** t``: with R = 65536, d = 2 and t = 2 that is below 1e-9 per
position. Rounding can only make an equal position look different (the safe direction: it is
then recomputed).

**What random tests do not settle.**
* The statement is about real arithmetic. Floating-point results of the two programs may
  round differently (a different summation order); NaN, infinities and signed zeros are
  checked separately, on float inputs, by `kiln.pet.select` (the ``ieee`` check).
* A fused activation (``conv_act{relu}``) is not multi-linear. The tests run both programs
  with every fused activation removed: positions equal before a position-wise function are
  equal after it, so equal positions stay equal. A position where the linear parts differ is
  reported as differing even if the activation would hide the difference for some inputs (it
  is then recomputed, which costs time, never correctness).

**Boxes.** PET tests a few representative positions per region, the regions following from
the mutant's structure. kiln tests every position (the programs are small, the cost is a few
evaluations) and then finds the boxes: along each axis it cuts wherever the answer changes
along some line parallel to that axis; every cell of the resulting grid is then uniform
(moving by one along any axis never crosses a cut), and adjacent differing cells that line up
are merged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import torch

from kiln.ir.attrs import ConvActAttrs, ConvAttrs
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.interp import interpret
from kiln.ir.ops import Op

__all__ = ["Box", "Regions", "differing_regions", "interval_boxes"]

Box = tuple[tuple[int, int], ...]  # a half-open interval per axis
TESTS = 2
MAX_CELLS = 4096  # a mask cut into more cells than this is too irregular to correct
MAX_RANGE = 1 << 16


@dataclass(frozen=True)
class Regions:
    boxes: tuple[tuple[Box, ...], ...]  # per output: the boxes where the mutant differs
    differing: int  # positions, over all outputs
    total: int
    tests: int
    value_range: int  # R: inputs were integers in [-R, R]
    degree: int

    @property
    def fraction(self) -> float:
        return self.differing / max(1, self.total)

    @property
    def equivalent(self) -> bool:
        return self.differing == 0

    def miss_bound(self) -> float:
        """Probability bound that some differing position was reported equal."""
        per_position = (self.degree / (2 * self.value_range + 1)) ** self.tests
        return min(1.0, per_position * self.total)


def differing_regions(original: Graph, mutant: Graph, generator: torch.Generator | None = None,
                      tests: int = TESTS) -> Regions | None:
    """The boxes where ``mutant`` differs from ``original`` (same inputs, same output types);
    None when the differing positions do not form at most `MAX_CELLS` grid cells."""
    gen = generator or torch.Generator().manual_seed(0)
    degree = _degree(original)
    value_range = _value_range(original, degree)
    linear_original, linear_mutant = without_activations(original), without_activations(mutant)
    masks = [torch.zeros(v.type.shape, dtype=torch.bool) for v in original.outputs]
    with torch.no_grad():
        for _ in range(tests):
            inputs = [torch.randint(-value_range, value_range + 1, n.type.shape, generator=gen,
                                    dtype=torch.float64) for n in original.inputs]
            want = interpret(linear_original, inputs)
            got = interpret(linear_mutant, inputs)
            for mask, w, g in zip(masks, want, got):
                mask |= torch.as_tensor(w != g)
    boxes = []
    for mask in masks:
        found = mask_boxes(mask)
        if found is None:
            return None
        boxes.append(tuple(found))
    return Regions(tuple(boxes), int(sum(int(m.sum()) for m in masks)),
                   sum(m.numel() for m in masks), tests, value_range, degree)


def without_activations(graph: Graph) -> Graph:
    """``graph`` with every fused activation removed (the multi-linear part)."""
    mapping: dict[Value, Value] = {}
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        inputs = tuple(mapping.get(v, v) for v in node.inputs)
        attrs = node.attrs
        if isinstance(attrs, ConvActAttrs) and attrs.activation is not None:
            attrs = dataclasses.replace(attrs, activation=None, act_args=())
        elif node.op is Op.ADDMM_ACT:
            attrs = dataclasses.replace(attrs, activation=None, act_args=())  # type: ignore
        new = node
        if attrs is not node.attrs or inputs != node.inputs:
            new = Node(node.op, inputs, attrs, node.types, node.name)
            changed = True
        nodes.append(new)
        for old, value in zip(node.outputs, new.outputs):
            if old != value:
                mapping[old] = value
    if not changed:
        return graph
    return Graph(graph.inputs, nodes, [mapping.get(v, v) for v in graph.outputs],
                 graph.constants, graph.device)


def _degree(graph: Graph) -> int:
    """Total degree bound of the outputs as polynomials of the inputs."""
    depth: dict[Node, int] = {n: 1 for n in graph.inputs}
    for node in graph.nodes:
        below = [depth.get(v.node, 0) for v in node.inputs]
        if node.op in (Op.MUL, Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT, Op.CONVOLUTION,
                       Op.CONV_ACT):
            depth[node] = sum(sorted(below)[-2:]) if len(below) > 1 else max(below, default=0)
        else:
            depth[node] = max(below, default=0)
    return max(2, max((depth.get(v.node, 1) for v in graph.outputs), default=1))


def _value_range(graph: Graph, degree: int) -> int:
    """R such that sums of products of ``degree`` values in [-R, R] stay below 2**50."""
    terms = 1
    for node in graph.nodes:
        if node.op in (Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT):
            terms = max(terms, node.inputs[-2].type.shape[-1])
        elif node.op in (Op.CONVOLUTION, Op.CONV_ACT):
            attrs = node.attrs
            assert isinstance(attrs, (ConvAttrs, ConvActAttrs))
            terms = max(terms, math.prod(node.inputs[1].type.shape[1:]))
    adds = len(graph.nodes) + 1
    return max(16, min(MAX_RANGE, int((2.0 ** 50 / (terms * adds)) ** (1.0 / degree))))


def mask_boxes(mask: torch.Tensor) -> list[Box] | None:
    """Boxes covering exactly the True positions of ``mask`` (merged where they line up)."""
    if not bool(mask.any()):
        return []
    shape = tuple(mask.shape)
    if mask.dim() == 0:
        return [()]
    cuts = []
    for axis, size in enumerate(shape):
        changes = (mask.narrow(axis, 1, size - 1) != mask.narrow(axis, 0, size - 1))
        other = tuple(a for a in range(mask.dim()) if a != axis)
        along = changes.any(dim=other) if other else changes
        points = [0, *(int(i) + 1 for i in torch.nonzero(along).flatten()), size]
        cuts.append(points)
    if math.prod(len(c) - 1 for c in cuts) > MAX_CELLS:
        return None
    cells = []
    for index in product(*(range(len(c) - 1) for c in cuts)):
        box = tuple((cuts[a][i], cuts[a][i + 1]) for a, i in enumerate(index))
        if bool(mask[tuple(lo for lo, _ in box)]):
            cells.append(box)
    return _merge(cells)


def _merge(boxes: Sequence[Box]) -> list[Box]:
    """Merge boxes that touch along one axis and agree on every other, until none do."""
    merged = list(boxes)
    changed = True
    while changed:
        changed = False
        for i, a in enumerate(merged):
            for j in range(i + 1, len(merged)):
                joined = _join(a, merged[j])
                if joined is not None:
                    merged[i] = joined
                    del merged[j]
                    changed = True
                    break
            if changed:
                break
    return sorted(merged)


def _join(a: Box, b: Box) -> Box | None:
    differ = [k for k in range(len(a)) if a[k] != b[k]]
    if len(differ) != 1:
        return None
    k = differ[0]
    if a[k][1] == b[k][0]:
        return (*a[:k], (a[k][0], b[k][1]), *a[k + 1:])
    if b[k][1] == a[k][0]:
        return (*a[:k], (b[k][0], a[k][1]), *a[k + 1:])
    return None


def interval_boxes(shape: Sequence[int], axis: int, points: Sequence[int]) -> list[Box]:
    """The boxes that cut ``shape`` along ``axis`` at ``points`` (full on every other axis)."""
    edges = [0, *points, shape[axis]]
    return [tuple((lo, hi) if a == axis else (0, s) for a, s in enumerate(shape))
            for lo, hi in zip(edges, edges[1:])]
