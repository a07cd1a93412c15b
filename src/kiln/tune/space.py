"""Design spaces: the schedules an autotuner may pick for one kernel, as named decisions.

A space makes plans from decisions. Each plan's Trace starts with one `sample_categorical`
instruction per decision (its value and its candidates), then the schedule those values give,
so a plan read back from the tuning database names its own decisions
(``plan.trace.decisions()``) and ``space.plan(decisions)`` rebuilds it exactly. Changing one
decision to another candidate gives a neighbour (`neighbours`). Today's heuristic schedule is
``space.default()``, one point of the space, so tuning never starts below it.

    space = GemmSpace.for_shape(128, 3072, 768, b_prepacked=True)
    plan = space.plan(space.default())     # the schedule kiln uses untuned
    space.decisions()                      # {"nr": (16, 32, ...), "mr": (4, ..., 14), ...}

The candidates of a later decision may depend on earlier ones (the register tile's rows MR
depend on its columns NR, through the register count), so spaces list decisions in order and
`candidates(name, fixed)` takes the decisions made so far.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kiln.codegen.isa import Isa
from kiln.ir.fused import apply_activation
from kiln.kernels.gemm_schedule import (
    SERIAL_MACS,
    GemmConfig,
    default_gemm_config,
    gemm_plan,
    matmul_func,
    pack_b,
)
from kiln.kernels.plan import Epilogue, KernelPlan, Serial
from kiln.kernels.validate import random_strided
from kiln.tir.schedule import Schedule
from kiln.tir.trace import Trace
from kiln.tune.db import workload_key

__all__ = ["Decisions", "GemmSpace", "Space", "neighbours", "random_point"]

Decisions = dict[str, Any]


class Space(Protocol):
    kind: str  # the kernel kind, as the tuning database files it

    def names(self) -> tuple[str, ...]: ...

    def candidates(self, name: str, fixed: Mapping[str, Any]) -> tuple[Any, ...]: ...

    def default(self) -> Decisions: ...

    def plan(self, decisions: Mapping[str, Any]) -> KernelPlan: ...

    def workload(self) -> str: ...  # the key its records are filed under, with the target

    def operands(self, decisions: Mapping[str, Any], gen: torch.Generator
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]: ...


def with_samples(plan: KernelPlan, space: Space, decisions: Mapping[str, Any]) -> KernelPlan:
    """``plan`` with its decisions recorded in front of its schedule."""
    sch = Schedule(plan.program)
    fixed: dict[str, Any] = {}
    for name in space.names():
        fixed[name] = sch.sample_categorical(name, space.candidates(name, fixed),
                                             decisions[name])
    return dataclasses.replace(plan, trace=Trace(sch.trace.instructions
                                                 + plan.trace.instructions))


def random_point(space: Space, rng: random.Random) -> Decisions:
    fixed: Decisions = {}
    for name in space.names():
        fixed[name] = rng.choice(space.candidates(name, fixed))
    return fixed


def neighbours(space: Space, point: Mapping[str, Any]) -> Iterator[Decisions]:
    """Every point that differs from ``point`` in one decision (later decisions whose value
    is no longer a candidate move to their nearest candidate)."""
    for name in space.names():
        for value in space.candidates(name, point):
            if value != point[name]:
                yield repair(space, {**point, name: value})


def repair(space: Space, point: Mapping[str, Any]) -> Decisions:
    """``point`` with each decision that is not among its candidates (given the earlier
    ones) replaced by the nearest candidate."""
    fixed: Decisions = {}
    for name in space.names():
        options = space.candidates(name, fixed)
        value = point.get(name)
        if value not in options:
            value = _nearest(options, value)
        fixed[name] = value
    return fixed


def _nearest(options: tuple[Any, ...], value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
            isinstance(o, (int, float)) and not isinstance(o, bool) for o in options):
        return min(options, key=lambda o: (abs(math.log(max(o, 1)) - math.log(max(value, 1))),
                                           o))
    return options[0]


# -- GEMM ------------------------------------------------------------------------------------------

# the suffix of a workload key timed with the caches evicted (`GemmSpace.streamed`): its
# records, timed so, never mix with those of the same kernel timed hot
STREAMED = ":streamed"
KC_CHOICES = (64, 128, 192, 256, 384, 512, 768, 1024)
MAX_TILE_VECTORS = 6  # the widest register tile the tuner tries, in vectors (N = 96 on AVX-512)
MC_TILES = (1, 2, 3, 4, 6, 8, 12, 16)  # MC as a multiple of MR
NC_PANELS = (1, 2, 4, 8, 12, 16, 24, 32)  # NC as a multiple of NR


@dataclass(frozen=True)
class GemmSpace:
    """The BLIS-style GEMM of `kiln.kernels.gemm_schedule`: register tile (NR vectors wide,
    MR rows, limited by the ISA's registers), cache blocks KC, MC and NC, which loop the
    threads split (the M blocks, or the N blocks when B is packed at compile time), and how
    (a fixed run each, or dynamically)."""

    m: int
    n: int
    k: int
    isa: Isa
    threads: int
    b_transposed: bool = False
    bias: bool = False
    b_prepacked: bool = False
    epilogue: Epilogue | None = None
    name: str = "gemm"
    kind: str = "gemm"
    bias_matrix: bool = False  # an [M, N] bias (a residual), not a row
    bias_row: bool = False  # and a row added to it in the init (the residual's conv bias)
    # bmm: the batch (the outermost loop, on the threads; each batch one K block on one
    # thread) and the element strides A and B are read with (None: contiguous)
    batch: int = 0
    a_strides: tuple[int, ...] | None = None
    b_strides: tuple[int, ...] | None = None
    # whether 512-bit FMAs run at full rate here (`kiln.cost.machine.full_rate_512`): the
    # heuristic's register tile depends on it (`default_gemm_config`)
    full_rate_512: bool = False
    # whether a model call finds its weights in memory (`kiln.kernels.streaming`): the tuner
    # then times it with the caches evicted, and its records are filed apart
    streamed: bool = False

    @staticmethod
    def for_shape(m: int, n: int, k: int, *, isa: Isa = Isa.AVX512, threads: int = 2,
                  **kwargs: Any) -> GemmSpace:
        return GemmSpace(m, n, k, isa, threads, **kwargs)

    def names(self) -> tuple[str, ...]:
        return ("nr", "mr", "kc", "mc_tiles", "nc_panels", "split_n", "dynamic")

    def _heuristic(self) -> GemmConfig:
        if self.batch:  # (each batch on one thread, in one K block)
            return default_gemm_config(self.m, self.n, self.k, threads=1,
                                       base=GemmConfig.for_isa(self.isa), one_k_block=True,
                                       batched=True, full_rate_512=self.full_rate_512)
        return default_gemm_config(self.m, self.n, self.k, threads=self.threads,
                                   base=GemmConfig.for_isa(self.isa),
                                   b_prepacked=self.b_prepacked,
                                   one_k_block=self.epilogue is not None,
                                   full_rate_512=self.full_rate_512)

    def default(self) -> Decisions:
        cfg = self._heuristic()
        return {"nr": cfg.nr, "mr": cfg.mr, "kc": cfg.kc, "mc_tiles": cfg.mc // cfg.mr,
                "nc_panels": cfg.nc // cfg.nr, "split_n": cfg.split_n, "dynamic": cfg.dynamic}

    def candidates(self, name: str, fixed: Mapping[str, Any]) -> tuple[Any, ...]:
        default = self.default()
        lanes = self.isa.f32_lanes
        if name == "nr":
            # one or two vectors, or as many as cover N (up to `MAX_TILE_VECTORS`, and while
            # two rows of them still fit the registers): a tile as wide as a short N writes
            # whole rows of C. 12544x96x16 on an AVX-512 Xeon, 2 threads, B prepacked: 4 x 96
            # 176 us against the default 16 x 16's 290 (ATen 258); with A and C out of L2,
            # 377 against 544 (ATen 436)
            if lanes == 1:
                options = {2, 4}
            else:
                widest = min(-(-max(self.n, 1) // lanes), MAX_TILE_VECTORS,
                             (self.isa.registers - 1) // 3)
                options = {lanes, 2 * lanes} | {v * lanes for v in range(3, widest + 1)}
        elif name == "mr":
            # MR x NR/lanes accumulators, NR/lanes vectors of B and one broadcast of A must
            # fit in the registers
            vectors = max(fixed["nr"] // lanes, 1)
            largest = max((self.isa.registers - vectors - 1) // vectors, 1)
            options = {mr for mr in (2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28)
                       if mr <= largest}
        elif name == "kc":
            if self.epilogue is not None or self.batch:  # one K block (the epilogue needs
                # it; a batched GEMM always takes it)
                return (max(self.k, 1),)
            options = {kc for kc in KC_CHOICES if kc < self.k} | {max(self.k, 1)}
        elif name == "mc_tiles":
            tiles = -(-max(self.m, 1) // fixed["mr"])
            options = {t for t in MC_TILES if t <= tiles} | {1}
        elif name == "nc_panels":
            panels = -(-max(self.n, 1) // fixed["nr"])
            options = {p for p in NC_PANELS if p <= panels} | {min(panels, 32), 1}
        elif name == "split_n":
            return (False, True) if self.b_prepacked and self.threads > 1 else (False,)
        elif name == "dynamic":  # (how the threads share the blocks: fixed runs or as they
            # come free)
            return (False, True) if self.threads > 1 else (default[name],)
        else:
            raise KeyError(f"the GEMM space has no decision {name!r}")
        if default[name] in _default_context(self, name, fixed, default):
            options.add(default[name])
        return tuple(sorted(options))

    def config(self, decisions: Mapping[str, Any]) -> GemmConfig:
        d = repair(self, decisions)
        if dict(d) != dict(decisions):
            wrong = [n for n in self.names() if d[n] != decisions.get(n)]
            raise ValueError(f"decisions {', '.join(wrong)} are not in this GEMM's space")
        return GemmConfig(mr=d["mr"], nr=d["nr"], kc=d["kc"], mc=d["mc_tiles"] * d["mr"],
                          nc=d["nc_panels"] * d["nr"], split_n=d["split_n"],
                          dynamic=d["dynamic"], lanes=self.isa.f32_lanes)

    def operands(self, decisions: Mapping[str, Any],
                 gen: torch.Generator) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Random operands in the kernel's parameter order (B packed for this point's NR
        where the space packs it; the output last, empty), and the expected outputs."""
        if self.batch:
            return self._batched_operands(gen)
        a = torch.randn(self.m, self.k, generator=gen)
        b = torch.randn(self.k, self.n, generator=gen)  # [K, N]
        bias = torch.randn((self.m, self.n) if self.bias_matrix else (self.n,),
                           generator=gen) if self.bias else None
        row = torch.randn(self.n, generator=gen) if self.bias_row else None
        expected = a @ b if bias is None else \
            torch.addmm(bias if row is None else bias + row, a, b)
        if self.epilogue is not None:
            apply_activation(expected, self.epilogue.activation, self.epilogue.args)
        if self.b_prepacked:
            b_param = pack_b(b, decisions["nr"])
        else:
            b_param = b.t().contiguous() if self.b_transposed else b
        operands = [a, b_param] + ([bias] if bias is not None else []) + \
            ([row] if row is not None else [])
        return [*operands, torch.empty(self.m, self.n)], [expected]

    @property
    def strided_operands(self) -> tuple[int, ...]:
        """The positions of the operands `operands` lays out with the kernel's own strides
        (which a measurement must pass as they are)."""
        return tuple(i for i, s in enumerate((self.a_strides, self.b_strides))
                     if self.batch and s is not None)

    def _batched_operands(self, gen: torch.Generator
                          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A bmm's operands laid out with the space's strides (as the run time's views
        give them), the output contiguous, and torch.bmm's result."""
        shapes = ((self.batch, self.m, self.k), (self.batch, self.k, self.n))
        operands = []
        for shape, strides in zip(shapes, (self.a_strides, self.b_strides)):
            operands.append(torch.randn(shape, generator=gen) if strides is None else
                            random_strided(shape, strides, gen))
        expected = torch.bmm(*operands)
        return [*operands, torch.empty(self.batch, self.m, self.n)], [expected]

    def workload(self) -> str:
        """The structural hash of the unscheduled program (the default's B layout, a bmm's
        batch and strides) and of the epilogue, which runs as a post-pass and so is not in
        that program."""
        return _gemm_workload(self.m, self.n, self.k, self.b_transposed, self.bias,
                              self.default()["nr"] if self.b_prepacked else 0,
                              repr(self.epilogue), self.bias_matrix, self.batch,
                              self.a_strides, self.b_strides, self.bias_row) \
            + (STREAMED if self.streamed else "")

    def plan(self, decisions: Mapping[str, Any]) -> KernelPlan:
        return with_samples(self.plan_config(self.config(decisions)), self, decisions)

    def plan_config(self, cfg: GemmConfig) -> KernelPlan:
        """The plan of one tile configuration, without recorded decisions (the compile's
        heuristic path); a small GEMM runs on one thread, as compiled."""
        plan = gemm_plan(self.m, self.n, self.k, cfg, b_transposed=self.b_transposed,
                         bias=self.bias, name=self.name, b_prepacked=self.b_prepacked,
                         epilogue=self.epilogue, bias_matrix=self.bias_matrix,
                         batch=self.batch, a_strides=self.a_strides, b_strides=self.b_strides,
                         bias_row=self.bias_row)
        if max(self.batch, 1) * self.m * self.n * self.k < SERIAL_MACS:
            plan = plan.with_post(Serial(f"fewer than {SERIAL_MACS} multiply-adds"))
        return plan


@functools.lru_cache(maxsize=1024)
def _gemm_workload(m: int, n: int, k: int, b_transposed: bool, bias: bool, b_panels: int,
                   epilogue: str, bias_matrix: bool = False, batch: int = 0,
                   a_strides: tuple[int, ...] | None = None,
                   b_strides: tuple[int, ...] | None = None, bias_row: bool = False) -> str:
    program = matmul_func(m, n, k, b_transposed, bias, "gemm", b_panels, bias_matrix, batch,
                          a_strides, b_strides, bias_row)
    return workload_key(program) + hashlib.sha256(epilogue.encode()).hexdigest()[:8]


def _default_context(space: GemmSpace, name: str, fixed: Mapping[str, Any],
                     default: Decisions) -> tuple[Any, ...]:
    """The heuristic's value is a candidate where the earlier decisions are the heuristic's
    too (its MC tiles mean nothing with another MR)."""
    earlier = space.names()[: space.names().index(name)]
    return (default[name],) if all(fixed.get(e) == default[e] for e in earlier) else ()
