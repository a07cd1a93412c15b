"""Generated GEMMs (``Options.generated_gemm``): used for an ``mm``/``addmm`` node only where
it measures faster than the library call, on this machine, at the node's shapes.

Each distinct (op, M, N, K) is built once (`kiln.codegen.gemm.gemm_kernel`: the matmul
lowering scheduled into packed panels and 14x32 register tiles), checked against the library
on random inputs with the real weights, then timed against it in interleaved rounds; it
replaces the library call when its median time is below `MARGIN` times the library's. The
kernel's trace is its schedule (replayable Python) followed by the measurement, so
``kiln explain MODEL --kernels`` shows how it was built and why it is used. Measured on the
2-core Zen machine: GPT-2's LM head (128x768 @ 768x50257) 1.7x faster than ATen's addmm; the
768-wide layers are a tie.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from kiln.codegen.build import CompileError, CompilerUnavailable
from kiln.codegen.gemm import default_gemm_config, gemm_kernel
from kiln.codegen.kernel import compile_kernel
from kiln.ir.graph import Graph
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.passes.partition import KernelGroup
from kiln.runtime.kernels import (
    GroupKernel,
    KernelBuild,
    agrees_with_library,
    random_operands,
    serial,
)

__all__ = ["MARGIN", "build_gemm_kernels"]

MARGIN = 0.9  # the generated GEMM must take at most 90% of the library call's time
SERIAL_MACS = 64**3  # smaller GEMMs run on one thread (see kernels.GRAIN)
ROUNDS = 5
MIN_SAMPLE_S = 2e-3


def build_gemm_kernels(graph: Graph, groups: Sequence[KernelGroup],
                       options: Options) -> KernelBuild:
    """A generated GEMM for each of ``groups`` (from `kiln.passes.partition.gemms`) where one
    measures faster than the library; the reasons elsewhere."""
    result = KernelBuild()
    decided: dict[tuple[Op, int, int, int], str] = {}  # "used: ..." or why not
    for group in groups:
        node = group.last
        bias, a, b = node.inputs if node.op is Op.ADDMM else (None, *node.inputs)
        (m, k), n = a.type.shape, b.type.shape[1]
        config = default_gemm_config(m, n, k)
        weights = {}
        if b.node.op is Op.CONSTANT and _transposed(graph.constant(b.node)):
            weights[b] = graph.constant(b.node).t()  # [N, K], contiguous: read in place
        try:
            func, schedule = gemm_kernel(m, n, k, config, b_transposed=bool(weights),
                                         bias=bias is not None, name=f"kiln_gemm_{m}x{n}x{k}")
            if m * n * k < SERIAL_MACS:
                func = serial(func)
            kernel = compile_kernel(func, options)
        except CompileError:
            result.skipped.append((group, "the C compiler rejected the GEMM"))
            continue
        except Exception as err:  # noqa: BLE001 - a bug here must cost speed, not the model
            if options.strict:
                raise
            result.skipped.append((group, f"internal error: {type(err).__name__}: {err}"))
            continue
        if isinstance(kernel, CompilerUnavailable):
            result.skipped += [(g, f"no C compiler: {kernel.reason}") for g in groups]
            result.kernels = []
            return result
        inputs = (a, b) if bias is None else (a, b, bias)
        call = (f"gemm_kernel({m}, {n}, {k}, {config}, b_transposed={bool(weights)}, "
                f"bias={bias is not None}){' on one thread' if m * n * k < SERIAL_MACS else ''}")
        trace = (f"# kiln.codegen.gemm.{call}: this schedule of matmul_func, then "
                 f"lower_gemm\n{schedule.as_python()}")
        gk = GroupKernel(group, kernel, inputs, (node.out(),), "gemm", trace.rstrip("\n"),
                         weights)
        key = (node.op, m, n, k)
        if key not in decided:
            decided[key] = _decide(graph, gk)
        verdict = decided[key]
        if verdict.startswith("used"):
            trace = f"{gk.trace}\n# {verdict}"
            result.kernels.append(GroupKernel(group, kernel, inputs, gk.outputs, "gemm", trace,
                                              weights))
        else:
            result.skipped.append((group, verdict))
    return result


def _decide(graph: Graph, gk: GroupKernel) -> str:
    """'used: ...' when the kernel agrees with the library and measures faster; else why not."""
    if not agrees_with_library(graph, gk):
        return "disagreed with the library on random data"
    env = random_operands(graph, gk.group)
    node = gk.group.last
    operands = [env[v] for v in node.inputs]
    out = torch.empty(node.type.shape)
    mine = [gk.weight(graph, v) if v.node.op is Op.CONSTANT else env[v] for v in gk.inputs]
    pointers = [t.data_ptr() for t in mine] + [out.data_ptr()]
    run = gk.kernel.run_unchecked

    def library() -> object:
        return evaluate_node(node, operands, graph)

    def generated() -> None:
        run(*pointers)

    with torch.no_grad():
        lib, gen = _interleaved(library, generated)
    verdict = "used" if gen < MARGIN * lib else "not used"
    return f"{verdict}: measured library {lib * 1e3:.3f} ms, generated {gen * 1e3:.3f} ms"


def _transposed(w: torch.Tensor) -> bool:
    """Whether ``w`` is a transposed view of a contiguous matrix (a Linear weight's .t())."""
    return w.dim() == 2 and not w.is_contiguous() and w.t().is_contiguous()


def _interleaved(*fns: Callable[[], object]) -> list[float]:
    """Median seconds per call of each function, sampled in interleaved rounds."""
    batches = [_batch(fn) for fn in fns]
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(ROUNDS):
        for fn, n, out in zip(fns, batches, samples):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - start) / n)
    return [statistics.median(s) for s in samples]


def _batch(fn: Callable[[], object]) -> int:
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start >= MIN_SAMPLE_S:
            return n
        n *= 2
