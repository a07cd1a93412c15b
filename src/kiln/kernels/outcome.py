"""What building a kernel for a group gives: `Built`, or `Skipped` with a typed reason.

    match outcome:
        case Built():   ...                      # run outcome.kernel in place of the group
        case Skipped(reason=SkipReason.NO_COMPILER): ...
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kiln.codegen.kernel import CompiledKernel
from kiln.ir.graph import Graph, Value
from kiln.kernels.plan import KernelPlan, Recipe
from kiln.passes.partition import KernelGroup

if TYPE_CHECKING:
    from kiln.kernels.library import LibraryKernel

__all__ = ["Built", "KernelBuild", "Measured", "SkipReason", "Skipped"]


class SkipReason(enum.Enum):
    """Why a group keeps its library calls."""

    NO_RECIPE = "no recipe takes the group"
    NOT_LOWERABLE = "not lowerable"  # no loop definition, a primitive refused, C cannot say it
    NO_COMPILER = "no C compiler"
    COMPILER_REJECTED = "the C compiler rejected the kernel"
    INTERNAL_ERROR = "internal error"
    DISAGREED = "disagreed with the library on random data"
    SLOWER = "measured slower than the library"


@dataclass(frozen=True)
class Measured:
    """The generated kernel and the library calls it replaces, timed side by side."""

    library_s: float
    generated_s: float
    cached: bool = False  # the decision came from the on-disk decision cache

    def __str__(self) -> str:
        source = " (cached decision)" if self.cached else ""
        return (f"library {self.library_s * 1e3:.3f} ms, generated "
                f"{self.generated_s * 1e3:.3f} ms{source}")


@dataclass(frozen=True)
class Built:
    """A compiled kernel standing for a group; parameters are ``inputs`` then ``outputs``."""

    group: KernelGroup
    kernel: CompiledKernel | LibraryKernel
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    plan: KernelPlan | None  # None for a library kernel: nothing is generated
    # the tensor to pass for a weight input, where not the weight made contiguous (a GEMM
    # reads a transposed weight in place: no copy of GPT-2's 154 MB LM head)
    weights: dict[Value, torch.Tensor] = field(default_factory=dict, compare=False)
    measured: Measured | None = None
    # the group's library calls run again where the kernel's output holds a NaN or an
    # infinity: the library's results for non-finite operands are its own (ATen's fused
    # attention), which the kernel's agree with only where everything is finite
    library_where_not_finite: bool = False
    # a test of some inputs (the function, and those inputs' positions) that must pass for
    # the kernel to run; where it fails, the library calls run instead (attention that skips
    # keys a constant float mask hides: only exact where every score is finite and bounded)
    run_if: tuple[Callable[..., bool], tuple[int, ...]] | None = field(default=None,
                                                                       compare=False)

    @property
    def may_run_library(self) -> bool:
        """Whether the group's library calls may run in the kernel's place or after it."""
        return self.library_where_not_finite or self.run_if is not None

    @property
    def source(self) -> str:
        return self.kernel.source

    @property
    def recipe(self) -> Recipe:
        return self.plan.recipe if self.plan is not None else Recipe.LIBRARY

    @property
    def generated(self) -> bool:
        return isinstance(self.kernel, CompiledKernel)

    @property
    def trace(self) -> str:
        """How the kernel was made, as Python: its plan (a library kernel: its call), then the
        measurement if any."""
        text = self.plan.as_python() if self.plan is not None else f"# {self.kernel.source}"
        return f"{text}\n# used: measured {self.measured}" if self.measured else text

    def weight(self, graph: Graph, v: Value) -> torch.Tensor:
        """What the kernel reads for the weight input ``v``."""
        found = self.weights.get(v)
        return found if found is not None else graph.constant(v.node).contiguous()


@dataclass(frozen=True)
class Skipped:
    """A group left to its library calls, and why."""

    group: KernelGroup
    reason: SkipReason
    detail: str = ""
    measured: Measured | None = None

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}" if self.detail else self.reason.value


@dataclass
class KernelBuild:
    """The result of building every group: the kernels, and why the other groups were left."""

    kernels: list[Built] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
