"""`kiln compile`, `kiln run`, `kiln optimize` and `kiln report`: one model (a zoo name or an
ONNX file) compiled ahead of time, run, written back as optimized ONNX, or drawn as HTML."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import kiln
from kiln import models
from kiln.cli.errors import UsageError, UserError

SOURCE_HELP = ("a model of kiln's zoo (" + ", ".join(models.names()) + ") or an ONNX file")


def add_command(commands: argparse._SubParsersAction) -> None:
    c = commands.add_parser(
        "compile", help="compile a model ahead of time and print the report's summary",
        description="Compile MODEL (zoo name or .onnx file) as kiln.compile does: every "
        "generated kernel is built, checked and timed now and kept in the kernel cache, so "
        "the next compile of the same model is warm. With -o, the optimized graph (kiln IR "
        "text), the generated kernels' C sources and the report go into a folder.",
        epilog="example: kiln compile resnet50 -o resnet50.kiln")
    _source_arguments(c)
    c.add_argument("-o", "--output", metavar="DIR", help="write the artifact folder DIR")
    c.set_defaults(run=_compile)

    r = commands.add_parser(
        "run", help="run a model on random or .npy inputs: outputs' shapes and timing",
        epilog="example: kiln run model.onnx --input input_ids=ids.npy --repeat 20")
    _source_arguments(r)
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input from a NumPy file (others are random); repeat per input")
    r.add_argument("--repeat", type=int, default=10, metavar="N",
                   help="timed calls after one untimed call (default 10)")
    r.add_argument("--save", metavar="DIR", help="write each output to DIR/NAME.npy")
    r.set_defaults(run=_run)

    o = commands.add_parser(
        "optimize", help="optimize a model and write it as standard ONNX",
        description="Import MODEL (an ONNX file, or a zoo model exported to ONNX first), run "
        "kiln's graph optimizations (constant folding, batch-norm folding, merged parallel "
        "GEMMs such as QKV, epilogues) and write the result as ONNX that onnx.checker accepts "
        "and onnxruntime runs.",
        epilog="example: kiln optimize model.onnx -o model.opt.onnx --opt-level 2")
    _source_arguments(o)
    o.add_argument("-o", "--output", required=True, metavar="FILE", help="the ONNX file to write")
    o.add_argument("--contrib-ops", action="store_true",
                   help="use onnxruntime's com.microsoft fused ops where they are exact")
    o.set_defaults(run=_optimize)

    h = commands.add_parser(
        "report", help="compile a model and write the HTML report",
        description="One self-contained HTML file: the graph before and after, passes, rules, "
        "kernels, the memory plan and a per-op profile (docs/report.md).",
        epilog="example: kiln report bert --quick -o bert.html")
    _source_arguments(h)
    h.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file")
    h.set_defaults(run=_report)


def _source_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="MODEL", help=SOURCE_HELP)
    p.add_argument("--quick", action="store_true", help="a zoo model's small variant")
    p.add_argument("--opt-level", type=int, default=2, choices=range(4), metavar="N",
                   help="kiln's optimization level (default 2)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                   help="an ONNX input's shape where the file leaves it open, e.g. "
                        "input_ids=1x128; repeat per input")


# -- where a model comes from ----------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A model to compile: an nn.Module from the zoo, or an ONNX file, with example inputs."""

    label: str
    model: Any  # torch.nn.Module, or the ONNX file's path
    input_names: tuple[str, ...]
    inputs: tuple[torch.Tensor, ...]
    shapes: dict[str, tuple[int, ...]]

    @property
    def is_onnx(self) -> bool:
        return isinstance(self.model, str)


def resolve(args: argparse.Namespace) -> Source:
    shapes = parse_shapes(args.shape)
    spec = args.source
    if spec.endswith(".onnx") or os.path.isfile(spec):
        if not os.path.isfile(spec):
            raise UserError(f"{spec}: no such file")
        onnx_frontend = _onnx_frontend()
        imported = _onnx_call(lambda: onnx_frontend.import_onnx(spec, shapes=shapes or None))
        return Source(spec, spec, tuple(imported.input_names),
                      tuple(imported.example_inputs()), shapes)
    if shapes:
        raise UsageError("--shape is for ONNX files; a zoo model has fixed example inputs")
    try:
        model, inputs = models.build(spec, quick=args.quick)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return Source(spec, model, tuple(f"input{i}" for i in range(len(inputs))), tuple(inputs),
                  {})


def parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["input_ids=1x128"]`` -> ``{"input_ids": (1, 128)}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        except ValueError:
            shape = ()
        if not name or not shape or any(d < 0 for d in shape):
            raise UsageError(f"--shape {item!r}: write NAME=DIMS, e.g. input_ids=1x128")
        shapes[name] = shape
    return shapes


def _onnx_frontend():  # -> the kiln.frontend.onnx module
    try:
        from kiln.frontend import onnx as onnx_frontend
    except ImportError as err:
        raise UserError(f"ONNX files need the onnx extra ({err}): "
                        "pip install 'kiln[onnx]'") from None
    return onnx_frontend


def _onnx_call(job: Callable[[], Any]) -> Any:
    """An ONNX file kiln cannot take (corrupt, unknown opset or domain, unsafe external data)
    is the user's to fix: one line, exit 1."""
    from kiln.frontend.onnx import OnnxImportError

    try:
        return job()
    except OnnxImportError as err:
        raise UserError(str(err)) from None


def compile_source(source: Source, opt_level: int) -> kiln.CompiledModel:
    options = kiln.Options(opt_level=opt_level)
    if source.is_onnx:
        return _onnx_call(lambda: kiln.compile(source.model, source.inputs, options=options,
                                               shapes=source.shapes or None))
    with torch.no_grad():
        return kiln.compile(source.model, source.inputs, options=options)


# -- the commands ----------------------------------------------------------------------------------


def _compile(args: argparse.Namespace) -> int:
    source = resolve(args)
    start = time.perf_counter()
    compiled = compile_source(source, args.opt_level)
    seconds = time.perf_counter() - start
    print(compiled.report)
    print(f"compiled {source.label} in {seconds:.2f} s")
    if args.output:
        written = write_artifact(compiled, Path(args.output))
        print(f"wrote {len(written)} files to {args.output}: {', '.join(written)}")
    return 0


def write_artifact(compiled: kiln.CompiledModel, folder: Path) -> list[str]:
    """The optimized graphs as kiln IR text, each generated kernel's C source, and the report
    as text; the HTML report too where its extra is installed."""
    from kiln.ir import print_graph

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create {folder}: {err.strerror}") from None
    files: dict[str, str] = {"report.txt": str(compiled.report) + "\n"}
    for g, graph_report in enumerate(compiled.report.graphs):
        graph = getattr(graph_report, "graph", None)  # the optimized graph, where kept
        if graph is not None:
            files[f"graph{g}.kir"] = print_graph(graph)
        for k, kernel in enumerate(graph_report.kernels):
            if kernel.kind == "generated" and kernel.source:
                files[f"kernels/graph{g}-kernel{k}.c"] = kernel.source
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    try:
        from kiln.report import write_html

        write_html(compiled.report, folder / "report.html")
        files["report.html"] = ""
    except ImportError:
        pass  # the report extra is not installed: the text report stands
    return list(files)


def _run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    source = resolve(args)
    inputs = list(source.inputs)
    for item in args.input:
        name, _, file = item.partition("=")
        if name not in source.input_names or not file:
            raise UsageError(f"--input {item!r}: write NAME=FILE.npy with NAME one of "
                             f"{', '.join(source.input_names)}")
        i = source.input_names.index(name)
        inputs[i] = _load_npy(file, inputs[i], name)
    start = time.perf_counter()
    compiled = compile_source(source, args.opt_level)
    compile_s = time.perf_counter() - start
    with torch.no_grad():
        outputs = compiled(*inputs)  # untimed: first-call costs stay out of the figures
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            compiled(*inputs)
            times.append(time.perf_counter() - t0)
    flat = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    names = _output_names(source, len(flat))
    for name, out in zip(names, flat):
        shape = "x".join(map(str, out.shape)) if isinstance(out, torch.Tensor) else "-"
        dtype = str(out.dtype).removeprefix("torch.") if isinstance(out, torch.Tensor) else ""
        print(f"{name}: {shape} {dtype}")
    print(f"compile {compile_s:.2f} s; run median {statistics.median(times) * 1e3:.3f} ms, "
          f"min {min(times) * 1e3:.3f} ms over {args.repeat} calls")
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        for name, out in zip(names, flat):
            if isinstance(out, torch.Tensor):
                np.save(os.path.join(args.save, f"{name}.npy"), out.detach().cpu().numpy())
    return 0


def _load_npy(file: str, example: torch.Tensor, name: str) -> torch.Tensor:
    try:
        array = np.load(file, allow_pickle=False)  # a pickle could run code: never load one
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {file} for input {name}: {err}") from None
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if tensor.dtype != example.dtype or tuple(tensor.shape) != tuple(example.shape):
        want = "x".join(map(str, example.shape)) + " " + str(example.dtype).removeprefix("torch.")
        have = "x".join(map(str, tensor.shape)) + " " + str(tensor.dtype).removeprefix("torch.")
        hint = " (give --shape for inputs the file leaves open)" if tensor.dtype == example.dtype \
            else ""
        raise UserError(f"input {name} from {file} is {have}; the model takes {want}{hint}")
    return tensor


def _output_names(source: Source, count: int) -> list[str]:
    if source.is_onnx:
        onnx_frontend = _onnx_frontend()
        names = list(onnx_frontend.import_onnx(source.model,
                                               shapes=source.shapes or None).output_names)
        if len(names) == count:
            return names
    return [f"output{i}" for i in range(count)]


def _optimize(args: argparse.Namespace) -> int:
    try:
        from kiln.export.onnx import OnnxExportError, optimize
    except ImportError as err:
        raise UserError(f"writing ONNX needs the onnx extra ({err}): "
                        "pip install 'kiln[onnx]'") from None
    source = resolve(args)  # checks the name or file, and --shape, before any work
    try:
        result = _onnx_call(lambda: optimize(
            source.model if source.is_onnx else source.label, opt_level=args.opt_level,
            shapes=source.shapes or None, quick=args.quick, contrib_ops=args.contrib_ops))
        result.save(args.output)
    except OnnxExportError as err:
        raise UserError(str(err)) from None
    except OSError as err:
        raise UserError(f"cannot write {args.output}: {err.strerror}") from None
    print(f"{source.label}: {result.nodes_before} -> {result.nodes_after} ONNX nodes, "
          f"written to {args.output}")
    before, after = result.op_counts_before, result.op_counts_after
    changed = sorted(op for op in set(before) | set(after) if before.get(op) != after.get(op))
    if changed:
        print("ops: " + ", ".join(f"{op} {before.get(op, 0)}->{after.get(op, 0)}"
                                  for op in changed))
    if result.rules_fired:
        print("rules fired: " + ", ".join(f"{name} x{n}" for name, n in
                                          sorted(result.rules_fired.items())))
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        from kiln.report import write_html
    except ImportError as err:
        raise UserError(f"the HTML report needs the report extra ({err}): "
                        "pip install 'kiln[report]'") from None
    source = resolve(args)
    compiled = compile_source(source, args.opt_level)
    try:
        write_html(compiled.report, args.output)
    except OSError as err:
        raise UserError(f"cannot write {args.output}: {err.strerror}") from None
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1024:.0f} KiB)",
          file=sys.stderr)
    return 0
