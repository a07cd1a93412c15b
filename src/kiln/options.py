"""The one Options object. Environment variables are read here and nowhere else."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SEARCH_STRATEGIES = ("greedy", "backtrack", "saturate")


@dataclass(frozen=True)
class Options:
    """How kiln compiles; pass it to `kiln.compile` or as ``torch.compile(options={...})``."""

    opt_level: int = 2  # 0: capture + cleanup only; higher levels add optimizations
    debug: bool = False  # verify the graph after every pass (slower compiles)
    memory_plan: bool = True  # run intermediates in statically planned, reused buffers
    fast_math: bool = False  # allow rewrites that hold for real numbers only
    strict: bool = False  # raise instead of falling back to eager when kiln cannot compile
    # at opt level 2 and up: elementwise/reduction chains (bias + activation, residual add +
    # layer norm, scale + mask + softmax) become generated C kernels, each checked against the
    # library calls before use; no C compiler means library calls and a one-time warning
    generated_kernels: bool = True
    # at opt level 2 and up: GEMMs (Linear layers) may run kiln's generated GEMM on weights
    # packed at compile time, its bias and activation fused, where that measures faster
    generated_gemm: bool = True
    # at opt level 2 and up: convolutions and GEMMs with constant weights may run the
    # library's own kernels (oneDNN) on weights reordered once at compile time, where that
    # measures faster than the ATen call
    prepacked_library: bool = True
    # time each checked kernel against the library calls it replaces and keep it only where it
    # is faster (decisions cached on disk); False uses every checked kernel (tests, debugging)
    measure_kernels: bool = True
    # how the rule passes are applied: "greedy" runs each rule table to a fixpoint in pipeline
    # order; "backtrack" searches over the same rules plus the generated ones, by estimated
    # cost, from both the input and the greedy result (TASO's search); "saturate" puts the
    # greedy result in an e-graph with every law egglog can state and extracts the cheapest
    # graph (Tensat's method); both in kiln.search
    search: str = "greedy"
    # at opt level 2 and up: partially equivalent transformations (kiln.pet, as PET does it):
    # a subprogram is replaced by a faster mutant plus corrections of the positions where it
    # differs, where the measured cost says so; every one is tested first (random integer
    # tests for the regions, float tests with NaN/inf for the result). Costs up to ~25 s per
    # graph, so off unless asked for
    pet: bool = False
    c_compiler: str = ""  # C compiler to call; "" means $CC, then cc, gcc, clang on PATH
    # -fno-math-errno: kernels never read errno, and without it gcc keeps sqrtf a scalar call
    # (RMSNorm's x * rsqrt(mean + eps) ran 2.5 ns/element, 0.1 with vsqrtps);
    # -fno-trapping-math: nor do they read the floating-point exception flags (no value
    # changes), and without it gcc 12 on AVX2 turns kiln_expf's and kiln_erff's clamps into
    # branches and leaves their loops scalar (softmax 12x128x128 641 us, ATen's 151)
    c_flags: tuple[str, ...] = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math",
                                "-fopenmp")
    kernel_cache_dir: str = ""  # where compiled kernels are kept; "" means ~/.cache/kiln
    # keep each GEMM's and window kernel's finished plan in the kernel cache, so that a warm
    # compile loads it instead of scheduling again (`kiln.kernels.plan_store`)
    store_plans: bool = True
    # write the HTML compile report of each compiled graph to this path ("" writes none):
    # the first graph of a process to it, later ones to name.2.html, name.3.html, ...
    # (kiln.report.on_compile); a page that cannot be written is a warning, never an error
    report: str = ""
    # a tuning database (`kiln tune`): each generated kernel with a record for its workload
    # on this machine and thread count uses the fastest recorded schedule instead of the
    # heuristic one; compiling only reads it, never tunes ("" reads none)
    tuning_db: str = ""
    # kiln.compile calls the compiled model and the model once on the example inputs and
    # compares (kiln.frontend.agreement); where they disagree, the model runs eagerly with a
    # warning (strict: raises). False skips the model's extra call
    check_outputs: bool = True

    def __post_init__(self) -> None:
        for name in ("report", "tuning_db"):  # Options(report=Path("r.html"))
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        if not isinstance(self.opt_level, int) or not 0 <= self.opt_level <= 3:
            raise ValueError(f"Options.opt_level must be 0, 1, 2 or 3, got {self.opt_level!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise TypeError(f"Options.{f.name} must be True or False, got {value!r}")
            if f.type == "str" and not isinstance(value, str):
                raise TypeError(f"Options.{f.name} must be a string, got {value!r}")
        if self.search not in SEARCH_STRATEGIES:
            raise ValueError(f"Options.search must be one of {', '.join(SEARCH_STRATEGIES)}, "
                             f"got {self.search!r}")
        if isinstance(self.c_flags, list):
            object.__setattr__(self, "c_flags", tuple(self.c_flags))
        if not all(isinstance(flag, str) for flag in self.c_flags):
            raise TypeError(f"Options.c_flags must be a sequence of strings, got {self.c_flags!r}")

    @staticmethod
    def from_mapping(values: Mapping[str, Any] | None) -> Options:
        """Options from a dict (the ``options=`` of torch.compile); unknown keys are errors."""
        if not values:
            return Options.from_env()
        known = {f.name for f in dataclasses.fields(Options)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown kiln option(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        return dataclasses.replace(Options.from_env(), **values)

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> Options:
        """Defaults, overridden by KILN_OPT_LEVEL, KILN_DEBUG, KILN_STRICT, KILN_PET,
        KILN_FAST_MATH, KILN_CHECK_OUTPUTS, KILN_SEARCH, KILN_CACHE_DIR, KILN_REPORT,
        KILN_TUNING_DB, CC."""
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        if "KILN_OPT_LEVEL" in env:
            changes["opt_level"] = int(env["KILN_OPT_LEVEL"])
        for name in ("debug", "strict", "pet", "fast_math", "check_outputs"):
            key = f"KILN_{name.upper()}"
            if key in env:
                changes[name] = env[key].strip().lower() in ("1", "true", "yes", "on")
        if env.get("KILN_SEARCH"):
            changes["search"] = env["KILN_SEARCH"].strip().lower()
        if env.get("KILN_CACHE_DIR"):
            changes["kernel_cache_dir"] = env["KILN_CACHE_DIR"]
        if env.get("KILN_REPORT"):
            changes["report"] = env["KILN_REPORT"]
        if env.get("KILN_TUNING_DB"):
            changes["tuning_db"] = env["KILN_TUNING_DB"]
        if env.get("CC"):
            changes["c_compiler"] = env["CC"]
        return Options(**changes)
