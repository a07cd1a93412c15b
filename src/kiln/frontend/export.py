"""Ahead-of-time compilation: ``kiln.compile(model, example_inputs, options)``.

Capture is ``torch.export`` lowered to core ATen, with parameters, buffers and lifted constants
frozen by name. A model torch.export cannot capture as one graph, or whose graph kiln cannot
hold, is compiled through the torch.compile backend instead (graph breaks run eagerly), with
one warning saying so.

Shapes are the example inputs' unless ``dynamic_shapes`` (torch.export's argument, passed on)
makes some dimensions symbolic: the compiled model then takes any size torch.export allows
there, and kiln compiles the graph once per distinct input shape (the example inputs' at
once). A size that depends on the data (``nonzero``, boolean-mask indexing, ``.item()``)
cannot be specialized that way: such a graph goes to the torch.compile backend, which runs
the op between graphs.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.export._trace
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from kiln.frontend.agreement import Disagreement, disagreement, draws_random
from kiln.frontend.aten import CONVERTERS
from kiln.frontend.fx_compile import FxGraphRunner, data_dependent_size, first_line
from kiln.frontend.importer import ImportedGraph, UnsupportedGraph, import_fx
from kiln.frontend.kept import KEPT_WHOLE, traced_whole
from kiln.options import Options
from kiln.report import CompileReport

log = logging.getLogger("kiln")


Size = int | str  # a fixed size, or the name of one torch.export left symbolic (s0, 2*s0)
ShapeCheck = Callable[[tuple[torch.Tensor, ...]], None]  # raises if the shapes are not allowed


@dataclass(frozen=True)
class InputSpec:
    """What one argument of a compiled model must be."""

    shape: tuple[Size, ...]
    dtype: torch.dtype

    @staticmethod
    def of(x: torch.Tensor) -> InputSpec:
        return InputSpec(tuple(int(d) for d in x.shape), x.dtype)

    def __str__(self) -> str:
        return _show(self.shape, self.dtype)


class CompiledModel:
    """A model compiled for the example inputs' shapes, or for those ``dynamic_shapes`` allows
    (``check_shapes`` then says which: torch.export's range constraints and guards); call it
    like the model."""

    def __init__(self, run: Callable[..., Any], signature: Sequence[InputSpec],
                 report: CompileReport, name: str, check_shapes: ShapeCheck | None = None,
                 ) -> None:
        self._run = run
        self._signature = tuple(signature)
        self._check_shapes = check_shapes
        self._allowed: set[tuple[tuple[int, ...], ...]] = set()  # shapes checked already
        self.report = report
        self._name = name

    def __call__(self, *args: Any) -> Any:
        self._check(args)
        return self._run(*args)

    def _check(self, args: Sequence[Any]) -> None:
        if len(args) != len(self._signature):
            raise TypeError(f"compiled {self._name} takes {len(self._signature)} tensor "
                            f"argument(s) ({self._describe()}), {len(args)} given")
        for i, (arg, spec) in enumerate(zip(args, self._signature)):
            if not isinstance(arg, torch.Tensor):
                raise TypeError(f"argument {i} of compiled {self._name} must be a tensor "
                                f"{spec}, got {type(arg).__name__}")
            if arg.dtype != spec.dtype or arg.dim() != len(spec.shape) or any(
                    isinstance(d, int) and d != n for d, n in zip(spec.shape, arg.shape)):
                raise ValueError(
                    f"argument {i} of compiled {self._name}: expected {spec}, got "
                    f"{_show(tuple(arg.shape), arg.dtype)}; kiln.compile specializes to the "
                    f"example inputs' shapes (but where dynamic_shapes, as for torch.export, "
                    f"says otherwise): compile again for new shapes, or use "
                    f"torch.compile(model, backend='kiln'), which recompiles automatically")
        shapes = tuple(tuple(arg.shape) for arg in args)
        if self._check_shapes is not None and shapes not in self._allowed:
            try:
                self._check_shapes(tuple(args))
            except Exception as err:  # noqa: BLE001 - torch's guard failures are not typed
                given = ", ".join(_show(tuple(a.shape), a.dtype) for a in args)
                raise ValueError(f"compiled {self._name} ({self._describe()}) does not take "
                                 f"{given}: {type(err).__name__}: {err}") from err
            self._allowed.add(shapes)

    def _describe(self) -> str:
        return ", ".join(str(spec) for spec in self._signature)

    def __repr__(self) -> str:
        return f"<kiln CompiledModel {self._name}({self._describe()})>"


def _show(shape: Sequence[Size], dtype: torch.dtype) -> str:
    return f"{str(dtype).removeprefix('torch.')}[{', '.join(str(d) for d in shape)}]"


def compile_model(model: Any, example_inputs: Sequence[Any] | None = None,
                  options: Options | None = None, *,
                  dynamic_shapes: Any = None,
                  shapes: Mapping[str, Sequence[int]] | None = None) -> CompiledModel:
    """``dynamic_shapes`` is torch.export's argument (``{0: Dim("batch", max=64)}`` for the
    first argument's dimension 0, nested as the model's ``forward`` takes its arguments).

    ``model`` may also be an ONNX model: a path ending in ``.onnx`` or an ``onnx.ModelProto``
    (kiln.frontend.onnx), whose dynamic dims ``shapes`` or the example inputs specialize."""
    if _is_onnx(model):
        from kiln.frontend.onnx import compile_onnx

        return compile_onnx(model, example_inputs, options, shapes=shapes)
    if shapes is not None:
        raise TypeError("kiln.compile: shapes= is for ONNX models; a PyTorch model takes "
                        "example inputs (and dynamic_shapes)")
    if example_inputs is None:
        raise TypeError("kiln.compile of a PyTorch model needs example inputs")
    options = options or Options.from_env()
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (
        example_inputs,)
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"kiln.compile: example input {i} is a {type(x).__name__}; "
                            f"kiln.compile takes tensors (use torch.compile(model, "
                            f"backend='kiln') for other arguments)")
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(
        model, "__name__", type(model).__name__)
    report = CompileReport()
    try:
        run, signature, check = _compile_exported(model, inputs, options, report,
                                                   dynamic_shapes)
    except UnsupportedGraph as err:
        if options.strict:
            raise
        run, signature, check = _fall_back(
            f"kiln cannot compile the graph torch.export captured of {name} ({err})",
            model, inputs, options, report, dynamic_shapes)
    except _Disagrees as failed:  # (Dynamo may capture what torch.export did: the model runs)
        if options.strict:
            raise Disagreement(failed.describe(name)) from None
        run, signature, check = _eagerly(model, f"{failed.describe(name)}; it runs eagerly",
                                         report, inputs, dynamic_shapes)
    except _CaptureFailed as failed:  # torch.export is strict; Dynamo is not
        err = failed.error
        if options.strict:
            raise err from None
        run, signature, check = _fall_back(
            f"torch.export could not capture {name} as one graph ({first_line(err)})",
            model, inputs, options, report, dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - a bug of kiln's must cost speed, not the model
        if options.strict:
            raise
        run, signature, check = _fall_back(
            f"kiln failed on the graph torch.export captured of {name} ({first_line(err)}; "
            f"a kiln bug: please report it)", model, inputs, options, report, dynamic_shapes)
    return CompiledModel(run, signature, report, name, check)


class _FunctionModule(torch.nn.Module):
    """A plain function as the module torch.export takes; tensors it closes over are
    captured as constants."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


class _CaptureFailed(Exception):
    """torch.export raised ``error``: the model, not kiln, decides the fallback's message."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Disagrees(Exception):
    """The compiled model's results on the example inputs differ from the model's (``why``);
    ``capture_differs``: so do those of torch.export's captured program, run by torch."""

    def __init__(self, why: str, capture_differs: bool) -> None:
        super().__init__(why)
        self.why = why
        self.capture_differs = capture_differs

    def describe(self, name: str) -> str:
        cause = ("torch.export's captured program, run by torch, disagrees too: the capture "
                 "differs from the model" if self.capture_differs else
                 "torch.export's captured program agrees: a kiln bug, please report it")
        return (f"the compiled {name} disagrees with the model on the example inputs "
                f"({self.why}); {cause}")


def _is_onnx(model: Any) -> bool:
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model).lower().endswith(".onnx")
    return type(model).__name__ == "ModelProto" and type(model).__module__.startswith("onnx")


def _fall_back(why: str, model: Callable[..., Any], inputs: tuple[torch.Tensor, ...],
               options: Options, report: CompileReport,
               dynamic_shapes: Any) -> tuple[Callable[..., Any], list[InputSpec], None]:
    message = f"{why}; compiling through torch.compile(backend='kiln') instead"
    log.warning(message)
    report.fallbacks.append(message)
    try:
        run = _compile_dynamo(model, inputs, options, report)
    except Exception as err:  # noqa: BLE001 - whatever Dynamo raises on the model
        if options.strict:
            raise
        with torch.no_grad():  # (where eager fails too, the error is the model's: raised)
            model(*inputs)
        return _eagerly(model, f"torch.compile could not trace the model either "
                               f"({first_line(err)}); it runs eagerly", report, inputs,
                        dynamic_shapes)
    return run, _any_shapes(inputs, dynamic_shapes), None


def _any_shapes(inputs: tuple[torch.Tensor, ...], dynamic_shapes: Any) -> list[InputSpec]:
    """The signature of a model run by Dynamo or eagerly: the example inputs' shapes, or
    with ``dynamic_shapes`` any size (Dynamo recompiles for whatever shape comes)."""
    if dynamic_shapes is None:
        return [InputSpec.of(x) for x in inputs]
    return [InputSpec(("?",) * x.dim(), x.dtype) for x in inputs]


def _compile_exported(model: Callable[..., Any], inputs: tuple[torch.Tensor, ...],
                      options: Options, report: CompileReport, dynamic_shapes: Any,
                      ) -> tuple[Callable[..., Any], list[InputSpec], ShapeCheck | None]:
    if not isinstance(model, torch.nn.Module):
        model = _FunctionModule(model)  # torch.export takes modules only
    with torch.no_grad(), warnings.catch_warnings():
        # torch's own deprecation notices must not count as a failed capture under -W error
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            program = capture(model, inputs, dynamic_shapes)
        except Exception as err:  # noqa: BLE001 - whatever torch.export raises
            raise _CaptureFailed(err) from err
    unknown = data_dependent_size(program.graph_module)
    if unknown is not None:
        node, symbols = unknown
        raise UnsupportedGraph(node, f"kiln compiles sizes known before the run; {symbols} "
                                     f"depends on the data")
    frozen, user_positions = _freeze(program)
    outputs = program.graph_signature.output_specs
    if any(spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.TOKEN) for spec in outputs):
        mutated = [spec.target for spec in outputs
                   if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.TOKEN)]
        raise UnsupportedGraph(None, f"the model writes into its buffers or inputs "
                                     f"({', '.join(map(str, mutated))})")
    # effect tokens (kiln.ir.calls) come out first; the caller sees only its own outputs
    user_outputs = [i for i, spec in enumerate(outputs) if spec.kind is OutputKind.USER_OUTPUT]
    device = inputs[0].device if inputs else torch.device("cpu")
    # at fixed shapes, `_agrees_with_model` compares the one compile with the model itself
    runner = FxGraphRunner(program.graph_module, frozen, options, report, device,
                           compare=dynamic_shapes is not None)
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

    if dynamic_shapes is not None:
        run(*inputs)  # compile for the example shapes now, so the report is complete
    if options.check_outputs and not draws_random(program.graph_module):
        _agrees_with_model(model, program, run, inputs)
    if dynamic_shapes is None:
        return run, [InputSpec.of(x) for x in inputs], None
    return run, _signature(program), _shape_check(program)


def _agrees_with_model(model: torch.nn.Module, program: ExportedProgram,
                       run: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> None:
    """Raises `_Disagrees` where the compiled model's results on the example inputs differ
    from the model's (`kiln.frontend.agreement`), saying whether the captured program's do."""
    with torch.no_grad():
        with _state_kept(model):  # (the call leaves the model's attributes as they were)
            expected = model(*inputs)
        why = disagreement(expected, run(*inputs))
        if why is None:
            return
        capture_differs = disagreement(expected, program.module()(*inputs)) is not None
    raise _Disagrees(why, capture_differs)


def _signature(program: ExportedProgram) -> list[InputSpec]:
    """The user inputs' dtypes and sizes, by name where torch.export left them symbolic."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    specs = []
    for node, spec in zip(placeholders, program.graph_signature.input_specs):
        if spec.kind is InputKind.USER_INPUT:
            val = node.meta["val"]
            shape = tuple(str(d) if isinstance(d, torch.SymInt) else int(d) for d in val.shape)
            specs.append(InputSpec(shape, val.dtype))
    return specs


def _shape_check(program: ExportedProgram) -> ShapeCheck:
    """Raises unless torch.export's program takes inputs of these shapes: the checks its own
    module makes before it runs, of range constraints (``s0 <= 64``; like torch, sizes 0 and 1
    pass though the graph was traced for 2 and up) and guards (``s0 % 2 == 0`` from a branch
    on a size, which the graph no longer holds). Run on fake tensors: no arithmetic."""
    module = program.module()

    def check(args: tuple[torch.Tensor, ...]) -> None:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            module(*(mode.from_tensor(a) for a in args))

    return check


def capture(model: torch.nn.Module, inputs: tuple[Any, ...], dynamic_shapes: Any = None,
            whole: tuple[Any, ...] = KEPT_WHOLE) -> ExportedProgram:
    """``model`` as an ExportedProgram in the ATen IR kiln's importer reads, in one trace
    where it can. torch.export's public path traces twice: to its training IR, then again
    through the core-ATen decompositions. Its pre-dispatch=False path (`_export`) gives ATen
    IR in one trace; what the core-ATen table would still rewrite there (t, transpose,
    split, silu, masked_fill, ...) kiln converts itself. Where an op of the table has no
    converter, that program is decomposed as the public path's is. Captures, repeated in one
    process: ResNet-50 0.8 against 1.8 s; at the zoo's quick sizes Inception v3 0.7 against
    1.7 s, a Llama 0.5 against 1.5 s."""
    with _no_stack_traces(), _fake_kernel_errors_unlogged(), _state_kept(model):
        return _capture(model, inputs, dynamic_shapes, whole)


@contextlib.contextmanager
def _fake_kernel_errors_unlogged() -> Iterator[None]:
    """torch's fake-tensor mode logs the traceback of a shape rule that raises (Informer's
    ProbSparse attention: ~60 lines on stderr) before the error reaches the trace's caller;
    kiln's caller reports that error itself, once, with what it does instead."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    before = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(before)


@contextlib.contextmanager
def _state_kept(model: torch.nn.Module) -> Iterator[None]:
    """The model's plain attributes as they were before the trace, after it. A module that
    caches tensors in an attribute as it runs (LeViT's ``attention_bias_cache``, a dict)
    would otherwise keep torch.export's traced tensors there, and the user's own model would
    fail on its next eager call. Containers (dict, list, set) get their contents back in
    place; attributes the trace added are removed."""
    internal = _module_internals()
    saved = []
    for module in model.modules():
        attrs = {k: v for k, v in vars(module).items() if k not in internal}
        contents = {k: copy.copy(v) for k, v in attrs.items() if type(v) in (dict, list, set)}
        saved.append((module, attrs, contents))
    try:
        with warnings.catch_warnings():  # torch's advice to register them: moot, restored
            warnings.filterwarnings("ignore", "The tensor attributes? .* assigned during export",
                                    UserWarning)
            yield
    finally:
        for module, attrs, contents in saved:
            state = vars(module)
            for k in [k for k in state if k not in internal and k not in attrs]:
                del state[k]
            state.update(attrs)
            for k, before in contents.items():
                container = attrs[k]
                container.clear()
                if isinstance(container, list):
                    container.extend(before)
                else:
                    container.update(before)


@functools.cache
def _module_internals() -> frozenset[str]:
    """The attributes nn.Module keeps for itself (parameters, buffers, hooks, ...)."""
    return frozenset(vars(torch.nn.Module()))


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """The trace without a Python stack per node: kiln reads none of them, and taking them
    cost 0.2 s of HF GPT-2's 1.2 s capture."""
    config = torch.fx.config
    before = getattr(config, "do_not_emit_stack_traces", None)
    if before is None:  # (another torch may not have the switch)
        yield
        return
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


def _capture(model: torch.nn.Module, inputs: tuple[Any, ...], dynamic_shapes: Any,
             whole: tuple[Any, ...]) -> ExportedProgram:
    with traced_whole(whole):
        return _traced(model, inputs, dynamic_shapes, whole)


def _traced(model: torch.nn.Module, inputs: tuple[Any, ...], dynamic_shapes: Any,
            whole: tuple[Any, ...]) -> ExportedProgram:
    one_trace = getattr(torch.export._trace, "_export", None)
    if one_trace is not None:  # (another torch may not have it: the public path)
        try:
            program = one_trace(model, inputs, dynamic_shapes=dynamic_shapes, strict=False,
                                pre_dispatch=False)
        except Exception as err:  # noqa: BLE001 - e.g. instance_norm's functionalization
            # assert on this path: the public path decides whether the model exports
            log.debug("kiln: one-trace capture failed (%s); torch.export's path", err)
        else:
            table = _core_aten_table()
            if not any(n.op == "call_function" and n.target in table and n.target not in
                       CONVERTERS and n.target not in whole for n in program.graph.nodes):
                return program
            return program.run_decompositions(_decompositions(whole))
    program = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    return program.run_decompositions(_decompositions(whole))


def import_model(model: torch.nn.Module, inputs: tuple[Any, ...],
                 whole: tuple[Any, ...] = KEPT_WHOLE) -> ImportedGraph:
    """The graph kiln.compile would optimize, as imported: `capture`, weights frozen in.
    ``whole``: the ops left undecomposed (ONNX export asks for none: it has no form for
    them). Raises UnsupportedGraph where kiln cannot hold the graph."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        program = capture(model, inputs, whole=whole)
    frozen, _ = _freeze(program)
    return import_fx(program.graph_module, frozen)


@functools.cache
def _core_aten_table() -> dict[Any, Any]:
    return dict(torch.export.default_decompositions().items())


def _decompositions(whole: tuple[Any, ...] = KEPT_WHOLE) -> dict[Any, Any]:
    """torch.export's default table (to core ATen), materialized once: building it anew costs
    about 0.2 s a compile. A copy each time, since the caller may change the table it gets.
    Without ``whole`` (`KEPT_WHOLE`): ``scaled_dot_product_attention`` stays one call of
    ATen's fused kernel, as eager runs it, instead of its math form with a guard of three
    opaque calls per softmax (the default attention of Hugging Face models, torch's
    MultiheadAttention); scatters stay scatters (`kiln.runtime.scatters`)."""
    table = dict(_core_aten_table())
    for op in whole:
        table.pop(op, None)
    return table


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


def _eagerly(model: Callable[..., Any], message: str, report: CompileReport,
             inputs: tuple[torch.Tensor, ...], dynamic_shapes: Any,
             ) -> tuple[Callable[..., Any], list[InputSpec], None]:
    """The model as it is, where Dynamo could not trace it either (LongT5's transient-global
    attention fails torch's own shape checks under both tracers), or where the compiled
    model disagrees with it (`_Disagrees`): eager PyTorch, with a warning (``message``)."""
    log.warning(message)
    report.fallbacks.append(message)

    def run(*args: Any) -> Any:
        with torch.no_grad():
            return model(*args)

    return run, _any_shapes(inputs, dynamic_shapes), None


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
