"""Operator benchmarks: kiln's generated C kernels side by side with PyTorch and numpy.

    python benchmarks/ops.py [--quick] [--json out.json] [--threads 2]

Prints, in one process, with contenders interleaved sample by sample and medians reported:

* machine references: copy bandwidth (torch, numpy and a generated C copy loop) on a buffer
  far larger than the caches, and the peak FMA rate (a generated C kernel with independent
  AVX-512 FMA chains on every thread);
* fp32 GEMM at 256..2048 and a Linear layer's 512x768x3072 (B = weight.T): kiln's GEMM (the
  matmul lowering scheduled into packed panels and a register-tiled micro-kernel) against
  torch.mm and numpy's BLAS, in GFLOP/s and as a fraction of the machine peak;
* Linear layers at transformer sizes (M in 1..512, (K, N) from BERT/GPT-2/ViT/Llama-style
  layers): kiln's generated GEMM on prepacked weights against F.linear, oneDNN on reordered
  weights and ONNX Runtime's MLAS Gemm (optional peer, ``pip install -e '.[peers]'``);
* memory-bound fused kernels at BERT-base sizes (softmax, layernorm, bias+gelu, add+relu;
  RMSNorm at Llama's width):
  GB/s (compulsory bytes: inputs read once, output written once), fraction of the measured
  copy bandwidth, element rate, and time against eager PyTorch's unfused op sequence, the
  fused ATen op where there is one, and torch.compile (Inductor) where it works.

Timings are noisy on a shared machine: each sample is a batch of calls long enough to be
measured (>= ~2 ms), the spread (interquartile range / median) is printed next to each median.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from kiln.codegen.build import CompilerUnavailable, build
from kiln.codegen.isa import target_isa
from kiln.codegen.kernel import compile_kernel
from kiln.cost.machine import fma_probe, full_rate_512
from kiln.kernels import rows_schedule as fused
from kiln.kernels.gemm_schedule import GemmConfig, default_gemm_config, gemm_func
from kiln.options import Options

Fn = Callable[[], object]


@dataclass
class Timing:
    median_s: float
    spread: float  # interquartile range / median
    min_s: float


def measure(contenders: dict[str, Fn], min_sample_s: float = 2e-3, samples: int = 15,
            settle_s: float = 0.0) -> dict[str, Timing]:
    """Median time per call of each contender; samples of all contenders are interleaved.

    ``settle_s`` is a pause, then one untimed call, before each sample: thread pools spin for
    a while after a call (libgomp, used by torch and kiln, for several ms; OpenBLAS, used by
    numpy, for 2^28 cycles, ~80 ms), and one library's spinning pool steals the cores from
    the next contender's pool. Measured at 1024^3: numpy right after torch.mm or kiln 115 GFLOP/s,
    alone 187; at 2048^3 kiln right after numpy 105, alone 192. The untimed call wakes the
    contender's own pool and clocks after the pause.
    """
    inner = {}
    for name, fn in contenders.items():
        fn()  # warm up (first-call allocation, compilation, page faults)
        n, elapsed = 1, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = time.perf_counter() - t0
            if elapsed >= min_sample_s or n >= 1 << 16:
                break
            n *= 2
        inner[name] = n
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(samples):
        for name, fn in contenders.items():
            n = inner[name]
            if settle_s:  # let other pools stop spinning, then wake this one (untimed)
                time.sleep(settle_s)
                fn()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n)
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        med = statistics.median(ts)
        out[name] = Timing(med, (q[2] - q[0]) / med, min(ts))
    return out


@dataclass
class Row:
    section: str
    case: str
    contender: str
    median_us: float
    spread: float
    metrics: dict[str, float] = field(default_factory=dict)
    min_us: float = 0.0


# --- machine references ------------------------------------------------------------------------

COPY_C = """
#include <stdint.h>
void kiln_copy(const float* restrict src, float* restrict dst, int64_t n) {
  #pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}
"""



def layer_args(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of the per-layer benchmarks (depthwise.py, pointwise.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--settle", type=float, default=0.02,
                        help="seconds of pause before each sample (default 0.02)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def layer_row(label: str, flops: float, err: float, timings: dict[str, Timing]) -> dict:
    """One layer's medians (us), GFLOP/s and spreads per contender, for `layer_table`."""
    row: dict = {"layer": label, "max_abs_err": err}
    for name, t in timings.items():
        row[f"{name}_us"] = t.median_s * 1e6
        row[f"{name}_gflops"] = flops / t.median_s / 1e9
        row[f"{name}_spread"] = t.spread
    return row


def layer_table(rows: list[dict], title: str, width: int = 16) -> list[float]:
    """Print the layers' medians per contender and the best library contender's time over
    kiln's (column ``kiln``); returns those ratios, in row order."""
    names = [k[:-3] for k in rows[0] if k.endswith("_us")]
    print(f"{title}, batch 1, {torch.get_num_threads()} threads; median us (GFLOP/s)")
    print(f"{'layer':<{width}}" + "".join(f"{n:>22}" for n in names) + f"{'best lib/kiln':>15}")
    ratios = []
    for row in rows:
        cells = "".join(f"{row[n + '_us']:>12.1f} ({row[n + '_gflops']:5.1f})" for n in names)
        ratios.append(min(row[n + "_us"] for n in names if n != "kiln") / row["kiln_us"])
        print(f"{row['layer']:<{width}}{cells}{ratios[-1]:>14.2f}x")
    total = {n: sum(r[n + "_us"] for r in rows) for n in names}
    print(f"{'sum':<{width}}" + "".join(f"{total[n]:>12.1f}        " for n in names))
    return ratios


def _row(section: str, case: str, contender: str, t: Timing, metrics: dict[str, float]) -> Row:
    return Row(section, case, contender, t.median_s * 1e6, t.spread, metrics, t.min_s * 1e6)


def machine(options: Options, quick: bool) -> tuple[list[Row], float, float]:
    """Copy bandwidth (GB/s, bytes read + written) and peak GFLOP/s."""
    import ctypes

    rows = []
    n = (16 if quick else 64) * 1024 * 1024  # floats: 64 or 256 MiB per buffer
    src = torch.rand(n)
    dst = torch.empty(n)
    src_np, dst_np = src.numpy(), dst.numpy()
    contenders: dict[str, Fn] = {
        "torch copy_": lambda: dst.copy_(src),
        "numpy copyto": lambda: np.copyto(dst_np, src_np),
    }
    lib = build(COPY_C, "copy", options)
    if not isinstance(lib, CompilerUnavailable):
        copy = lib.function("kiln_copy")
        copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        contenders["C copy (omp)"] = lambda: copy(src.data_ptr(), dst.data_ptr(), n)
    best_bw = 0.0
    for name, t in measure(contenders, samples=7 if quick else 11).items():
        bw = 2 * n * 4 / t.median_s / 1e9
        best_bw = max(best_bw, bw)
        rows.append(_row("machine", f"copy {n * 4 >> 20} MiB", name, t, {"GB/s": bw}))
    peak = 0.0
    probe = fma_probe(options)
    if probe is not None:
        iters = 20_000_000 if not quick else 5_000_000
        threads = probe.threads
        timings = measure({"1 thread": lambda: probe.run(iters, 1),
                           f"{threads} threads": lambda: probe.run(iters, threads)}, samples=5)
        rates = {}
        for name, t in timings.items():
            used = 1 if name == "1 thread" else threads
            rates[name] = used * probe.flops_per_iter * iters / t.median_s / 1e9
            rows.append(_row("machine", f"FMA chains, {name}", "C AVX-512 FMA chains", t,
                             {"GFLOP/s": rates[name]}))
        # the nominal peak: every core at the single-thread rate (a shared machine's second
        # core is often busy, which the all-threads run then shows)
        peak = max(rates["1 thread"] * threads, rates[f"{threads} threads"])
    return rows, best_bw, peak


# --- GEMM --------------------------------------------------------------------------------------


def gemm(options: Options, quick: bool, peak: float) -> list[Row]:
    """Square GEMMs, then a Linear layer's (M x K) @ (N x K).T as nn.Linear stores it."""
    rows = []
    shapes = [(n, n, n, False) for n in ((256, 512, 1024) if quick else (256, 512, 1024, 2048))]
    shapes.append((512, 768, 3072, True))
    for m, n, k, transposed in shapes:
        a = torch.randn(m, k)
        b = torch.randn(n, k) if transposed else torch.randn(k, n)
        b_mat = b.t() if transposed else b  # [K, N], a view of the weight when transposed
        c_torch, c_kiln = torch.empty(m, n), torch.empty(m, n)
        a_np, b_np, c_np = a.numpy(), b_mat.numpy(), np.empty((m, n), np.float32)
        contenders: dict[str, Fn] = {
            "torch.mm": lambda a=a, b=b_mat, c=c_torch: torch.mm(a, b, out=c),
            "numpy matmul": lambda a=a_np, b=b_np, c=c_np: np.matmul(a, b, out=c),
        }
        # (the schedule kiln's compiler gives an mm whose B comes at run time: packed each call)
        cfg = default_gemm_config(m, n, k, torch.get_num_threads(),
                                  base=GemmConfig.for_isa(target_isa(options)),
                                  full_rate_512=full_rate_512(options))
        kernel = compile_kernel(gemm_func(m, n, k, cfg, b_transposed=transposed), options)
        if not isinstance(kernel, CompilerUnavailable):
            kernel(a, b, c_kiln)
            torch.testing.assert_close(c_kiln, a @ b_mat, rtol=1e-4, atol=1e-3 * k ** 0.5)
            ptrs = (a.data_ptr(), b.data_ptr(), c_kiln.data_ptr())
            contenders["kiln"] = lambda k=kernel, p=ptrs: k.run_unchecked(*p)
        timings = measure(contenders, samples=7 if m * n * k >= 2048 ** 3 else 11,
                          settle_s=0.1)
        flops = 2 * m * n * k
        best_lib = max(flops / timings[x].median_s for x in ("torch.mm", "numpy matmul"))
        case = f"{m}x{n}x{k}" + (" B=W.T" if transposed else "")
        for name, t in timings.items():
            rate = flops / t.median_s
            metrics = {"GFLOP/s": rate / 1e9, "vs best library": rate / best_lib}
            if peak:
                metrics["of peak"] = rate / 1e9 / peak
            rows.append(_row("gemm", case, name, t, metrics))
    return rows


# --- Linear layers against the peers ---------------------------------------------------------

LINEAR_SHAPES = [(k, n) for k, n in ((768, 3072), (3072, 768), (768, 768), (512, 1376),
                                     (1376, 512))]
LINEAR_M = (1, 32, 128, 197, 512)


def linear(options: Options, quick: bool, peak: float, threads: int) -> list[Row]:
    """nn.Linear (x @ W.T + b) at transformer sizes: torch's F.linear, kiln's generated GEMM on
    W packed at compile time (the tile kiln's compiler picks for this machine and M), oneDNN
    on W reordered once (kiln's library variant) and ONNX Runtime's Gemm on a constant W
    (MLAS, prepacked) when onnxruntime is installed."""
    from kiln.kernels.gemm_schedule import pack_b

    rows = []
    base = GemmConfig.for_isa(target_isa(options))
    ms = (1, 128) if quick else LINEAR_M
    shapes = LINEAR_SHAPES[:2] if quick else LINEAR_SHAPES
    for m in ms:
        for k, n in shapes:
            x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
            out = torch.empty(m, n)
            contenders: dict[str, Fn] = {"torch F.linear": lambda x=x, w=w, b=b: F.linear(x, w, b)}
            cfg = default_gemm_config(m, n, k, threads=threads, base=base, b_prepacked=True,
                                      full_rate_512=full_rate_512(options))
            kernel = compile_kernel(gemm_func(m, n, k, cfg, bias=True, b_prepacked=True), options)
            if not isinstance(kernel, CompilerUnavailable):
                packed = pack_b(w.t(), cfg.nr)
                ptrs = (x.data_ptr(), packed.data_ptr(), b.data_ptr(), out.data_ptr())
                kernel.run_unchecked(*ptrs)
                torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-4, atol=1e-3)
                contenders["kiln generated"] = (
                    lambda k=kernel, p=ptrs, keep=packed: k.run_unchecked(*p))
            if torch.backends.mkldnn.is_available():
                reordered = torch.ops.mkldnn._reorder_linear_weight(w, m)
                contenders["oneDNN prepacked"] = (
                    lambda x=x, r=reordered, b=b, keep=w: torch.ops.mkldnn._linear_pointwise(
                        x, r, b, "none", [], ""))
            session = _ort_gemm(w, b, m, threads)
            if session is not None:
                feed = {"x": x.numpy()}
                contenders["ORT (MLAS)"] = lambda s=session, f=feed: s.run(None, f)
            timings = measure(contenders, samples=7 if quick else 11, settle_s=0.05)
            flops = 2 * m * n * k
            case = f"{m}x{k}x{n}"
            for name, t in timings.items():
                rate = flops / t.median_s
                metrics = {"GFLOP/s": rate / 1e9,
                           "vs torch": timings["torch F.linear"].median_s / t.median_s}
                if peak:
                    metrics["of peak"] = rate / 1e9 / peak
                rows.append(_row("linear", case, name, t, metrics))
    return rows


def _ort_gemm(w: torch.Tensor, b: torch.Tensor, m: int, threads: int) -> object | None:
    """An ONNX Runtime session computing x @ w.T + b with w and b as initializers."""
    try:
        import onnxruntime
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    n, k = w.shape
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w.numpy(), "w"), numpy_helper.from_array(b.numpy(), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # opset 17's own; a newer onnx writes one an older onnxruntime refuses
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(model.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])


# --- fused memory-bound kernels ----------------------------------------------------------------


@dataclass
class FusedCase:
    name: str
    kernel: Callable[[], object]  # -> an object with .func, the PrimFunc to compile
    inputs: list[torch.Tensor]
    unfused: Callable[..., torch.Tensor]
    aten: Callable[..., torch.Tensor] | None
    nbytes: int
    elements: int


def fused_cases(quick: bool) -> list[FusedCase]:
    cases = []
    for heads, seq in ((12, 128),) if quick else ((12, 128), (12, 512)):
        x = torch.randn(heads, seq, seq)
        cases.append(FusedCase(
            f"softmax {heads}x{seq}x{seq}", lambda h=heads, s=seq: fused.softmax_rows(h * s, s),
            [x], _softmax_unfused, lambda t: torch.softmax(t, -1), 2 * x.numel() * 4,
            x.numel()))
    for heads, seq in ((12, 128),) if quick else ((12, 128), (12, 512)):
        x = torch.randn(heads, seq, seq)
        mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq)
        cases.append(FusedCase(
            f"masked softmax {heads}x{seq}", lambda h=heads, s=seq: _masked_softmax(h, s),
            [x, mask], _masked_softmax_unfused, None, (2 * x.numel() + mask.numel()) * 4,
            x.numel()))
    for tokens in (128,) if quick else (128, 512):
        x, w, b = torch.randn(tokens, 768), torch.randn(768), torch.randn(768)
        cases.append(FusedCase(
            f"layernorm {tokens}x768", lambda t=tokens: fused.layernorm_rows(t, 768),
            [x, w, b], _layernorm_unfused, lambda t, w, b: F.layer_norm(t, (768,), w, b),
            (2 * x.numel() + 2 * 768) * 4, x.numel()))
        r, g = torch.randn(tokens, 4096), torch.randn(4096)
        cases.append(FusedCase(
            f"rmsnorm {tokens}x4096", lambda t=tokens: fused.rmsnorm_rows(t, 4096, 1e-6),
            [r, g], _rmsnorm_unfused, lambda t, g: F.rms_norm(t, (4096,), g, 1e-6),
            (2 * r.numel() + 4096) * 4, r.numel()))
        h, bias = torch.randn(tokens, 3072), torch.randn(3072)
        cases.append(FusedCase(
            f"bias+gelu {tokens}x3072", lambda t=tokens: fused.bias_gelu(t, 3072),
            [h, bias], lambda t, b: F.gelu(t + b), None, (2 * h.numel() + 3072) * 4, h.numel()))
        y = torch.randn(tokens, 768)
        cases.append(FusedCase(
            f"add+relu {tokens}x768", lambda t=tokens: fused.add_relu(t, 768),
            [x, y], lambda a, b: torch.relu(a + b), None, 3 * x.numel() * 4, x.numel()))
    return cases


def _masked_softmax_unfused(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GPT-2's attention probabilities: scale, causal mask, softmax."""
    return torch.softmax(torch.where(mask, x * 0.125, -math.inf), -1)


def _masked_softmax(heads: int, seq: int) -> object:
    """The row kernel kiln builds for GPT-2's scale + where + softmax group."""
    from kiln.ir import parse_graph
    from kiln.kernels.build import build_group_kernel
    from kiln.kernels.outcome import Skipped
    from kiln.passes.partition import partition

    t = f"f32[1, {heads}, {seq}, {seq}]"
    text = f"""graph(%x: {t}) {{
  %mask = constant {{name='mask'}} : bool[1, 1, {seq}, {seq}]
  %neg = constant {{name='neg'}} : f32[]
  %c = scalar {{value=0.125}} : f64[]
  %q = mul(%x, %c) : {t}
  %m = where(%mask, %q, %neg) : {t}
  %p = softmax(%m) {{dim=3}} : {t}
  return %p
}}"""
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq)
    graph = parse_graph(text, {"mask": mask, "neg": torch.tensor(-math.inf)})
    (group,) = partition(graph)
    built = build_group_kernel(graph, group, Options.from_env())
    assert not isinstance(built, Skipped), built
    assert [v.node.op.name for v in built.inputs] == ["INPUT", "CONSTANT"], built.inputs
    return built.kernel


def _softmax_unfused(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _layernorm_unfused(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    d = x - mean
    var = (d * d).mean(-1, keepdim=True)
    return d * torch.rsqrt(var + 1e-5) * w + b


def _rmsnorm_unfused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm as the model writes it (one row kernel in kiln: `kiln.passes.rms_norm`)."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _inductor(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor]) -> Fn | str:
    """A torch.compile'd ``fn`` bound to ``inputs``, or the reason it is unavailable."""
    try:
        compiled = torch.compile(fn, backend="inductor", dynamic=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(*inputs)
        return lambda: compiled(*inputs)
    except Exception as exc:  # any failure means "not available here"; report why
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"


def fused_kernels(options: Options, quick: bool, copy_bw: float, inductor: bool,
                  notes: list[str]) -> list[Row]:
    rows = []
    for case in fused_cases(quick):
        func = case.kernel().func
        kernel = compile_kernel(func, options)
        expected = case.unfused(*case.inputs)
        contenders: dict[str, Fn] = {
            "eager unfused": lambda c=case: c.unfused(*c.inputs),
        }
        if case.aten is not None:
            contenders["eager ATen op"] = lambda c=case: c.aten(*c.inputs)
        if inductor:
            compiled = _inductor(case.unfused, case.inputs)
            if isinstance(compiled, str):
                notes.append(f"{case.name}: inductor unavailable ({compiled})")
            else:
                contenders["inductor"] = compiled
        if not isinstance(kernel, CompilerUnavailable):
            out = torch.empty_like(expected)
            shaped = [(t.view(torch.uint8) if t.dtype == torch.bool else t).reshape(b.shape)
                      for t, b in zip(case.inputs, func.inputs)]  # (kiln reads bools as bytes)
            kernel(*shaped, out.reshape(func.outputs[0].shape))
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
            ptrs = [t.data_ptr() for t in shaped] + [out.data_ptr()]
            contenders["kiln"] = lambda k=kernel, p=ptrs: k.run_unchecked(*p)
        timings = measure(contenders)
        eager = timings["eager unfused"].median_s
        for name, t in timings.items():
            bw = case.nbytes / t.median_s / 1e9
            rows.append(_row("fused", case.name, name, t, {
                "GB/s": bw, "of copy BW": bw / copy_bw if copy_bw else 0.0,
                "Gelem/s": case.elements / t.median_s / 1e9,
                "speedup vs eager unfused": eager / t.median_s}))
    return rows


# --- output ------------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            print(f"\n== {section} ==")
            print(f"{'case':<24}{'contender':<22}{'median':>11}{'spread':>7}{'min':>11}  "
                  f"metrics (from the median)")
        metrics = "  ".join(f"{k} {_fmt(v)}" for k, v in row.metrics.items())
        print(f"{row.case:<24}{row.contender:<22}{row.median_us:>9.1f}us"
              f"{row.spread * 100:>6.0f}%{row.min_us:>9.1f}us  {metrics}")


def _fmt(value: float) -> str:
    if value < 10:
        return f"{value:.2f}" if value >= 0.01 else f"{value:.3g}"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    parser.add_argument("--only", choices=("machine", "gemm", "linear", "fused"),
                        action="append")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    options = Options.from_env()
    only = set(args.only or ("machine", "gemm", "linear", "fused"))
    notes: list[str] = []
    cache = options.kernel_cache_dir or "~/.cache/kiln/kernels"
    load_before = os.getloadavg()[0]
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), numpy "
          f"{np.__version__}, {os.cpu_count()} cores, load average {load_before:.2f}; "
          f"kernel cache {cache}", flush=True)
    rows, copy_bw, peak = machine(options, args.quick)
    if "gemm" in only:
        rows += gemm(options, args.quick, peak)
    if "linear" in only:
        rows += linear(options, args.quick, peak, args.threads)
    if "fused" in only:
        rows += fused_kernels(options, args.quick, copy_bw, not args.no_inductor, notes)
    print_table(rows)
    print(f"\ncopy bandwidth (best of the copy contenders): {copy_bw:.1f} GB/s; "
          f"peak FMA: {peak:.0f} GFLOP/s")
    load_after = os.getloadavg()[0]
    print(f"load average before/after: {load_before:.2f}/{load_after:.2f} "
          f"(above ~0.5 on this machine means other work shared the cores)")
    for note in notes:
        print("note:", note)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_GBps": copy_bw, "peak_GFLOPs": peak, "notes": notes,
                       "load_average": [load_before, load_after],
                       "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
