"""Generated kernels for the partitioner's groups: plan, build, check, measure, or leave the
group to its library calls.

    group --recipe--> KernelPlan --build()--> PrimFunc --compile--> CompiledKernel
          --validate (agrees with the library)--> --decide (faster than the library)--> Built

The recipe is chosen by the group's last op (`RECIPES`): a last-axis softmax or layer norm
takes `kiln.kernels.rows`, everything else `kiln.kernels.loops`; GEMMs are planned by
`kiln.kernels.gemm`. Every plan gets the same post-passes here: bool inputs read as bytes,
and kernels with fewer than `GRAIN` output elements on one thread.

Any failure (the op has no loop definition, a schedule primitive refuses, no C compiler, the
compiler rejects the source, the built kernel disagrees with the library on random data, or
it measures slower) leaves the group to its library calls, with a typed `Skipped` reason:
never a crash, never a wrong answer.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

from kiln.codegen.build import CompileError, CompilerUnavailable
from kiln.codegen.c import UnsupportedForC
from kiln.codegen.kernel import compile_kernel, prebuild
from kiln.ir.graph import Graph, Value
from kiln.kernels.checks import Checks
from kiln.kernels.decide import Decisions, faster_than_library
from kiln.kernels.outcome import Built, KernelBuild, Skipped, SkipReason
from kiln.kernels.plan import GRAIN, KernelPlan
from kiln.kernels.rows import NoRowKernel
from kiln.options import Options
from kiln.passes.layout import channels_last_values
from kiln.passes.partition import KernelGroup, without_last
from kiln.tir.primitives.common import ScheduleError
from kiln.tir.te import NotLowerable
from kiln.tune.apply import TUNED, tuned_schedule
from kiln.tune.space_groups import GroupSpace

__all__ = ["GRAIN", "build_group_kernel", "build_kernels", "checked_candidate", "compile_plan",
           "internal_error"]

def build_kernels(graph: Graph, groups: Sequence[KernelGroup], options: Options,
                  decisions: Decisions | None = None) -> KernelBuild:
    """A kernel per group where one can be built, checked, and measures faster than the
    library calls; the reasons elsewhere."""
    result = KernelBuild()
    decisions = decisions if decisions is not None else Decisions.open(options)
    checks = Checks(decisions)
    nhwc = channels_last_values(graph)  # (once: each loops group asks)
    planned = {group: plan_group(graph, group, options, nhwc) for group in groups}
    prebuild([p[0].build() for p in planned.values() if not isinstance(p, Skipped)], options)
    for i, group in enumerate(groups):
        built = build_group_kernel(graph, group, options, planned[group])
        prologue = without_last(group)
        if isinstance(built, Skipped) and built.reason is SkipReason.NO_RECIPE and prologue:
            # the normalization stays a library call; its prologue still fuses
            built = build_group_kernel(graph, prologue, options)
        if isinstance(built, Skipped):
            result.skipped.append(built)
            if built.reason is SkipReason.NO_COMPILER:  # (warned once, by codegen.build)
                result.skipped += [Skipped(g, built.reason, built.detail) for g in groups[i + 1:]]
                break
            continue
        if not checks.agrees(graph, built):
            warnings.warn(f"kiln: generated kernel {built.kernel.name} disagrees with the library "
                          f"calls on random data; using the library calls", RuntimeWarning,
                          stacklevel=2)
            result.skipped.append(Skipped(built.group, SkipReason.DISAGREED))
            continue
        decided = faster_than_library(graph, built, decisions)
        (result.kernels if isinstance(decided, Built) else result.skipped).append(decided)
    return result


Planned = tuple[KernelPlan, tuple[Value, ...], tuple[Value, ...]]


def plan_group(graph: Graph, group: KernelGroup, options: Options,
               nhwc: set[Value] | None = None) -> Planned | Skipped:
    """The group's plan and the values its parameters stand for, or why there is none: the
    tuner's choice (`kiln.tune.apply.tuned_schedule`, ``Options.tuning_db``) where it has
    one, else the default (`kiln.tune.space_groups.GroupSpace`: the recipe's schedule, bool
    inputs read as bytes, one thread below `GRAIN` output elements)."""
    try:
        space = GroupSpace.of(graph, group, nhwc)
        tuned = tuned_schedule(space, options)
        if tuned is None:
            plan, ins, outs = space.planned_in_source(space.default(), record=False)
        else:
            plan, ins, outs = space.planned_in_source(tuned[0])
            plan = dataclasses.replace(plan, notes=plan.notes + f"\n# {TUNED} (recorded "
                                       f"median {tuned[1] * 1e6:.1f} us)")
        plan.build()  # (a primitive that refuses does so here)
    except NoRowKernel as err:
        return Skipped(group, SkipReason.NO_RECIPE, str(err))
    except (NotLowerable, ScheduleError) as err:
        return Skipped(group, SkipReason.NOT_LOWERABLE, str(err))
    except Exception as err:  # noqa: BLE001 - a bug in lowering must cost speed, not the model
        return internal_error(group, err, options)
    return plan, tuple(ins), tuple(outs)


def build_group_kernel(graph: Graph, group: KernelGroup, options: Options,
                       planned: Planned | Skipped | None = None) -> Built | Skipped:
    """The group's compiled kernel (not yet checked or measured), or why there is none."""
    planned = planned if planned is not None else plan_group(graph, group, options)
    if isinstance(planned, Skipped):
        return planned
    plan, ins, outs = planned
    return compile_plan(graph, group, plan, ins, outs, options)


def compile_plan(graph: Graph, group: KernelGroup, plan: KernelPlan, ins: tuple[Value, ...],
                 outs: tuple[Value, ...], options: Options, weights: dict | None = None
                 ) -> Built | Skipped:
    """Build ``plan``'s program and compile it; the outcome as a type, never an exception."""
    try:
        func = plan.build()
        kernel = compile_kernel(func, options)
    except UnsupportedForC as err:
        return Skipped(group, SkipReason.NOT_LOWERABLE, str(err))
    except CompileError as err:  # (narrower than Exception: caught first)
        warnings.warn(f"kiln: the C compiler rejected kernel {plan.program.name}; using library "
                      f"calls ({str(err).splitlines()[0]})", RuntimeWarning, stacklevel=3)
        return Skipped(group, SkipReason.COMPILER_REJECTED, str(err).splitlines()[0])
    except Exception as err:  # noqa: BLE001 - a bug in lowering must cost speed, not the model
        return internal_error(group, err, options)
    if isinstance(kernel, CompilerUnavailable):
        return Skipped(group, SkipReason.NO_COMPILER, kernel.reason)
    return Built(group, kernel, ins, outs, plan, weights or {})


def checked_candidate(graph: Graph, group: KernelGroup, options: Options,
                      planned: tuple[KernelPlan, tuple[Value, ...], dict] | Skipped,
                      checks: Checks | None = None,
                      library_where_not_finite: bool = False) -> Built | Skipped:
    """A contraction group's planned kernel (a GEMM, a direct convolution, a pool, attention;
    its output the last node's), compiled with its packed weights and checked against the
    group's ATen calls (``checks`` remembers the answers), as the executor runs it
    (`Built.library_where_not_finite`)."""
    if isinstance(planned, Skipped):
        return planned
    plan, inputs, weights = planned
    built = compile_plan(graph, group, plan, inputs, (group.last.out(),), options, weights)
    if isinstance(built, Skipped):
        return built
    built = dataclasses.replace(built, library_where_not_finite=library_where_not_finite)
    checks = Checks() if checks is None else checks
    return built if checks.agrees(graph, built) else Skipped(group, SkipReason.DISAGREED)


def internal_error(group: KernelGroup, err: Exception, options: Options) -> Skipped:
    """A bug met while building the group's kernel: raised under ``Options.strict``, else a
    warning and the group's library calls."""
    if options.strict:
        raise err
    warnings.warn(f"kiln: could not generate a kernel for {group} ({type(err).__name__}: "
                  f"{err}); using library calls", RuntimeWarning, stacklevel=3)
    return Skipped(group, SkipReason.INTERNAL_ERROR, f"{type(err).__name__}: {err}")
