"""Fingerprints: a graph's outputs on random integer inputs, and the pairs of graphs that
agree on them (candidate rules), pruned as TASO prunes them.

    inputs:  x1 = [[3, -7], [0, 5], [-2, 8]] ...    small integers, 16 draws, float64
    graph:   (mm (mm x1 w1) w2)          fingerprint 5c1e...  (blake2b of shape and values)
    graph:   (mm x1 (mm w1 w2))          fingerprint 5c1e...  -> candidate rule

Integers keep the arithmetic exact (float64 holds every product and sum these graphs make),
so equal results mean equal values, not values within a tolerance; -0.0 is read as 0.0.
An average pool is fingerprinted as a sum pool (its division by 9 would round).

`Pairing` groups the graphs by fingerprint and pairs each graph with the first (smallest)
one of its group (src: the larger graph, dst: the smaller one), then prunes:

* **congruent**: each output pair is the same term, or the same op applied to operands that
  are equal on the random inputs: f(a) = f(b) follows from the smaller rule a = b;
* **common subgraph**: both sides contain one subterm, and the sides still agree when it is
  replaced by fresh random values: the rule with that subterm as a variable is smaller
  (TASO prunes every common subgraph; relu(relu(x)) = relu(x) shows why not to);
* **variables**: dst reads a variable src does not (not a rewrite);
* **multi-output**: each output pair is a rule by itself (a multi-output pair is kept in the
  direction where it is not, e.g. two products of one input -> one product and a split);
* **renaming**: the rule equals one kept before, up to renaming inputs of one class
  (the same shape and role): each rule is kept in its canonical variable order.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from kiln.ir.ops import Op
from kiln.synth.enumerate import AttrPairs, Candidate, OpSpec, Role, Shape, Tensor, Var

# 2-by-2 tensors are small: relu(w)^T + w = relu(w^T) + w holds on one draw in four, so
# many draws, all evaluated at once on a leading axis
DRAWS = 16
INT_RANGE = 8  # tensor elements are integers in [-8, 8]
# a number input's values, one per draw: never 0 or ±1, and too large for a few additions to
# make (x*2 = x+x would pass on 2)
NUMBERS = (7.0, -5.0, 11.0, -13.0, 17.0, -19.0, 23.0, -29.0)


# --- values --------------------------------------------------------------------------------

def draw_inputs(pool: Sequence[Var], seed: int, draws: int = DRAWS) -> dict[str, np.ndarray]:
    """Random integer values for every pool input, all draws stacked on a leading axis
    (seeded): shape (draws, *shape), and (draws,) for a number."""
    rng = np.random.default_rng(seed)
    values: dict[str, np.ndarray] = {}
    for var in pool:
        if var.role is Role.NUMBER:
            values[var.name] = rng.choice(np.array(NUMBERS), size=draws)
        else:
            values[var.name] = rng.integers(-INT_RANGE, INT_RANGE + 1,
                                            (draws,) + var.shape).astype(np.float64)
    return values


def evaluate(spec: OpSpec, attrs: AttrPairs, operands: Sequence[np.ndarray]
             ) -> tuple[np.ndarray, ...]:
    """The op's results on every draw at once (a leading draw axis), in numpy: what kiln's
    ATen lowering computes (a test compares the two), without ATen's per-call cost."""
    return _EVAL[spec.op](dict(attrs), *operands)


def _conv(attrs: dict[str, Any], x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Stride 1, dilation 1, groups 1: x (D, N, C, H, W), w (D, O, C, kh, kw)."""
    ph, pw = attrs["padding"]
    padded = np.pad(x, ((0, 0), (0, 0), (0, 0), (ph, ph), (pw, pw)))
    windows = sliding_window_view(padded, w.shape[-2:], axis=(3, 4))
    return np.einsum("dnchwij,docij->dnohw", windows, w)


def _pool(attrs: dict[str, Any], x: np.ndarray, reduce: str) -> np.ndarray:
    (ph, pw), (kh, kw) = attrs["padding"], attrs["kernel"]
    fill = -np.inf if reduce == "max" else 0.0
    padded = np.pad(x, ((0, 0), (0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    windows = sliding_window_view(padded, (kh, kw), axis=(3, 4))
    # an average pool is fingerprinted as a sum pool: dividing by 9 would round
    return windows.max(axis=(-2, -1)) if reduce == "max" else windows.sum(axis=(-2, -1))


def _number(s: np.ndarray, rank: int) -> np.ndarray:
    return s.reshape(s.shape + (1,) * rank)


_EVAL: dict[Op, Callable[..., tuple[np.ndarray, ...]]] = {
    Op.ADD: lambda at, a, b: (a + b,),
    Op.MUL: lambda at, a, b: (a * _number(b, a.ndim - 1) if b.ndim == 1 else a * b,),
    Op.MM: lambda at, a, b: (np.matmul(a, b),),
    Op.PERMUTE: lambda at, a: (np.transpose(a, (0,) + tuple(d + 1 for d in at["dims"])),),
    Op.RELU: lambda at, a: (np.maximum(a, 0.0),),
    Op.CAT: lambda at, a, b: (np.concatenate([a, b], axis=at["dim"] + 1),),
    Op.SPLIT: lambda at, a: tuple(np.split(a, np.cumsum(at["sizes"])[:-1], axis=at["dim"] + 1)),
    Op.CONVOLUTION: lambda at, x, w: (_conv(at, x, w),),
    Op.CONV_ACT: lambda at, x, w: (np.maximum(_conv(at, x, w), 0.0),),
    Op.AVG_POOL2D: lambda at, x: (_pool(at, x, "sum"),),
    Op.MAX_POOL2D: lambda at, x: (_pool(at, x, "max"),),
}


def fingerprint(shape: Shape, values: np.ndarray) -> bytes:
    """A 16-byte digest of the shape and the values of every draw."""
    h = hashlib.blake2b(repr(shape).encode(), digest_size=16)
    h.update(np.ascontiguousarray(values + 0.0).tobytes())  # + 0.0: -0.0 reads as 0.0
    return h.digest()


def graph_fingerprint(candidate: Candidate) -> str:
    h = hashlib.blake2b(digest_size=8)
    for fp in candidate.fingerprint:
        h.update(fp)
    return h.hexdigest()


# --- pairs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """A candidate rule: src outputs and dst outputs, matched by position."""

    src: tuple[Tensor, ...]
    dst: tuple[Tensor, ...]
    src_ops: int
    dst_ops: int
    fingerprint: str  # of the outputs' values
    canonical: str = ""  # the rule's text in canonical variable order
    renaming: tuple[tuple[str, str], ...] = ()  # variable -> canonical name

    def variables(self, side: Sequence[Tensor]) -> set[str]:
        return {v for t in side for v in _variables(t)}


class Pairing:
    """Graphs in, candidate rules out: the first graph of each fingerprint is its group's
    representative (graphs arrive smallest first), every later one pairs with it."""

    def __init__(self, pool: Sequence[Var], seed: int) -> None:
        self.first: dict[tuple[bytes, ...], Candidate] = {}
        self.pairs: list[Pair] = []
        self.kept: set[str] = set()
        self.laws: set[str] = set()
        self.pruned: Counter[str] = Counter()
        self.classes = _classes(pool)
        self.fresh = np.random.default_rng(seed + 1)

    def add(self, candidate: Candidate) -> None:
        key = candidate.fingerprint
        first = self.first.get(key)
        if first is None:
            self.first[key] = candidate
            return
        pair = _oriented(_match(candidate, first))
        why = self.prune(pair)
        if why:
            self.pruned[why] += 1
            return
        canonical, renaming = canonical_form(pair, self.classes)
        if canonical in self.kept:
            self.pruned["renaming of a kept rule"] += 1
            return
        self.kept.add(canonical)
        law = law_text(canonical)
        if law in self.laws:
            self.pruned["the same law on other shapes"] += 1
            return
        self.laws.add(law)
        self.pairs.append(replace(pair, canonical=canonical, renaming=renaming))

    def prune(self, pair: Pair) -> str:
        """Why the pair is not a rule of its own ("" when it is)."""
        if not pair.variables(pair.dst) <= pair.variables(pair.src):
            return "dst reads more variables"
        if all(_congruent(a, b) for a, b in zip(pair.src, pair.dst)):
            return "congruent (follows from smaller rules)"
        if len(pair.src) > 1 and _decomposes(pair) and _single_rules_exist(pair):
            return "multi-output: one single-output rule per output"
        if self._common_subgraph(pair):
            return "common subgraph"
        return ""

    def _common_subgraph(self, pair: Pair) -> bool:
        src_terms = {t.key: t for out in pair.src for t in _subterms(out)}
        dst_terms = {t.key: t for out in pair.dst for t in _subterms(out)}
        for key in sorted(set(src_terms) & set(dst_terms)):
            common = src_terms[key]
            shape = (DRAWS,) + common.shape
            memo = {key: self.fresh.integers(-INT_RANGE, INT_RANGE + 1, shape).astype(float)}
            src = [_values(t, memo) for t in pair.src]
            dst = [_values(t, memo) for t in pair.dst]
            if all(np.array_equal(a, b) for a, b in zip(src, dst)):
                return True
        return False


def _match(candidate: Candidate, first: Candidate) -> Pair:
    by_fp = {t.fp: t for t in first.outputs}
    src = tuple(sorted(candidate.outputs, key=lambda t: t.fp))
    dst = tuple(by_fp[t.fp] for t in src)
    return Pair(src, dst, candidate.num_ops, first.num_ops, graph_fingerprint(candidate))


def _decomposes(pair: Pair) -> bool:
    """Is each output pair a rule by itself (dst_i reads no variable src_i does not)?"""
    return all(set(_variables(b)) <= set(_variables(a)) for a, b in zip(pair.src, pair.dst))


def _oriented(pair: Pair) -> Pair:
    """src: the larger graph, except for a multi-output pair that is one rule only the other
    way: (mm x w1), (mm x w2) -> split(mm(x, cat(w1, w2))) merges two products, while
    split(...) -> (mm x w1), (mm x w2) is two single-output rules."""
    if len(pair.src) == 1 or not _decomposes(pair) or any(t.spec is None for t in pair.dst):
        return pair  # a rule's src is never a bare variable
    flipped = replace(pair, src=pair.dst, dst=pair.src, src_ops=pair.dst_ops,
                      dst_ops=pair.src_ops)
    return pair if _decomposes(flipped) else flipped


def _single_rules_exist(pair: Pair) -> bool:
    """Are the pair's output pairs found as single-output rules? Not where an src output is
    one output of a split: a graph with a split has both its outputs as results, so
    split(cat(x1, x2)) -> x1, x2 is a rule with two outputs only."""
    return all(t.spec is not None and t.spec.outputs == 1 for t in pair.src)


def _congruent(a: Tensor, b: Tensor) -> bool:
    if a.key == b.key:
        return True
    if a.spec is None or a.spec is not b.spec or a.attrs != b.attrs or a.output != b.output:
        return False
    return all(x.fp == y.fp for x, y in zip(a.operands, b.operands))


def _subterms(t: Tensor) -> Iterable[Tensor]:
    if t.spec is None:
        return
    yield t
    for operand in t.operands:
        yield from _subterms(operand)


def _variables(t: Tensor) -> Iterable[str]:
    if t.var is not None:
        yield t.var.name
    for operand in t.operands:
        yield from _variables(operand)


def _values(t: Tensor, memo: dict[str, np.ndarray]) -> np.ndarray:
    """The tensor's values with some subterms replaced (memo), by re-evaluation."""
    if t.key in memo:
        return memo[t.key]
    if t.spec is None:
        return t.values
    args = [_values(a, memo) for a in t.operands]
    out = evaluate(t.spec, t.attrs, args)[t.output]
    memo[t.key] = out
    return out


# --- canonical variable order ------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _classes(pool: Sequence[Var]) -> dict[str, list[str]]:
    """For each input, the names of its class in pool order."""
    by_class: dict[tuple[Shape, Role], list[str]] = {}
    for var in pool:
        by_class.setdefault(var.klass, []).append(var.name)
    return {var.name: by_class[var.klass] for var in pool}


def canonical_form(pair: Pair, classes: dict[str, list[str]]
                   ) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The rule's text, smallest over the renamings of its variables onto the first names
    of their classes; and that renaming."""
    used = sorted(pair.variables(pair.src))
    groups: dict[str, list[str]] = {}
    for name in used:
        groups.setdefault(classes[name][0], []).append(name)
    choices = []
    for head, names in sorted(groups.items()):
        targets = classes[head][:len(names)]
        choices.append([tuple(zip(names, perm)) for perm in itertools.permutations(targets)])
    best: tuple[str, tuple[tuple[str, str], ...]] | None = None
    for combo in itertools.product(*choices):
        mapping = dict(m for group in combo for m in group)
        text = _rule_text(pair, mapping)
        if best is None or text < best[0]:
            best = (text, tuple(sorted(mapping.items())))
    assert best is not None
    return best


def _rule_text(pair: Pair, mapping: dict[str, str]) -> str:
    rows = sorted((_rename(a.key, mapping), _rename(b.key, mapping))
                  for a, b in zip(pair.src, pair.dst))
    return " ; ".join(f"{a} => {b}" for a, b in rows)


def law_text(canonical: str) -> str:
    """The rule's text up to any renaming of its variables, shapes forgotten: two rules
    with one text are one law (mm (mm x1 w1) w2) = (mm (mm w1 w2) w3) on other shapes."""
    ops = set(re.findall(r"\((\w+)", canonical))
    names = sorted({t for t in _NAME.findall(canonical) if t not in ops})
    best = canonical
    for perm in itertools.permutations(range(len(names))):
        mapping = {n: f"v{i}" for n, i in zip(names, perm)}
        text = " ; ".join(sorted(_rename(row, mapping) for row in canonical.split(" ; ")))
        if best is canonical or text < best:
            best = text
    return best


def _rename(text: str, mapping: dict[str, str]) -> str:
    return _NAME.sub(lambda m: mapping.get(m.group(0), m.group(0)), text)


def renamed(pair: Pair) -> Pair:
    """The pair with outputs ordered as in its canonical text."""
    mapping = dict(pair.renaming)
    order = sorted(range(len(pair.src)), key=lambda i: (_rename(pair.src[i].key, mapping),
                                                        _rename(pair.dst[i].key, mapping)))
    return replace(pair, src=tuple(pair.src[i] for i in order),
                   dst=tuple(pair.dst[i] for i in order))


__all__ = ["DRAWS", "Pair", "Pairing", "canonical_form", "draw_inputs", "evaluate",
           "fingerprint", "graph_fingerprint", "renamed"]
