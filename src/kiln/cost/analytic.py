"""What a graph costs to run, estimated: FLOPs and bytes per op against a roofline.

    roof = Roofline.of_machine(options)      # measured once per machine, kept on disk
    model = AnalyticCost(roof)
    GraphCost(model).seconds(graph)          # estimated seconds per call (kiln.cost.graph)

An op takes ``call_s + max(flops / compute rate, bytes / bandwidth)``: the fixed cost of one
call (dispatch, allocation, waking the thread team), then whichever limit it meets first. The
compute rate is the FMA peak (`kiln.cost.machine`) times the fraction a library contraction
reaches; elementwise and reduction ops are counted by their memory traffic, since on this
class of machine they never reach the FMA peak before the bandwidth limit. Views cost a
fraction of a call and no traffic. Nodes that depend on weights only cost nothing: constant
folding computes them at compile time.

This is the cost the graph-level search (`kiln.search`) ranks candidates by; the measured
per-op times of `kiln.cost.measured` refine it where an estimate is a close call.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kiln.ir.graph import Node
from kiln.ir.ops import Op, OpGroup
from kiln.ir.types import DType, TensorType
from kiln.options import Options

__all__ = ["AnalyticCost", "Roofline", "node_bytes", "node_flops"]

# elementwise ops whose one result costs several FLOPs (a polynomial or a division)
_TRANSCENDENTAL = frozenset({Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.SIN, Op.COS, Op.TANH,
                             Op.SIGMOID, Op.ERF, Op.GELU, Op.POW, Op.DIV, Op.RECIPROCAL})
_FREE = frozenset({Op.INPUT, Op.CONSTANT, Op.SCALAR})
PROBE_VERSION = 2  # of `kiln.cost.machine`'s probe: a new one invalidates kept rooflines


@dataclass(frozen=True)
class Roofline:
    """This machine's limits: FMA peak (FLOP/s, all threads), copy bandwidth (bytes/s, read
    plus write), the fixed cost of one library call (s), and the fraction of peak a library
    GEMM or convolution reaches."""

    peak_flops: float = 234e9
    bandwidth: float = 40e9
    call_s: float = 4e-6
    contraction_efficiency: float = 0.7
    threads: int = 2
    measured: bool = False  # False: the defaults above (a Zen 4 pair of cores), not this machine

    @staticmethod
    def of_machine(options: Options) -> Roofline:
        """Measured on this machine once, then read from ``<kernel cache>/roofline.json``."""
        from kiln.codegen.build import cache_dir  # the cache folder, not code generation

        threads = torch.get_num_threads()
        path = cache_dir(options) / "roofline.json"
        # the probe's version too: version 1 read a twelfth of the peak on AVX2 machines
        key = (f"{platform.machine()}|{platform.processor()}|{os.cpu_count()}|{threads}"
               f"|probe{PROBE_VERSION}")
        cached = _read(path, key)
        if cached is not None:
            return cached
        roof = _measure(options, threads)
        _write(path, key, roof)
        return roof

    def seconds(self, flops: float, nbytes: float, contraction: bool) -> float:
        rate = self.peak_flops * (self.contraction_efficiency if contraction else 1.0)
        return self.call_s + max(flops / rate, nbytes / self.bandwidth)


def _measure(options: Options, threads: int) -> Roofline:
    from kiln.cost.machine import fma_probe  # builds a C kernel: only when measuring

    probe = fma_probe(options)
    peak = probe.gflops(threads) * 1e9 if probe is not None else _matmul_rate()
    src = torch.empty(16 << 20)  # 64 MiB: far beyond the caches
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    bandwidth = 2 * src.nbytes / best
    a, b = torch.ones(8), torch.ones(8)
    torch.add(a, b)
    calls = 2000
    start = time.perf_counter()
    for _ in range(calls):
        torch.add(a, b)
    call_s = (time.perf_counter() - start) / calls
    return Roofline(peak, bandwidth, call_s, threads=threads, measured=True)


def _matmul_rate() -> float:
    """Without a C compiler: the library's own GEMM rate stands in for the peak."""
    a = torch.randn(512, 512)
    torch.mm(a, a)
    start = time.perf_counter()
    for _ in range(10):
        torch.mm(a, a)
    return 10 * 2 * 512**3 / (time.perf_counter() - start) / Roofline().contraction_efficiency


def _read(path: Path, key: str) -> Roofline | None:
    try:
        data = json.loads(path.read_text())
        return Roofline(**data[key]) if key in data else None
    except (OSError, ValueError, TypeError):
        return None  # a missing or unreadable cache only costs one measurement


def _write(path: Path, key: str, roof: Roofline) -> None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = asdict(roof)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)


def node_flops(node: Node) -> float:
    """Floating-point operations of one call of ``node`` (multiply and add count as two)."""
    op = node.op
    out = node.types[0] if node.types else TensorType((), DType.F32)
    if op in (Op.MM, Op.BMM):
        return 2.0 * out.numel * _inner(node.inputs[0].type)
    if op in (Op.ADDMM, Op.ADDMM_ACT):  # the product, the bias, the activation
        epilogue = 2 if op is Op.ADDMM_ACT else 1
        return (2.0 * _inner(node.inputs[1].type) + epilogue) * out.numel
    if op in (Op.CONVOLUTION, Op.CONV_ACT):
        x, w = node.inputs[0].type, node.inputs[1].type
        window = math.prod(w.shape[2:])
        groups = node.attrs.groups  # type: ignore[attr-defined]
        if op is Op.CONVOLUTION and node.attrs.transposed:  # type: ignore[attr-defined]
            return 2.0 * x.numel * (w.shape[1] if len(w.shape) > 1 else 1) * window
        per_output = (x.shape[1] // max(groups, 1) if len(x.shape) > 1 else 1) * window
        return 2.0 * out.numel * per_output + (2 * out.numel if op is Op.CONV_ACT else 0)
    if op.is_a(OpGroup.ELEMENTWISE):
        return out.numel * (8.0 if op in _TRANSCENDENTAL else 1.0)
    if op.is_a(OpGroup.REDUCTION | OpGroup.POOLING):
        return float(max((v.type.numel for v in node.inputs), default=0))
    if op.is_a(OpGroup.NORMALIZATION):
        return 8.0 * node.inputs[0].type.numel
    return 0.0


def node_bytes(node: Node) -> float:
    """Bytes one call of ``node`` reads and writes; views move none."""
    if node.op.is_a(OpGroup.VIEW) or node.op in _FREE:
        return 0.0
    read = sum(v.type.nbytes for v in _distinct(node.inputs) if v.node.op is not Op.SCALAR)
    return float(read + sum(t.nbytes for t in node.types))


def _inner(a: TensorType) -> int:
    return a.shape[-1] if a.shape else 1


def _distinct(values: Iterable) -> list:
    return list(dict.fromkeys(values))


@dataclass
class AnalyticCost:
    """Seconds per call of nodes and graphs, from the roofline; cached per node signature."""

    roof: Roofline = field(default_factory=Roofline)
    _cache: dict[tuple, float] = field(default_factory=dict, repr=False)
    name: str = "analytic"

    def node_seconds(self, node: Node) -> float:
        if node.op in _FREE:
            return 0.0
        key = signature(node)
        found = self._cache.get(key)
        if found is None:
            if node.op.is_a(OpGroup.VIEW):
                found = self.roof.call_s / 4  # metadata only: a cheap call
            else:
                found = self.roof.seconds(node_flops(node), node_bytes(node),
                                          node.op.is_a(OpGroup.CONTRACTION))
            self._cache[key] = found
        return found


def narrow_groups(node: Node) -> bool:
    """A grouped (not depthwise) convolution whose groups are at most 16 channels wide: the
    roofline rates it at the FMA rate, which it does not reach when its groups leave vector
    lanes idle (ResNeXt-50's 4-channel groups ran at 20 GFLOP/s here, a dense convolution at
    150), so a cost model that can should time it."""
    if node.op not in (Op.CONVOLUTION, Op.CONV_ACT) or node.attrs.groups < 2:  # type: ignore[attr-defined]
        return False
    width = node.inputs[1].type.shape[1] if len(node.inputs[1].type.shape) > 1 else 0
    return 1 < width <= 16


def signature(node: Node) -> tuple:
    """What a node's cost depends on: op, attributes, operand and result types."""
    return (node.op, node.attrs, tuple(v.type for v in node.inputs), node.types)
