"""Whether a kernel's weights stream from memory in a model call: such a kernel is timed with
the caches evicted before each call, by the compile's library-or-generated decision
(`kiln.kernels.decide`) and by the tuner (`kiln.tune.measure`), as the model finds them.

    streams_weights(graph, group)    # True: time it cold
"""

from __future__ import annotations

import math

from kiln.cost.measure import last_level_cache_bytes
from kiln.ir.graph import Graph
from kiln.ir.ops import Op
from kiln.passes.partition import KernelGroup

__all__ = ["STREAMED_WEIGHT_BYTES", "streams_weights"]

STREAMED_WEIGHT_BYTES = 1 << 20  # about a core's L2: larger weights stream (streams_weights)


def streams_weights(graph: Graph, group: KernelGroup) -> bool:
    """Whether a model call finds the group's constant weights in memory, not in the cache a
    repeated call leaves them in, so that the group is timed with the caches evicted before
    each call:

    * one output row (a classifier's matrix-vector product) over at least
      `STREAMED_WEIGHT_BYTES` of weights: the contenders differ there. MobileNetV2's
      1x1280x1000 classifier took 64 us in oneDNN against 107 in ATen timed hot, but 237-277
      us in the model, where kiln's GEMM took 113-144;
    * any group with that much weight in a graph whose weights overflow the last-level
      cache, so that every call reads them from DRAM (a transformer's layers). Timed hot,
      kiln's GEMM and oneDNN's tied on GPT-2's 128x768 @ 768x3072 (2.81 ms); from DRAM,
      kiln's, which prefetches its next panel, ran 201 GFLOP/s against 183 without."""
    weights = sum(v.type.nbytes for v in group.inputs if v.node.op is Op.CONSTANT)
    if weights < STREAMED_WEIGHT_BYTES:
        return False
    shape = group.last.outputs[0].type.shape  # (a max pool has its indices second)
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return rows == 1 or _weight_bytes(graph) > last_level_cache_bytes()


def _weight_bytes(graph: Graph) -> int:
    return sum(n.types[0].nbytes for n in graph.nodes if n.op is Op.CONSTANT)
