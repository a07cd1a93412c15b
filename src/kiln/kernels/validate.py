"""The safety net: a built kernel runs on random operands (the real weights for weights) and
must agree with the group's library calls before it is used."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kiln.codegen.kernel import CompiledKernel
from kiln.ir.graph import Graph, Value
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op
from kiln.kernels.outcome import Built
from kiln.passes.partition import KernelGroup
from kiln.tir.nodes import contiguous_strides

__all__ = ["CHECK_TOLERANCE", "agrees_with_library", "empty_output", "operand_strides",
           "random_operands", "random_strided"]

CHECK_TOLERANCE = 1e-5  # relative L2, float32: a kernel off by more than this is not used

Strides = dict[Value, tuple[int, ...]]


def random_operands(graph: Graph, group: KernelGroup,
                    strides: Strides | None = None) -> dict[Value, torch.Tensor]:
    """Random tensors for the group's inputs (bool masks 0/1), the real weights for weights;
    an input in ``strides`` is laid out with those strides (as the run time will give it to
    a kernel that reads it so: a channels-last activation), the others contiguous."""
    gen = torch.Generator().manual_seed(0)
    strides = strides or {}
    env: dict[Value, torch.Tensor] = {}
    for v in group.inputs:
        t = v.type
        if v.node.op is Op.CONSTANT:  # the real weight: kernels may bake in small ones
            env[v] = graph.constant(v.node)
            continue
        layout = strides.get(v, contiguous_strides(t.shape))
        env[v] = random_strided(t.shape, layout, gen, t.dtype.torch)
    return env


def random_strided(shape: tuple[int, ...], strides: tuple[int, ...], gen: torch.Generator,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random values (bools 0/1) laid out with ``strides``. Elements that share memory (a
    0 stride: a K or V expanded over query heads) share a value, as in the run time's view,
    which a copy into such a layout cannot give (torch refuses the write)."""
    size = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    if dtype is torch.bool:
        flat = torch.randint(0, 2, (size,), generator=gen).bool()
    else:
        flat = torch.randn(size, generator=gen).to(dtype)
    return flat.as_strided(shape, strides)


def operand_strides(built: Built) -> Strides:
    """The non-constant inputs a generated kernel reads with other than contiguous strides
    (its parameter buffers say so), with those strides."""
    kernel = built.kernel
    if not isinstance(kernel, CompiledKernel):
        return {}
    return {v: buf.strides for v, buf in zip(built.inputs, kernel.func.inputs)
            if v.node.op is not Op.CONSTANT and buf.strides is not None
            and buf.strides != contiguous_strides(buf.shape)}


def empty_output(built: Built, index: int, fill: float | None = None) -> torch.Tensor:
    """A tensor for the kernel's ``index``-th output, with the strides its buffer has."""
    v = built.outputs[index]
    dtype = v.type.dtype.torch
    kernel = built.kernel
    strides = kernel.func.outputs[index].strides if isinstance(kernel, CompiledKernel) else None
    out = torch.empty(v.type.shape, dtype=dtype) if strides is None else \
        torch.empty_strided(v.type.shape, strides, dtype=dtype)
    return out if fill is None else out.fill_(fill)


def library_results(graph: Graph, group: KernelGroup,
                    env: dict[Value, torch.Tensor]) -> dict[Value, torch.Tensor]:
    """``env`` extended with every value the group's library calls compute from it."""
    out: dict[Value, object] = dict(env)
    with torch.no_grad():
        for node in group.nodes:
            args = [out[v] if v in out else v.node.attrs.value  # type: ignore[attr-defined]
                    for v in node.inputs]
            out.update(zip(node.outputs, evaluate_node(node, args, graph)))
    return out  # type: ignore[return-value]


def runner(graph: Graph, built: Built, env: dict[Value, torch.Tensor],
           outs: list[torch.Tensor]) -> Callable[[], object]:
    """A call of the built kernel on ``env``'s operands, writing ``outs`` (after its
    `Built.run_if` test, where it has one, as the executor runs it)."""
    operands = [built.weight(graph, v) if v.node.op is Op.CONSTANT else env[v]
                for v in built.inputs]
    kernel = built.kernel
    if isinstance(kernel, CompiledKernel):
        pointers = [t.data_ptr() for t in operands] + [o.data_ptr() for o in outs]
        held = (operands, outs)  # the tensors behind the pointers live as long as the call

        if built.run_if is not None:  # (its test runs each call too: timed with the kernel)
            test, positions = built.run_if
            tested = [operands[i] for i in positions]

            def run_tested() -> object:
                return test(*tested), kernel.run_unchecked(*pointers), held
            return run_tested

        def run() -> object:
            return kernel.run_unchecked(*pointers), held
        return run
    return lambda: outs[0].copy_(kernel.fn(*operands))


def agrees_with_library(graph: Graph, built: Built) -> bool:
    """Run the kernel and the group's library calls on the same operands; compare."""
    operands = random_operands(graph, built.group, operand_strides(built))
    env = library_results(graph, built.group, operands)
    outs = [empty_output(built, i, float("nan")) for i in range(len(built.outputs))]
    with torch.no_grad():
        runner(graph, built, env, outs)()
    if built.library_where_not_finite:  # (the executor then takes the library's results)
        outs = [got.where(got.isfinite(), env[v]) for got, v in zip(outs, built.outputs)]
    return all(_close(got, env[v]) for got, v in zip(outs, built.outputs))


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Infinities and NaNs at the same places (masks put -inf in), finite values within
    CHECK_TOLERANCE in relative L2. Where every value is finite (nearly always) no mask is
    gathered: boolean indexing took 54 ms a check of Swin2SR's 4096-row GEMMs, half of its
    cold compile's checking time."""
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(got)):
        return False
    if not bool(finite.all()):
        if not torch.equal(got[~finite].nan_to_num(), want[~finite].nan_to_num()):
            return False
        got, want = got.where(finite, 0.0), want.where(finite, 0.0)
    a, b = got.double(), want.double()
    err = torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)
    return float(err) < CHECK_TOLERANCE
