"""Benchmark runner: eager PyTorch, kiln and peers side by side, in one process.

    results = run_bench(["mlp"], quick=True, peers=["inductor"])
    json.dumps([r.to_dict() for r in results])   # kiln.cli.markdown_table(results) for people

Contenders run interleaved in rounds (eager, kiln-O2, inductor, eager, kiln-O2, ...), so machine
noise hits all of them alike. In each round a contender runs one block: a pause for the
previous contender's idle threads to stop spinning, one untimed call, then calls for at
least ``TimingConfig.block_s``; latency is the median over blocks of the mean call time in
a block, and speedup is eager median / contender median. Nothing here prints: progress goes
to a callback.

Why blocks and the pause: with one call per sample, ORT's pool (and an OpenMP team) still
spun through the next contender's timed call. On the MLP, each backend ran about twice as
slow as alone (kiln 7.8 ms against 3.9-4.2; ORT 7.6 against 4.3-4.5); with 0.1 s blocks
after a 20 ms pause, each ran as alone (eager 6.6, kiln 4.0, ORT 4.3).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import torch

import kiln
from kiln import models
from kiln.cost.measure import Budget, interleaved
from kiln.report import CompileReport

EAGER = "eager"


@dataclass(frozen=True)
class TimingConfig:
    """How long to measure: at least ``min_rounds``, then until each contender has run
    ``target_s`` seconds, stopping at ``max_rounds`` or after ``cap_s`` seconds per model."""

    warmup: int = 3
    min_rounds: int = 5
    target_s: float = 1.5
    cap_s: float = 30.0
    max_rounds: int = 10_000
    block_s: float = 0.1  # a contender's timed calls in one round last at least this long
    quiet_s: float = 0.02  # the pause before each block (see the module docstring)

    @staticmethod
    def for_size(quick: bool) -> TimingConfig:
        return TimingConfig(1, 3, 0.1, 3.0, block_s=0.0, quiet_s=0.0) if quick \
            else TimingConfig()


@dataclass
class KilnStats:
    nodes_before: int
    nodes_after: int
    planned_peak_bytes: int
    intermediate_bytes: int
    engine_seconds: float  # time inside kiln's engine, capture excluded
    fallbacks: list[str] = field(default_factory=list)


@dataclass
class ContenderResult:
    name: str  # "eager", "kiln-O2", "inductor", "ort"
    median_ms: float | None = None
    min_ms: float | None = None
    runs: int = 0
    speedup: float | None = None  # eager median / this median
    max_abs_err: float | None = None  # against eager
    rel_err: float | None = None  # ||out - eager|| / ||eager||, all outputs together
    compile_s: float | None = None  # wall time to a runnable callable (first call included)
    note: str = ""  # why it was skipped, if it was
    error: str | None = None  # what failed, if something did
    kiln: KilnStats | None = None
    samples_ms: list[float] = field(default_factory=list)  # each round's block mean, in order

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ContenderResult:
        stats = data.get("kiln")
        fields = {**data, "kiln": KilnStats(**stats) if stats is not None else None}
        return ContenderResult(**fields)


@dataclass(frozen=True)
class Paired:
    """One contender's time over another's, compared within each round."""

    ratio: float  # the median over rounds of the two block means' ratio
    faster: int  # rounds in which the first was faster
    rounds: int

    def __str__(self) -> str:
        return f"{self.ratio:.3f} ({self.faster}/{self.rounds})"


@dataclass
class BenchResult:
    model: str
    quick: bool
    threads: int
    inputs: list[str] = field(default_factory=list)  # e.g. "float32[1, 3, 224, 224]"
    rounds: int = 0
    contenders: list[ContenderResult] = field(default_factory=list)
    error: str | None = None  # the model itself could not be built or run eagerly
    gflop: float | None = None  # one call's floating-point work (torch.utils.flop_counter)
    peak_gflops: float | None = None  # this machine's measured FMA peak (kiln.cost.machine)

    def gflops(self, contender: ContenderResult) -> float | None:
        """The contender's rate on this model's FLOPs, in GFLOP/s."""
        if self.gflop is None or not contender.median_ms:
            return None
        return self.gflop / (contender.median_ms / 1e3)

    def contender(self, name: str) -> ContenderResult | None:
        return next((c for c in self.contenders if c.name == name), None)

    def paired(self, name: str, other: str) -> Paired | None:
        """``name``'s time over ``other``'s, round by round: each round runs both within a
        few blocks of each other, so a slow phase of the machine (this one's swing 20% and
        more over minutes) meets both, where the ratio of the two medians takes it as it
        falls. None where either has no samples."""
        a, b = self.contender(name), self.contender(other)
        pairs = list(zip(a.samples_ms, b.samples_ms)) if a and b else []
        if not pairs:
            return None
        return Paired(median(x / y for x, y in pairs), sum(x < y for x, y in pairs), len(pairs))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> BenchResult:
        contenders = [ContenderResult.from_dict(c) for c in data.get("contenders", [])]
        return BenchResult(**{**data, "contenders": contenders})


@dataclass(frozen=True)
class Progress:
    """One step of the run; ``fraction`` is of the whole run, 0 to 1."""

    model: str
    index: int  # of the model, from 0
    count: int  # models in the run
    step: str  # "build", "compile kiln-O2", "timing", "done"
    fraction: float


ProgressFn = Callable[[Progress], None]


class PeerUnavailable(Exception):
    """The peer cannot run on this machine (not installed, no compiler); a note, not an error."""


# -- peers: name -> function that turns (model, inputs) into a callable --------------------------


def _inductor(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
    cpu = all(x.device.type == "cpu" for x in inputs)
    compilers = (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")
    if cpu and not any(shutil.which(c) for c in compilers):
        raise PeerUnavailable("no C++ compiler found (Inductor on CPU needs one)")
    compiled = torch.compile(model)
    compiled(*inputs)  # torch.compile is lazy: compile now, inside the caller's timer
    return compiled


def _ort(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
    try:
        import onnxruntime
    except ImportError:
        raise PeerUnavailable("not installed") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # same threads as the others
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        torch.onnx.export(model, inputs, path, verbose=False)  # its progress would hit stdout
        session = onnxruntime.InferenceSession(path, options,
                                               providers=["CPUExecutionProvider"])
    input_names = [i.name for i in session.get_inputs()]

    def run(*args: torch.Tensor) -> list[torch.Tensor]:
        feeds = {n: a.numpy() for n, a in zip(input_names, args, strict=True)}
        return [torch.from_numpy(o) for o in session.run(None, feeds)]

    return run


PEERS: dict[str, Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], Callable[..., Any]]] = {
    "inductor": _inductor,  # torch.compile, default backend
    "ort": _ort,  # onnxruntime on a torch.onnx.export of the model
}


# which kernels kiln may generate, per contender: the Options fields each mode turns on
KERNEL_MODES: dict[str, dict[str, bool]] = {
    "aten": {"generated_kernels": False, "prepacked_library": False},  # every op its ATen call
    "library": {"generated_kernels": False},  # library calls, oneDNN on prepacked weights
    # (the default) fused elementwise/row kernels and GEMMs in C, each where measured faster
    "generated": {"generated_kernels": True},
    "no-gemm": {"generated_kernels": True, "generated_gemm": False},  # row kernels only
}


DEFAULT_KERNELS = "generated"  # what kiln.Options() does; its contender is plain kiln-O<N>


def kiln_name(opt_level: int, kernels: str = DEFAULT_KERNELS, search: str = "greedy") -> str:
    return (f"kiln-O{opt_level}" + ("" if kernels == DEFAULT_KERNELS else f"-{kernels}")
            + ("" if search == "greedy" else f"-{search}"))


def is_kiln(contender: str) -> bool:
    return contender.startswith("kiln-O")


# -- the run ---------------------------------------------------------------------------------------


def run_bench(model_names: Sequence[str] | None = None, *, quick: bool = False,
              peers: Sequence[str] = (), opt_levels: Sequence[int] = (2,),
              kernels: Sequence[str] = (DEFAULT_KERNELS,), threads: int | None = None,
              seed: int = 0, timing: TimingConfig | None = None,
              progress: ProgressFn | None = None,
              searches: Sequence[str] = ("greedy",),
              tuning_db: str | None = None, pet: bool = False) -> list[BenchResult]:
    """Benchmark each model (all built-in ones by default); one failure never stops the run.
    ``tuning_db``: a kiln-O<N>-tuned row per level, compiled with that tuning database (the
    other kiln rows then use none). ``pet``: a kiln-O<N>-pet row per level, with the PET
    pass on."""
    names = list(model_names) if model_names is not None else models.names()
    timing = timing or TimingConfig.for_size(quick)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        results = []
        for index, name in enumerate(names):
            def report(step: str, done: float, index: int = index, name: str = name) -> None:
                if progress is not None:
                    progress(Progress(name, index, len(names), step, (index + done) / len(names)))

            results.append(bench_model(name, quick=quick, peers=peers, opt_levels=opt_levels,
                                       kernels=kernels, seed=seed, timing=timing,
                                       report=report, searches=searches,
                                       tuning_db=tuning_db, pet=pet))
        # the peak is probed with every model; the best reading is the machine's (a probe
        # while the core's other hardware thread is busy read 117 GFLOP/s against 234)
        peaks = [r.peak_gflops for r in results if r.peak_gflops]
        for r in results:
            r.peak_gflops = max(peaks) if peaks else None
        return results
    finally:
        torch.set_num_threads(old_threads)


@dataclass
class _Runner:
    result: ContenderResult
    fn: Callable[..., Any]
    times: list[float] = field(default_factory=list)


def bench_model(name: str, *, quick: bool = False, peers: Sequence[str] = (),
                opt_levels: Sequence[int] = (2,), kernels: Sequence[str] = (DEFAULT_KERNELS,),
                seed: int = 0, timing: TimingConfig | None = None,
                report: Callable[[str, float], None] | None = None,
                searches: Sequence[str] = ("greedy",),
                tuning_db: str | None = None, pet: bool = False) -> BenchResult:
    """Benchmark one model; errors land in the result instead of propagating."""
    timing = timing or TimingConfig.for_size(quick)
    step = report or (lambda _step, _done: None)
    result = BenchResult(name, quick, torch.get_num_threads())
    try:
        step("build", 0.0)
        model, inputs = models.build(name, quick=quick, seed=seed)
        result.inputs = [f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" for x in inputs]
        with torch.no_grad():
            reference = model(*inputs)
        result.gflop = _gflop(model, inputs)
        result.peak_gflops = _peak()
    except Exception as err:  # noqa: BLE001 - a broken model is a row, not a crash
        result.error = describe_error(err)
        step("done", 1.0)
        return result
    torch._dynamo.reset()  # a fresh Dynamo cache per model, so no recompile limits carry over
    runners = [_Runner(ContenderResult(EAGER), model)]
    untuned = None if tuning_db is None else ""
    candidates = [(kiln_name(level, mode, search),
                   _kiln_compiler(level, mode, search, untuned))
                  for level in opt_levels for mode in kernels for search in searches]
    if tuning_db is not None:
        candidates += [(f"{kiln_name(level)}-tuned",
                        _kiln_compiler(level, tuning_db=tuning_db)) for level in opt_levels]
    if pet:
        candidates += [(f"{kiln_name(level)}-pet", _kiln_compiler(level, tuning_db=untuned,
                                                                  pet=True))
                       for level in opt_levels]
    candidates += [(peer, PEERS.get(peer)) for peer in peers]
    for i, (contender, make) in enumerate(candidates):
        step(f"compile {contender}", 0.6 * i / len(candidates))
        if make is None:
            result.contenders.append(ContenderResult(
                contender, error=f"unknown peer; known peers: {', '.join(PEERS)}"))
            continue
        runner = _compile(contender, make, model, inputs)
        result.contenders.append(runner.result)
        if runner.result.error is None and not runner.result.note:
            runners.append(runner)
    step("timing", 0.6)
    result.contenders.insert(0, runners[0].result)
    for runner in runners:
        _warm_up(runner, inputs, reference, timing.warmup)
    live = [r for r in runners if r.result.error is None]
    result.rounds = _time_rounds(live, inputs, timing)
    _summarize(runners, result)
    step("done", 1.0)
    return result


def _kiln_compiler(level: int, kernels: str = DEFAULT_KERNELS, search: str = "greedy",
                   tuning_db: str | None = None, pet: bool = False) -> Callable[..., Any]:
    # the environment still picks the compiler and the kernel cache (CC, KILN_CACHE_DIR);
    # ``tuning_db``: this database ("" none), else KILN_TUNING_DB's
    options = dataclasses.replace(kiln.Options.from_env(), opt_level=level, search=search,
                                  pet=pet, **KERNEL_MODES[kernels])
    if tuning_db is not None:
        options = dataclasses.replace(options, tuning_db=tuning_db)

    def make(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
        return kiln.compile(model, inputs, options=options)

    return make


def _compile(name: str, make: Callable[..., Any], model: torch.nn.Module,
             inputs: tuple[torch.Tensor, ...]) -> _Runner:
    result = ContenderResult(name)
    fn: Callable[..., Any] = model
    start = time.perf_counter()
    try:
        with torch.no_grad():
            fn = make(model, inputs)
        result.compile_s = time.perf_counter() - start
    except PeerUnavailable as err:
        result.note = str(err)
    except Exception as err:  # noqa: BLE001 - one failing contender must not end the run
        result.error = f"compile failed: {describe_error(err)}"
    report = getattr(fn, "report", None)
    if isinstance(report, CompileReport):
        result.kiln = KilnStats(report.nodes_before, report.nodes_after,
                                report.planned_peak_bytes, report.intermediate_bytes,
                                report.compile_seconds, list(report.fallbacks))
    return _Runner(result, fn)


def _gflop(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> float | None:
    """FLOPs of one eager call, as torch.utils.flop_counter counts them (matmuls and
    convolutions: 2 per multiply-add), in GFLOP."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*inputs)
    except Exception:  # noqa: BLE001 - a model the counter cannot follow gets no rate
        return None
    return counter.get_total_flops() / 1e9


def _peak() -> float | None:
    """This machine's FMA peak on torch's thread count, as measured now (`run_bench` keeps
    the best reading of the run)."""
    from kiln.cost.machine import fma_probe

    probe = fma_probe(kiln.Options.from_env())
    if probe is None:
        return None
    return probe.gflops(torch.get_num_threads())


def _warm_up(runner: _Runner, inputs: tuple[torch.Tensor, ...], reference: Any,
             count: int) -> None:
    """Run ``count`` untimed calls; the first one's output is checked against eager."""
    try:
        with torch.no_grad():
            # compare before the next call: an output may share memory a later call reuses
            out = runner.fn(*inputs)
            runner.result.max_abs_err, runner.result.rel_err = compare(out, reference)
            del out
            for _ in range(count - 1):
                runner.fn(*inputs)
    except Exception as err:  # noqa: BLE001
        runner.result.error = f"run failed: {describe_error(err)}"


def _time_rounds(runners: list[_Runner], inputs: tuple[torch.Tensor, ...],
                 timing: TimingConfig) -> int:
    """Run every runner's block once per round (`kiln.cost.measure`) until the timing budget
    says stop; returns the number of rounds."""
    budget = Budget(min_rounds=timing.min_rounds, target_s=timing.target_s, cap_s=timing.cap_s,
                    max_rounds=timing.max_rounds, warmup=0,  # warmed up by _warm_up
                    settle_calls=1, min_sample_s=timing.block_s, quiet_s=timing.quiet_s)

    def call(fn: Callable[..., Any]) -> Callable[[], object]:
        return lambda: fn(*inputs)

    with torch.no_grad():
        timings = interleaved([call(r.fn) for r in runners], budget)
    for runner, t in zip(runners, timings):
        runner.times = t.samples
        if t.error is not None:
            runner.result.error = f"run failed: {describe_error(t.error)}"
    return max((len(t.samples) for t in timings), default=0)


def _summarize(runners: list[_Runner], result: BenchResult) -> None:
    for runner in runners:
        if runner.times and runner.result.error is None:
            runner.result.median_ms = median(runner.times) * 1e3
            runner.result.min_ms = min(runner.times) * 1e3
            runner.result.runs = len(runner.times)
            runner.result.samples_ms = [t * 1e3 for t in runner.times]
    eager = result.contenders[0].median_ms
    for contender in result.contenders:
        if eager is not None and contender.median_ms:
            contender.speedup = eager / contender.median_ms
    if result.contenders[0].error is not None:
        result.error = result.contenders[0].error


def compare(out: Any, reference: Any) -> tuple[float, float]:
    """(max abs error, relative L2 error) of ``out`` against ``reference``, all outputs together.

    Outputs are compared leaf by leaf after flattening, so a list from ORT matches a tensor
    or tuple from PyTorch.
    """
    got = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    want = [t for t in torch.utils._pytree.tree_leaves(reference) if isinstance(t, torch.Tensor)]
    if len(got) != len(want):
        raise ValueError(f"{len(got)} output tensor(s), eager gives {len(want)}")
    max_abs, diff_sq, ref_sq = 0.0, 0.0, 0.0
    for a, b in zip(got, want, strict=True):
        if a.shape != b.shape:
            raise ValueError(f"output shape {list(a.shape)}, eager gives {list(b.shape)}")
        diff = a.detach().double().cpu() - b.detach().double().cpu()
        if diff.numel():
            max_abs = max(max_abs, diff.abs().max().item())
        diff_sq += diff.square().sum().item()
        ref_sq += b.detach().double().square().sum().item()
    if diff_sq == 0.0:
        return max_abs, 0.0
    return max_abs, math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else math.inf


def describe_error(err: BaseException) -> str:
    """``Type: first line of the message``: enough for a table note, no traceback."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
