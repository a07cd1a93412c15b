"""Ahead-of-time compilation: ``kiln.compile(model, example_inputs, options)``.

Capture is ``torch.export`` lowered to core ATen, with parameters, buffers and lifted constants
frozen by name. A model torch.export cannot capture as one graph is compiled through the
torch.compile backend instead (graph breaks run eagerly), with one warning saying so.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from kiln.frontend.fx_compile import FxGraphRunner
from kiln.options import Options
from kiln.report import CompileReport

log = logging.getLogger("kiln")


class CompiledModel:
    """A model compiled for fixed input shapes; call it like the model."""

    def __init__(self, run: Callable[..., Any], signature: Sequence[tuple[tuple[int, ...],
                 torch.dtype]], report: CompileReport, name: str) -> None:
        self._run = run
        self._signature = tuple(signature)
        self.report = report
        self._name = name

    def __call__(self, *args: Any) -> Any:
        self._check(args)
        return self._run(*args)

    def _check(self, args: Sequence[Any]) -> None:
        if len(args) != len(self._signature):
            raise TypeError(f"compiled {self._name} takes {len(self._signature)} tensor "
                            f"argument(s) ({self._describe()}), {len(args)} given")
        for i, (arg, (shape, dtype)) in enumerate(zip(args, self._signature)):
            if not isinstance(arg, torch.Tensor):
                raise TypeError(f"argument {i} of compiled {self._name} must be a tensor "
                                f"{_show(shape, dtype)}, got {type(arg).__name__}")
            if tuple(arg.shape) != shape or arg.dtype != dtype:
                raise ValueError(
                    f"argument {i} of compiled {self._name}: expected {_show(shape, dtype)}, "
                    f"got {_show(tuple(arg.shape), arg.dtype)}; kiln.compile specializes to "
                    f"the example inputs' shapes: compile again for new shapes, or use "
                    f"torch.compile(model, backend='kiln'), which recompiles automatically")

    def _describe(self) -> str:
        return ", ".join(_show(s, d) for s, d in self._signature)

    def __repr__(self) -> str:
        return f"<kiln CompiledModel {self._name}({self._describe()})>"


def _show(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def compile_model(model: Callable[..., Any], example_inputs: Sequence[Any],
                  options: Options | None = None) -> CompiledModel:
    options = options or Options.from_env()
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (
        example_inputs,)
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"kiln.compile: example input {i} is a {type(x).__name__}; "
                            f"kiln.compile takes tensors (use torch.compile(model, "
                            f"backend='kiln') for other arguments)")
    name = type(model).__name__
    signature = [(tuple(x.shape), x.dtype) for x in inputs]
    report = CompileReport()
    try:
        run = _compile_exported(model, inputs, options, report)
    except Exception as err:  # noqa: BLE001 - torch.export is strict; Dynamo is not
        if options.strict:
            raise
        message = (f"torch.export could not capture {name} as one graph "
                   f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                   f"compiling through torch.compile(backend='kiln') instead")
        log.warning(message)
        report.fallbacks.append(message)
        run = _compile_dynamo(model, inputs, options, report)
    return CompiledModel(run, signature, report, name)


def _compile_exported(model: Callable[..., Any], inputs: tuple[torch.Tensor, ...],
                      options: Options, report: CompileReport) -> Callable[..., Any]:
    if not isinstance(model, torch.nn.Module):
        raise TypeError("torch.export takes an nn.Module")
    with torch.no_grad(), warnings.catch_warnings():
        # torch's own deprecation notices must not count as a failed capture under -W error
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        program = torch.export.export(model, inputs).run_decompositions(_decompositions())
    frozen, user_positions = _freeze(program)
    outputs = program.graph_signature.output_specs
    if any(spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.TOKEN) for spec in outputs):
        raise NotImplementedError("the model mutates its buffers or inputs")
    # effect tokens (kiln.ir.calls) come out first; the caller sees only its own outputs
    user_outputs = [i for i, spec in enumerate(outputs) if spec.kind is OutputKind.USER_OUTPUT]
    device = inputs[0].device if inputs else torch.device("cpu")
    runner = FxGraphRunner(program.graph_module, frozen, options, report, device)
    weights = {i: t for i, (_, t) in frozen.items()}
    n_args = len(program.graph_signature.input_specs)
    spec = program.call_spec.out_spec

    def run(*args: Any) -> Any:
        boxed: list[Any] = [None] * n_args
        for i, t in weights.items():
            boxed[i] = t
        for position, arg in zip(user_positions, args):
            boxed[position] = arg
        with torch.no_grad():
            flat = runner(boxed)
        flat = [flat[i] for i in user_outputs]
        return torch.utils._pytree.tree_unflatten(flat, spec) if spec is not None else flat

    return run


@functools.cache
def _core_aten_table() -> dict[Any, Any]:
    return dict(torch.export.default_decompositions().items())


def _decompositions() -> dict[Any, Any]:
    """torch.export's default table (to core ATen), materialized once: building it anew costs
    about 0.2 s a compile. A copy each time, since the caller may change the table it gets."""
    return dict(_core_aten_table())


def _freeze(program: ExportedProgram) -> tuple[dict[int, tuple[str, torch.Tensor]], list[int]]:
    frozen: dict[int, tuple[str, torch.Tensor]] = {}
    users: list[int] = []
    for i, spec in enumerate(program.graph_signature.input_specs):
        if spec.kind is InputKind.USER_INPUT:
            users.append(i)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            tensor = program.state_dict.get(spec.target)
            if tensor is None:
                tensor = program.constants[spec.target]
            frozen[i] = (spec.target, tensor.detach())
        elif spec.kind is InputKind.CONSTANT_TENSOR:
            frozen[i] = (spec.target, program.constants[spec.target])
        elif spec.kind is InputKind.TOKEN:  # orders ops with effects; its value is unread
            frozen[i] = (f"effect_token_{i}", torch.empty(0))
        else:
            raise NotImplementedError(f"input kind {spec.kind.name} is not supported")
    return frozen, users


def _compile_dynamo(model: Callable[..., Any], inputs: tuple[torch.Tensor, ...],
                    options: Options, report: CompileReport) -> Callable[..., Any]:
    from kiln.frontend.dynamo import kiln_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return kiln_backend(gm, example_inputs, options=options, report=report)

    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(*inputs)  # compile now, so the report is complete when compile returns

    def run(*args: Any) -> Any:
        with torch.no_grad():
            return compiled(*args)

    return run
