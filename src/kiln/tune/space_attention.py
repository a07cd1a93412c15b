"""The design space of kiln's generated attention (`kiln.kernels.attention_schedule`): the
heuristic (`default_attention_config`) is the default point, so tuning never starts below it.

Decisions, in order (a later one's candidates depend on the earlier ones):

* ``query_vectors``: queries per block, in vectors (2, 3 or 4): the width of the scores'
  register tile and how many scores and probabilities a block keeps in cache;
* ``key_rows``: keys per register tile of the scores (its accumulators: key_rows x
  query_vectors, plus the vectors of Q and a broadcast, within the registers);
* ``value_rows``: queries per register tile of the product with V (a divisor of the
  block, value_rows x Ev vectors of accumulators within the registers);
* ``split_queries``: the threads take the heads, or each head's blocks of queries.

    space = AttentionSpace(shape, Isa.AVX512, threads=2)
    plan = space.plan(space.default())     # the schedule kiln compiles untuned
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kiln.codegen.isa import Isa
from kiln.kernels.attention_schedule import (
    QUERY_VECTORS,
    AttentionConfig,
    AttentionShape,
    attention_func,
    attention_plan,
    default_attention_config,
    stops_at_diagonal,
    transposed_mask,
)
from kiln.kernels.plan import KernelPlan
from kiln.kernels.validate import random_strided
from kiln.tir.nodes import contiguous_strides
from kiln.tune.db import workload_key
from kiln.tune.space import Decisions, with_samples

__all__ = ["AttentionSpace"]

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16)


@dataclass(frozen=True)
class AttentionSpace:
    """One attention kernel's schedules: its shape (with the operands' strides and the mask's
    extents), the ISA (vector lanes, registers), the threads."""

    shape: AttentionShape
    isa: Isa
    threads: int
    name: str = "attention"
    kind: str = "attention"

    @property
    def k(self) -> int:
        """Terms per output (the runner scales its tolerance by their square root)."""
        return self.shape.keys * self.shape.depth

    @property
    def strided_operands(self) -> tuple[int, ...]:
        """Q, K and V are views with the strides the kernel reads, and so is a mask made at
        run time: passed as they are."""
        return (0, 1, 2, 3) if self.shape.runtime_mask is not None else (0, 1, 2)

    def names(self) -> tuple[str, ...]:
        return ("query_vectors", "key_rows", "value_rows", "split_queries")

    def _heuristic(self) -> AttentionConfig:
        config = default_attention_config(self.isa, self.shape.v_depth, self.shape.queries,
                                          self.shape.heads, self.threads,
                                          stops_at_diagonal(self.shape))
        if config is None:
            raise ValueError(f"no attention kernel for a value width of {self.shape.v_depth} "
                             f"on {self.isa.label}")
        return config

    def default(self) -> Decisions:
        cfg = self._heuristic()
        return {"query_vectors": cfg.qb // cfg.lanes, "key_rows": cfg.mr_keys,
                "value_rows": cfg.mr_rows, "split_queries": cfg.split_queries}

    def candidates(self, name: str, fixed: Mapping[str, Any]) -> tuple[Any, ...]:
        free = self.isa.registers - 2  # (a broadcast and a spare)
        if name == "query_vectors":
            return tuple(sorted(QUERY_VECTORS))
        if name == "split_queries":  # (the threads take the heads, or each head's blocks)
            return (False, True) if self.threads > 1 else (self.default()[name],)
        vectors = fixed["query_vectors"]
        if name == "key_rows":
            largest = (free - vectors) // vectors
            options = {r for r in ROWS if r <= largest}
        elif name == "value_rows":
            ev_vectors = self.shape.v_depth // self.isa.f32_lanes
            largest = (free - ev_vectors) // ev_vectors
            block = vectors * self.isa.f32_lanes
            options = {r for r in ROWS if r <= largest and block % r == 0}
        else:
            raise KeyError(f"the attention space has no decision {name!r}")
        default = self.default()
        if all(fixed.get(n) == default[n] for n in self.names()[:self.names().index(name)]):
            options.add(default[name])
        return tuple(sorted(options or {1}))

    def config(self, decisions: Mapping[str, Any]) -> AttentionConfig:
        lanes = self.isa.f32_lanes
        return AttentionConfig(decisions["query_vectors"] * lanes, decisions["key_rows"],
                               decisions["value_rows"], lanes, decisions["split_queries"])

    def plan(self, decisions: Mapping[str, Any]) -> KernelPlan:
        return with_samples(self.plan_config(self.config(decisions)), self, decisions)

    def plan_config(self, cfg: AttentionConfig) -> KernelPlan:
        """The plan of one configuration, without recorded decisions (the untuned compile)."""
        return attention_plan(self.shape, cfg, self.name)

    def workload(self) -> str:
        """The structural hash of the unscheduled program (shapes, strides, mask, scale)."""
        return _attention_workload(self.shape)

    def operands(self, decisions: Mapping[str, Any], gen: torch.Generator
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Random Q, K, V laid out with the kernel's strides, the keys after each query
        masked where the kernel is causal, a random mask where the kernel adds one (finite
        and transposed, as a constant is compiled; or with the run-time mask's own strides,
        a bool one mostly True), the output; and the decomposition's result."""
        s = self.shape
        kv = s.kv_heads or s.heads
        dims = ((s.batch, s.heads, s.queries, s.depth), (s.batch, kv, s.keys, s.depth),
                (s.batch, kv, s.keys, s.v_depth))
        q, k, v = (random_strided(d, st if st is not None else contiguous_strides(d), gen)
                   for d, st in zip(dims, (s.q_strides, s.k_strides, s.v_strides)))
        # (grouped-query heads: query head h reads key head h // (H / KV))
        k_h, v_h = (x.repeat_interleave(s.heads // kv, 1) for x in (k, v))
        scores = q @ k_h.transpose(-1, -2) * s.scale
        if s.causal:  # (query i sees keys 0..i, as the kernel's is_causal; it may stop there)
            after = torch.ones(s.queries, s.keys, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(after, -float("inf"))
        mask = []
        runtime = s.runtime_mask
        if runtime is not None:
            given = random_strided(runtime.dims, runtime.strides, gen)
            if runtime.boolean:  # (about one in ten keys masked; memory shared as laid out)
                flat = given.as_strided((given.untyped_storage().nbytes() // 4,), (1,))
                given = (flat < 1.3).as_strided(runtime.dims, runtime.strides)
                scores = scores.masked_fill(~given, -float("inf"))
            else:
                scores = scores + given
            mask = [given]
        elif s.mask is not None:
            bias = torch.randn(*s.mask, s.queries, s.keys, generator=gen)
            scores = scores + bias
            mask = [transposed_mask(bias, s.batch, s.heads, s.queries, s.keys, s.mask_panel)]
        expected = torch.softmax(scores, -1) @ v_h
        if s.heads_inner:  # (the transposed result, [B, L, H, Ev])
            expected = expected.transpose(1, 2).contiguous()
        return [q, k, v, *mask, torch.empty(expected.shape)], [expected]


@functools.lru_cache(maxsize=256)
def _attention_workload(shape: AttentionShape) -> str:
    return workload_key(attention_func(shape)) + hashlib.sha256(b"attention").hexdigest()[:8]
