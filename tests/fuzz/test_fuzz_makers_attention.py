"""The attention maker: ATen's fused attention calls laid out as models lay them out, and a
seeded slice of such graphs through the attention kernels with no mismatch."""

from __future__ import annotations

import functools

import pytest
import torch

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.fuzz.case import Case
from kiln.fuzz.driver import FuzzSettings, run_fuzz
from kiln.fuzz.generate import generate_case
from kiln.fuzz.makers_attention import SDPA
from kiln.ir import Op, verify
from kiln.ir.interp import interpret
from kiln.options import Options

GRAPHS = 150


@functools.cache
def sample() -> tuple[Case, ...]:
    return tuple(generate_case(11, i, ops=(Op.CALL,)) for i in range(GRAPHS))


def calls():
    return [n for case in sample() for n in case.graph.nodes
            if n.op is Op.CALL and n.attrs.target is SDPA]


def test_calls_take_the_masks_layouts_and_shapes_models_give():
    found = calls()
    assert len(found) > 50
    kwargs = [dict(n.attrs.kwargs) for n in found]
    masks = [n.inputs[3].type for n in found if len(n.inputs) == 4]
    assert {t.dtype.name for t in masks} >= {"BOOL", "F32"}
    assert any(t.shape[:-1] == (t.shape[0], 1, 1) for t in masks)  # a padded batch's
    assert any(n.attrs.args[5] for n in found)  # is_causal
    assert any(k.get("enable_gqa") for k in kwargs)
    assert any(n.inputs[1].type.shape[1] < n.inputs[0].type.shape[1] for n in found)
    assert any("scale" in k for k in kwargs)
    # heads split out of a projection's rows, and one part of a merged projection
    assert any(n.inputs[0].node.op is Op.PERMUTE for n in found)
    assert any(v.node.op is Op.PERMUTE and v.node.inputs[0].node.op is Op.SELECT
               for n in found for v in n.inputs[:3])
    queries = {n.inputs[0].type.shape[2] for n in found}
    assert min(queries) < 16 < max(queries)  # the few-queries kernel, several query blocks
    assert any(n.inputs[2].type.shape[3] % 16 == 0 for n in found)  # whole vectors


def test_the_decomposed_form_is_the_chain_the_attention_pass_fuses():
    from kiln.passes.attention import fuse_attention

    chains = fused = 0
    for case in sample()[:60]:
        softmaxes = [n for n in case.graph.nodes if n.op is Op.SOFTMAX]
        chains += len(softmaxes)
        after = fuse_attention(case.graph, Options(measure_kernels=False))
        fused += sum(n.op is Op.CALL and "attention" in str(n.attrs.target)
                     for n in after.nodes) - len([n for n in case.graph.nodes
                                                   if n.op is Op.CALL
                                                   and "attention" in str(n.attrs.target)])
    assert chains >= 5 and fused >= 3  # (a chain with a second reader stays as it is)


def test_graphs_are_well_typed_and_mostly_run():
    ran = 0
    for case in sample()[:60]:
        verify(case.graph)
        try:
            interpret(case.graph, case.materialize())
            ran += 1
        except RuntimeError:
            pass  # the reference itself refuses (counted as invalid by the fuzzer)
    assert ran >= 55


def test_a_seeded_attention_slice_has_no_mismatch(tmp_path):
    cache = str(tmp_path / "kernels")
    if isinstance(toolchain(Options(kernel_cache_dir=cache)), CompilerUnavailable):
        pytest.skip("no C compiler")
    settings = FuzzSettings(graphs=30, seed=11, jobs=0, configs=("O2+kernels",),
                            ops=("call",), cache_dir=cache, out_dir=str(tmp_path / "out"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        summary = run_fuzz(settings)
    finally:
        torch.set_num_threads(threads)
    assert not summary.failures, summary.text()
    counts = summary.configs["O2+kernels"]
    assert counts["generated"] >= 12  # the attention kernels ran
    assert counts["near"] >= 12  # and their outputs were compared
