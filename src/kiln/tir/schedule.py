"""Schedule: verbs on handles, each applied to an immutable PrimFunc and recorded in a Trace.

    sch = Schedule(lowered.func)
    c = sch.get_block("mm")
    i, j, k = sch.get_loops(c)
    io, jo, ii, ji = sch.tile([i, j], [4, 16])
    acc = sch.cache_write(c)              # local accumulator + write-back block
    sch.reverse_compute_at(acc, jo)
    sch.vectorize(...); sch.parallel(io)
    func = sch.func                        # then kiln.tir.compact.compact_buffers(func)
    print(sch.trace.as_python())

A primitive that would change the program's meaning raises `ScheduleError` saying why, and
leaves the schedule as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kiln.tir.nodes import Block, ForKind, PrimFunc, Scope
from kiln.tir.primitives import cache, compute_location, layout, loops, rfactor
from kiln.tir.primitives.common import ScheduleError, find_block, walk_with_path
from kiln.tir.printer import print_func
from kiln.tir.trace import Instruction, Trace, Verb

__all__ = ["BlockRV", "LoopRV", "Schedule", "ScheduleError"]


@dataclass(frozen=True)
class LoopRV:
    """A handle on a loop, by its loop variable's name."""

    name: str


@dataclass(frozen=True)
class BlockRV:
    name: str


LoopLike = LoopRV | str
BlockLike = BlockRV | str


def _n(h: LoopLike | BlockLike) -> str:
    return h if isinstance(h, str) else h.name


class Schedule:
    def __init__(self, func: PrimFunc) -> None:
        self.func = func
        self.trace = Trace()

    def __str__(self) -> str:
        return print_func(self.func)

    def _record(self, verb: Verb, args: dict[str, Any], outputs: Sequence[str] = ()) -> None:
        frozen = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in args.items())
        self.trace.append(Instruction(verb, frozen, tuple(outputs)))

    # -- handles -------------------------------------------------------------------------

    def get_block(self, name: str) -> BlockRV:
        find_block(self.func, name)
        self._record(Verb.GET_BLOCK, {"name": name}, [name])
        return BlockRV(name)

    def get_loops(self, block: BlockLike) -> list[LoopRV]:
        """The loops around ``block``, outermost first."""
        loc = find_block(self.func, _n(block))
        names = [f.var.name for f in loc.loops]
        self._record(Verb.GET_LOOPS, {"block": _n(block)}, names)
        return [LoopRV(n) for n in names]

    def blocks(self) -> list[str]:
        return [loc.stmt.name for loc in walk_with_path(self.func.body)
                if isinstance(loc.stmt, Block)]

    # -- loops ---------------------------------------------------------------------------

    def split(self, loop: LoopLike, factors: Sequence[int | None]) -> list[LoopRV]:
        self.func, names = loops.split(self.func, _n(loop), list(factors))
        self._record(Verb.SPLIT, {"loop": _n(loop), "factors": list(factors)}, names)
        return [LoopRV(n) for n in names]

    def tile(self, tile_loops: Sequence[LoopLike], tiles: Sequence[int]) -> list[LoopRV]:
        """Split each loop by its tile size and put all outer parts outside all inner ones:
        returns ``[outer_0, ..., outer_n, inner_0, ..., inner_n]``."""
        if len(tile_loops) != len(tiles):
            raise ScheduleError(f"tile: {len(tile_loops)} loops but {len(tiles)} tile sizes")
        func = self.func
        outers, inners = [], []
        for loop, t in zip(tile_loops, tiles):
            func, (o, i) = loops.split(func, _n(loop), [None, t])
            outers.append(o)
            inners.append(i)
        func = loops.reorder(func, outers + inners)
        self.func = func
        names = outers + inners
        self._record(Verb.TILE, {"loops": [_n(x) for x in tile_loops], "tiles": list(tiles)},
                     names)
        return [LoopRV(n) for n in names]

    def fuse(self, *fuse_loops: LoopLike) -> LoopRV:
        self.func, name = loops.fuse(self.func, [_n(x) for x in fuse_loops])
        self._record(Verb.FUSE, {"loops": [_n(x) for x in fuse_loops]}, [name])
        return LoopRV(name)

    def reorder(self, *order: LoopLike) -> None:
        self.func = loops.reorder(self.func, [_n(x) for x in order])
        self._record(Verb.REORDER, {"loops": [_n(x) for x in order]})

    def parallel(self, loop: LoopLike, dynamic: bool = False) -> None:
        """The loop's iterations on the threads: each thread a fixed contiguous run of them,
        or with ``dynamic`` one at a time to whichever is free (`ForKind`)."""
        kind = ForKind.PARALLEL_DYNAMIC if dynamic else ForKind.PARALLEL
        self.func = loops.annotate(self.func, _n(loop), kind)
        self._record(Verb.PARALLEL, {"loop": _n(loop), **({"dynamic": True} if dynamic else {})})

    def vectorize(self, loop: LoopLike) -> None:
        self.func = loops.annotate(self.func, _n(loop), ForKind.VECTORIZED)
        self._record(Verb.VECTORIZE, {"loop": _n(loop)})

    def unroll(self, loop: LoopLike) -> None:
        self.func = loops.annotate(self.func, _n(loop), ForKind.UNROLLED)
        self._record(Verb.UNROLL, {"loop": _n(loop)})

    def fission(self, loop: LoopLike, at: int) -> list[LoopRV]:
        self.func, names = loops.fission(self.func, _n(loop), at)
        self._record(Verb.FISSION, {"loop": _n(loop), "at": at}, names)
        return [LoopRV(n) for n in names]

    def fusion(self, first: LoopLike, second: LoopLike) -> LoopRV:
        self.func, name = loops.fusion(self.func, _n(first), _n(second))
        self._record(Verb.FUSION, {"first": _n(first), "second": _n(second)}, [name])
        return LoopRV(name)

    # -- compute location ----------------------------------------------------------------

    def compute_at(self, block: BlockLike, loop: LoopLike) -> None:
        self.func = compute_location.compute_at(self.func, _n(block), _n(loop))
        self._record(Verb.COMPUTE_AT, {"block": _n(block), "loop": _n(loop)})

    def reverse_compute_at(self, block: BlockLike, loop: LoopLike) -> None:
        self.func = compute_location.reverse_compute_at(self.func, _n(block), _n(loop))
        self._record(Verb.REVERSE_COMPUTE_AT, {"block": _n(block), "loop": _n(loop)})

    def compute_inline(self, block: BlockLike) -> None:
        self.func = compute_location.compute_inline(self.func, _n(block))
        self._record(Verb.COMPUTE_INLINE, {"block": _n(block)})

    # -- caches and reductions -----------------------------------------------------------

    def cache_read(self, block: BlockLike, buffer: str,
                   scope: Scope | str = Scope.LOCAL) -> BlockRV:
        scope = Scope(scope)  # also the trace's Python form: scope='local'
        self.func, name = cache.cache_read(self.func, _n(block), buffer, scope)
        self._record(Verb.CACHE_READ, {"block": _n(block), "buffer": buffer,
                                       "scope": scope.value}, [name])
        return BlockRV(name)

    def cache_write(self, block: BlockLike, scope: Scope | str = Scope.LOCAL) -> BlockRV:
        scope = Scope(scope)  # also the trace's Python form: scope='local'
        self.func, name = cache.cache_write(self.func, _n(block), scope)
        self._record(Verb.CACHE_WRITE, {"block": _n(block), "scope": scope.value}, [name])
        return BlockRV(name)

    def decompose_reduction(self, block: BlockLike, loop: LoopLike) -> BlockRV:
        self.func, name = cache.decompose_reduction(self.func, _n(block), _n(loop))
        self._record(Verb.DECOMPOSE_REDUCTION, {"block": _n(block), "loop": _n(loop)}, [name])
        return BlockRV(name)

    def rfactor(self, block: BlockLike, loop: LoopLike) -> BlockRV:
        """Factor a reduction over ``loop`` into partials (the returned rf block) and a
        write-back block; see `kiln.tir.primitives.rfactor`."""
        self.func, name = rfactor.rfactor(self.func, _n(block), _n(loop))
        self._record(Verb.RFACTOR, {"block": _n(block), "loop": _n(loop)}, [name])
        return BlockRV(name)

    def cache_inplace(self, block: BlockLike, buffer: str,
                      scope: Scope | str = Scope.LOCAL) -> list[BlockRV]:
        """The load and write-back blocks of a local copy of ``buffer`` that ``block``
        updates in place (see `kiln.tir.primitives.cache.cache_inplace`)."""
        scope = Scope(scope)  # also the trace's Python form: scope='local'
        self.func, names = cache.cache_inplace(self.func, _n(block), buffer, scope)
        self._record(Verb.CACHE_INPLACE, {"block": _n(block), "buffer": buffer,
                                          "scope": scope.value}, names)
        return [BlockRV(n) for n in names]

    # -- layout --------------------------------------------------------------------------

    def transform_layout(self, block: BlockLike, buffer: str,
                         index_map: layout.IndexMap | Sequence[Sequence[Any]]) -> None:
        """Store an allocated ``buffer`` in the layout ``index_map`` (rows ``(dim, op,
        factor)``, see `kiln.tir.primitives.layout`)."""
        imap = index_map if isinstance(index_map, layout.IndexMap) else \
            layout.IndexMap.of(index_map)
        self.func = layout.transform_layout(self.func, _n(block), buffer, imap)
        self._record(Verb.TRANSFORM_LAYOUT, {"block": _n(block), "buffer": buffer,
                                             "index_map": [tuple(r) for r in imap.to_spec()]})

    # -- sampling (the decisions an autotuner changes) -----------------------------------

    def sample_categorical(self, name: str, candidates: Sequence[Any], decision: Any) -> Any:
        """Record a decision: ``decision``, one of ``candidates``, named ``name``. The verbs
        that follow use its value; `kiln.tune.space` re-runs a schedule with other decisions
        to get a neighbour, and `Trace.decisions` reads them back."""
        if decision not in candidates:
            raise ScheduleError(f"sample_categorical {name}: {decision!r} is not one of "
                                f"{list(candidates)}")
        self._record(Verb.SAMPLE_CATEGORICAL, {"name": name, "candidates": list(candidates),
                                               "decision": decision}, [name])
        return decision

    # -- replay --------------------------------------------------------------------------

    def replay(self, inst: Instruction) -> None:
        """Apply one recorded instruction; its outputs must come out with the same names."""
        a = dict(inst.args)
        v = inst.verb
        out: Any
        if v is Verb.SAMPLE_CATEGORICAL:  # a decision, not a handle: nothing to compare
            self.sample_categorical(a["name"], a["candidates"], a["decision"])
            return
        if v is Verb.GET_BLOCK:
            out = self.get_block(a["name"])
        elif v is Verb.GET_LOOPS:
            out = self.get_loops(a["block"])
        elif v is Verb.SPLIT:
            out = self.split(a["loop"], a["factors"])
        elif v is Verb.TILE:
            out = self.tile(a["loops"], a["tiles"])
        elif v is Verb.FUSE:
            out = self.fuse(*a["loops"])
        elif v is Verb.REORDER:
            out = self.reorder(*a["loops"])
        elif v is Verb.PARALLEL:
            out = self.parallel(a["loop"], a.get("dynamic", False))
        elif v in (Verb.VECTORIZE, Verb.UNROLL):
            out = getattr(self, v.value)(a["loop"])
        elif v is Verb.FISSION:
            out = self.fission(a["loop"], a["at"])
        elif v is Verb.FUSION:
            out = self.fusion(a["first"], a["second"])
        elif v in (Verb.COMPUTE_AT, Verb.REVERSE_COMPUTE_AT):
            out = getattr(self, v.value)(a["block"], a["loop"])
        elif v is Verb.COMPUTE_INLINE:
            out = self.compute_inline(a["block"])
        elif v is Verb.CACHE_READ:
            out = self.cache_read(a["block"], a["buffer"], Scope(a["scope"]))
        elif v is Verb.CACHE_WRITE:
            out = self.cache_write(a["block"], Scope(a["scope"]))
        elif v is Verb.DECOMPOSE_REDUCTION:
            out = self.decompose_reduction(a["block"], a["loop"])
        elif v is Verb.RFACTOR:
            out = self.rfactor(a["block"], a["loop"])
        elif v is Verb.CACHE_INPLACE:
            out = self.cache_inplace(a["block"], a["buffer"], Scope(a["scope"]))
        elif v is Verb.TRANSFORM_LAYOUT:
            out = self.transform_layout(a["block"], a["buffer"], a["index_map"])
        else:
            raise ScheduleError(f"cannot replay {v}")
        got = [] if out is None else [h.name for h in (out if isinstance(out, list) else [out])]
        if tuple(got) != inst.outputs:
            raise ScheduleError(f"replay of {v.value} gave {got}, the trace recorded "
                                f"{list(inst.outputs)}: not the program the trace was made on")
