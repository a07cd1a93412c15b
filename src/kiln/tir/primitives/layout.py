"""transform_layout: store an allocated buffer in another layout, given by an index map.

An `IndexMap` sends an index ``(x_0, ..., x_{r-1})`` of the buffer to an index of the new
layout, one `MapTerm` per new dimension: ``x_d`` itself, ``x_d // f`` or ``x_d % f``. It must
be a bijection onto its image: every ``x_d`` appears either once alone, or once as ``// f``
together with once as ``% f`` (the same ``f``). A packed GEMM panel ``(k, n) -> (n // 32, k,
n % 32)`` is ``IndexMap.of(((1, "//", 32), (0, "", 0), (1, "%", 32)))``.

transform_layout(pack_B, "B_local", (k, n) -> (n // 32, k, n % 32)) on a [64, 48] panel::

    alloc B_local: f32[64, 48] local:           alloc B_local: f32[2, 64, 32] local:
      ... B_local[v0, v1] = B[v0, v1]      ->     ... B_local[v1 // 32, v0, v1 % 32] = B[v0, v1]
      ... B_local[vk, vj] ...                     ... B_local[vj // 32, vk, vj % 32] ...

When ``f`` does not divide the extent, the new shape rounds up (the last panel has unused
lanes that no access touches). Only buffers the program allocates can change layout: a
function parameter's layout belongs to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.tir.arith import simplify
from kiln.tir.nodes import Allocate, Block, Buffer, Expr, PrimFunc, const
from kiln.tir.primitives.common import ScheduleError, find_block
from kiln.tir.visit import iter_stmts, loads_of, replace_buffer, stores_of

__all__ = ["IndexMap", "MapTerm", "transform_layout"]

_OPS = ("", "//", "%")


@dataclass(frozen=True)
class MapTerm:
    """One dimension of the new layout: ``x[dim]`` (op ""), ``x[dim] // factor`` or
    ``x[dim] % factor``."""

    dim: int
    op: str = ""
    factor: int = 0

    def apply(self, index: tuple[Expr, ...]) -> Expr:
        x = index[self.dim]
        if self.op == "//":
            return simplify(x // const(self.factor, x.dtype))
        if self.op == "%":
            return simplify(x % const(self.factor, x.dtype))
        return x

    def extent(self, shape: tuple[int, ...]) -> int:
        n = shape[self.dim]
        if self.op == "//":
            return -(-n // self.factor)
        if self.op == "%":
            return self.factor if n > 0 else 0
        return n

    def __str__(self) -> str:
        return f"x{self.dim}" + (f" {self.op} {self.factor}" if self.op else "")


@dataclass(frozen=True)
class IndexMap:
    terms: tuple[MapTerm, ...]

    @staticmethod
    def of(spec: tuple | list) -> IndexMap:
        """From JSON-able rows ``(dim, op, factor)``, op one of "", "//", "%"."""
        return IndexMap(tuple(MapTerm(int(d), str(op), int(f)) for d, op, f in spec))

    def to_spec(self) -> tuple[tuple[int, str, int], ...]:
        return tuple((t.dim, t.op, t.factor) for t in self.terms)

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.terms)) + ")"


def _check_bijective(imap: IndexMap, rank: int, what: str) -> None:
    for t in imap.terms:
        if t.op not in _OPS:
            raise ScheduleError(f"{what}: unknown operation {t.op!r} in the index map (use "
                                f"'', '//' or '%')")
        if not 0 <= t.dim < rank:
            raise ScheduleError(f"{what}: the index map uses x{t.dim} of a rank-{rank} buffer")
        if t.op and t.factor < 1:
            raise ScheduleError(f"{what}: factor {t.factor} of x{t.dim} must be positive")
    for d in range(rank):
        ops = sorted(t.op for t in imap.terms if t.dim == d)
        if ops == [""]:
            continue
        factors = {t.factor for t in imap.terms if t.dim == d}
        if ops == ["%", "//"] and len(factors) == 1:
            continue
        raise ScheduleError(f"{what}: the index map {imap} is not a bijection onto the new "
                            f"shape: x{d} must appear once alone or as x{d} // f and x{d} % f")


def transform_layout(func: PrimFunc, block: str, buffer: str, imap: IndexMap) -> PrimFunc:
    """Store ``buffer`` (accessed by ``block``) in the layout ``imap``: every access of it is
    rewritten through the map and its allocation takes the new shape."""
    what = f"transform_layout {block} {buffer}"
    blk = find_block(func, block).stmt
    assert isinstance(blk, Block)
    touched = [e.buffer for e in loads_of(blk.body)] + [s.buffer for s in stores_of(blk.body)]
    found = [b for b in touched if b.name == buffer]
    if not found:
        raise ScheduleError(f"{what}: the block does not access {buffer}")
    buf = found[0]
    if buf in func.params:
        raise ScheduleError(f"{what}: {buffer} is a function parameter; its layout belongs to "
                            f"the caller (cache_read it and transform the copy)")
    if not any(isinstance(s, Allocate) and s.buffer == buf for s in iter_stmts(func.body)):
        raise ScheduleError(f"{what}: {buffer} is not allocated in {func.name}")
    _check_bijective(imap, buf.rank, what)
    shape = tuple(t.extent(buf.shape) for t in imap.terms)
    new = Buffer(buf.name, shape, buf.dtype, None, buf.scope)

    def remap(index: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(t.apply(index) for t in imap.terms)

    return func.with_body(replace_buffer(func.body, buf, new, remap))
