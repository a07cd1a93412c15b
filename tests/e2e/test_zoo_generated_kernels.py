"""Every zoo model with generated kernels on still matches eager PyTorch; the report lists the
kernels (generated and library) of every computing node."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kiln
import kiln_test_support as support
from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.engine import compile_graph
from kiln.ir import Op

TOLERANCE = 1e-4  # relative L2, as tests/e2e/test_zoo_e2e.py at opt level 2
TRANSFORMERS = ("bert", "gpt2", "vit_b16")


@pytest.fixture(scope="module")
def options(tmp_path_factory: pytest.TempPathFactory) -> kiln.Options:
    # every checked kernel used, unmeasured: these tests check what the kernels compute
    opts = kiln.Options(generated_kernels=True, debug=True, measure_kernels=False,
                        kernel_cache_dir=str(tmp_path_factory.mktemp("kernels")))
    if isinstance(toolchain(opts), CompilerUnavailable):
        pytest.skip("no C compiler")
    return opts


@pytest.mark.parametrize("name", support.NAMES)
def test_zoo_model_with_generated_kernels_matches_eager(options: kiln.Options,
                                                        name: str) -> None:
    case = support.capture(name)
    compiled = compile_graph(case.graph, options, range(len(case.graph.inputs)))
    for _ in range(2):  # a second call reuses the arena and the kernels
        with torch.no_grad():
            outputs = compiled(list(case.inputs))
        for actual, expected in zip(outputs, case.expected, strict=True):
            assert support.relative_error(actual, expected) < TOLERANCE
    assert compiled.report.details.fallbacks == {}  # each kernel ran, not its library ops
    kernels = compiled.report.kernels
    covered = [op for k in kernels for op in k.ops]
    computing = [n.op.text for n in compiled.graph.nodes
                 if n.op not in (Op.CONSTANT, Op.SCALAR)]
    assert sorted(covered) == sorted(computing)  # every computing node, exactly once
    generated = [k for k in kernels if k.kind == "generated"]
    assert all(k.source and "void " in k.source and k.trace for k in generated)
    assert all(k.source is None for k in kernels if k.kind == "library")
    if name in TRANSFORMERS:  # residual add + layer norm at least, in every layer
        assert any(k.ops == ("add", "layer_norm") for k in generated)
        assert source_calls(compiled.source) == len(generated)


def source_calls(source: str) -> int:
    return sum(1 for line in source.splitlines() if "KERNEL" in line and "(" in line)


def test_kiln_compile_reports_the_kernels(options: kiln.Options) -> None:
    model, inputs = kiln.models.build("gpt2", quick=True)
    compiled = kiln.compile(model, inputs, options)
    with torch.no_grad():
        assert support.relative_error(compiled(*inputs), model(*inputs)) < TOLERANCE
    ops = {k.ops for k in compiled.report.kernels if k.kind == "generated"}
    rows = {("add", "layer_norm")}
    # every Linear and the LM head, and attention (its causal masked_fill too) as one kernel
    # with the heads' transpose after it
    assert ops == rows | {("addmm_act",), ("addmm",), ("mm",), ("call", "permute")}
    cache = options.kernel_cache_dir
    default = kiln.compile(model, inputs, kiln.Options(kernel_cache_dir=cache))
    # on at O2; each one kept only where it measured faster than the library calls
    assert {k.ops for k in default.report.kernels if k.kind == "generated"} <= ops
    off = kiln.compile(model, inputs, kiln.Options(generated_kernels=False,
                                                   kernel_cache_dir=cache))
    assert all(k.kind != "generated" for k in off.report.kernels)
    below = kiln.compile(model, inputs, kiln.Options(opt_level=1, kernel_cache_dir=cache))
    assert all(k.kind == "library" for k in below.report.kernels)  # nothing below O2


def test_kiln_explain_kernels_prints_every_kernel(options: kiln.Options, capsys,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln import cli

    monkeypatch.setenv("KILN_CACHE_DIR", options.kernel_cache_dir)
    assert cli.main(["explain", "gpt2", "--quick", "--kernels"]) == 0
    text = capsys.readouterr().out
    generated = [line for line in text.splitlines() if line.startswith("generated")]
    assert text.startswith(f"== kernels: {len(generated)} generated, ")
    assert "(add), " in generated[0] and generated[0].endswith("(layer_norm)")
    assert "  schedule:" in text and "  source:" in text and "void " in text


def test_measured_kernels_carry_their_decision(options: kiln.Options, monkeypatch) -> None:
    """With measurement on (the default), each generated kernel beat the library calls it
    replaces, and both times are in the report; groups that lost say so at their nodes."""
    # keep every decision, steady or not: on a busy machine (CI beside other work) unsteady
    # samples, or threads that waited for a CPU, are not kept, and the recompile below would
    # measure again
    monkeypatch.setattr("kiln.kernels.decide.STEADY", float("inf"))
    monkeypatch.setattr("kiln.cost.measure.WAITED_MAX", float("inf"))
    measured = dataclasses.replace(options, measure_kernels=True)
    case = support.capture("gpt2")
    compiled = compile_graph(case.graph, measured, range(len(case.graph.inputs)))
    with torch.no_grad():
        outputs = compiled(list(case.inputs))
    for actual, expected in zip(outputs, case.expected, strict=True):
        assert support.relative_error(actual, expected) < TOLERANCE
    kernels = compiled.report.kernels
    generated = [k for k in kernels if k.kind == "generated"]
    assert all("measured library" in k.decision and "# used: measured" in k.trace
               for k in generated)
    lost = [k for k in kernels if k.kind == "library" and "slower than the library" in k.decision]
    assert len(generated) + len(lost) > 0  # every candidate group was timed one way or the other
    again = compile_graph(case.graph, measured, range(len(case.graph.inputs)))
    assert all("cached decision" in k.decision for k in again.report.kernels
               if k.kind == "generated")


@pytest.mark.parametrize("name", ["mlp", "bert", "gpt2", "vit_b16"])
def test_generated_gemms_with_packed_weights_match_eager(options: kiln.Options,
                                                         name: str) -> None:
    """Every Linear becomes a generated GEMM on weights packed at compile time (its bias and
    activation in the write-back), and the model still matches eager."""
    gemm = dataclasses.replace(options, generated_gemm=True)
    case = support.capture(name)
    compiled = compile_graph(case.graph, gemm, range(len(case.graph.inputs)))
    with torch.no_grad():
        outputs = compiled(list(case.inputs))
    for actual, expected in zip(outputs, case.expected, strict=True):
        assert support.relative_error(actual, expected) < TOLERANCE
    report = compiled.report
    left = [k for k in report.kernels if k.kind == "library"
            and k.ops[0] in ("mm", "addmm", "addmm_act")]
    gemms = [k for k in report.kernels if k.kind == "generated" and "gemm_plan" in k.trace]
    assert gemms and all("not lowerable" in k.decision for k in left), [k.decision for k in left]
    assert report.packed_weight_bytes > 0


def test_a_weight_changed_in_place_is_packed_again(options: kiln.Options) -> None:
    """Packed weights are copies: a weight the user changes after compiling leads to a
    recompile (the version-counter check), so the GEMM reads the new values."""
    model, inputs = kiln.models.build("mlp", quick=True)
    compiled = kiln.compile(model, inputs, dataclasses.replace(options, generated_gemm=True))
    assert compiled.report.graphs[0].packed_weight_bytes > 0
    with torch.no_grad():
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        first.weight.mul_(-2.0)
        assert support.relative_error(compiled(*inputs), model(*inputs)) < TOLERANCE
