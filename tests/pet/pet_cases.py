"""Graphs of PET's worked examples, built by hand at any size, and a float comparison that
holds NaN and infinities to the same places."""

from __future__ import annotations

import torch

from kiln.ir import Graph
from kiln.ir.attrs import AddmmAttrs, ConvActAttrs, ConvAttrs
from kiln.ir.builder import GraphBuilder
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.pet.correct import corrected
from kiln.pet.mutate import Mutant, mutants
from kiln.pet.regions import differing_regions
from kiln.pet.split import Subprogram, split_program


def conv_graph(n: int, c: int, h: int, w: int, k: int = 3, kernel: int = 3, stride: int = 1,
               pad: int = 1, relu_residual: bool = False, seed: int = 0) -> Graph:
    """x -> conv(+bias) [-> + x -> relu, fused as conv_act when ``relu_residual``]."""
    gen = torch.Generator().manual_seed(seed)
    b = GraphBuilder()
    x = b.input("x", TensorType((n, c, h, w), DType.F32))
    weight = b.constant("w", torch.randn(k, c, kernel, kernel, generator=gen))
    bias = b.constant("b", torch.randn(k, generator=gen))
    if relu_residual:
        attrs = ConvActAttrs((stride, stride), (pad, pad), (1, 1), 1, True, True, Op.RELU)
        return b.build(b.op(Op.CONV_ACT, x, weight, bias, x, attrs=attrs))
    attrs = ConvAttrs((stride, stride), (pad, pad), (1, 1), False, (0, 0), 1)
    return b.build(b.op(Op.CONVOLUTION, x, weight, bias, attrs=attrs))


def linear_graph(m: int, k: int, n: int, seed: int = 0) -> Graph:
    gen = torch.Generator().manual_seed(seed)
    b = GraphBuilder()
    x = b.input("x", TensorType((m, k), DType.F32))
    wt = b.constant("wt", torch.randn(k, n, generator=gen))
    bias = b.constant("b", torch.randn(n, generator=gen))
    return b.build(b.op(Op.ADDMM, bias, x, wt, attrs=AddmmAttrs()))


def only_subprogram(graph: Graph) -> Subprogram:
    subs = split_program(graph)
    assert len(subs) == 1
    return subs[0]


def mutant_named(sub: Subprogram, name: str) -> Mutant:
    found = {m.name: m for m in mutants(sub, limit=100)}
    assert name in found, f"{name} not among {sorted(found)}"
    return found[name]


def fixed_graph(sub: Subprogram, mutant: Mutant) -> Graph:
    regions = differing_regions(sub.graph, mutant.graph)
    assert regions is not None
    return corrected(sub.graph, mutant.graph, regions.boxes)


def float_inputs(sub: Subprogram, specials: bool, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (node, value) in enumerate(zip(sub.graph.inputs, sub.inputs)):
        if i in sub.constant_inputs:
            out.append(sub.parent.constant(value.node))
            continue
        t = torch.randn(node.type.shape, generator=gen)
        if specials:
            flat = t.view(-1)
            picks = torch.randperm(flat.numel(), generator=gen)[:max(4, flat.numel() // 16)]
            specials_ = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
            flat[picks] = specials_[torch.arange(picks.numel()) % 4]
        out.append(t)
    return out


def assert_same_floats(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf)
    assert torch.equal(got[inf], want[inf])
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-4)


def assert_fixed_equals_original(sub: Subprogram, fixed: Graph) -> None:
    """On plain random floats and on floats with NaN/inf/-0.0 in the inputs."""
    for specials in (False, True):
        inputs = float_inputs(sub, specials)
        with torch.no_grad():
            want = interpret(sub.graph, inputs)
            got = interpret(fixed, inputs)
        for g, w in zip(got, want):
            assert_same_floats(g, w)
