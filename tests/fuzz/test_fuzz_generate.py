"""The generator: every op kiln models (or a written reason why not), well-typed graphs, the
shapes, values and layouts the fuzzer promises, and the same case for the same seed."""

from __future__ import annotations

import functools
import math

import torch

from kiln.fuzz.case import Case
from kiln.fuzz.generate import generate_case
from kiln.fuzz.table import EXCLUDED, GENERATED_OPS, MAKERS
from kiln.fuzz.values import LayoutKind, bits
from kiln.ir import Op, print_graph, verify

GRAPHS = 400


@functools.cache
def sample() -> tuple[Case, ...]:
    return tuple(generate_case(3, i) for i in range(GRAPHS))


def test_every_op_has_a_maker_or_a_written_reason():
    assert set(MAKERS) | set(EXCLUDED) == set(Op)
    assert not set(MAKERS) & set(EXCLUDED)
    assert all(reason.strip() for reason in EXCLUDED.values())
    assert set(GENERATED_OPS) == set(MAKERS)


def test_the_generator_covers_every_op_it_claims():
    seen = {n.op for case in sample() for n in case.graph.all_nodes()}
    missing = set(GENERATED_OPS) - seen
    assert not missing, f"never generated in {GRAPHS} graphs: {sorted(o.text for o in missing)}"
    assert {Op.INPUT, Op.CONSTANT, Op.SCALAR} <= seen  # the excluded sources, as operands


def test_graphs_are_well_typed_and_print_back():
    for case in sample()[:100]:
        verify(case.graph)
        assert print_graph(case.graph)
        assert len(case.inputs) == len(case.graph.inputs)
        for node, x in zip(case.graph.inputs, case.inputs):
            assert tuple(x.values.shape) == node.type.shape
            assert x.values.dtype == node.type.dtype.torch


def test_shapes_values_and_layouts_the_fuzzer_promises():
    shapes = [v.type.shape for case in sample() for n in case.graph.all_nodes()
              for v in n.outputs]
    assert any(0 in s for s in shapes) and any(1 in s for s in shapes)
    assert any(s == () for s in shapes)
    assert any(math.prod(s) > 64 for s in shapes)
    kinds = {x.layout.kind for case in sample() for x in case.inputs}
    assert kinds == set(LayoutKind)
    floats = torch.cat([x.values.double().flatten() for case in sample() for x in case.inputs
                        if x.values.is_floating_point()])
    assert floats.isnan().any() and (floats == math.inf).any() and (floats == -math.inf).any()
    zeros = floats[floats == 0]
    assert torch.signbit(zeros).any() and (~torch.signbit(zeros)).any()
    finite = floats[floats.isfinite() & (floats != 0)].abs()
    assert (finite < torch.finfo(torch.float32).smallest_normal).any()  # subnormals
    assert (finite > 1e30).any() and (finite < 1e-30).any()
    broadcasts = [n for case in sample() for n in case.graph.nodes
                  if n.op in (Op.ADD, Op.MUL, Op.SUB) and len(n.inputs) == 2
                  and n.inputs[0].type.shape != n.inputs[1].type.shape]
    assert len(broadcasts) > 20


def test_aliased_inputs_are_one_tensor():
    for case in sample():
        made = case.materialize()
        for i, x in enumerate(case.inputs):
            if x.layout.kind is LayoutKind.ALIAS:
                assert made[i] is made[x.layout.arg]
                return
    raise AssertionError("no aliased input in the sample")


def test_layouts_hold_the_same_values():
    strided = 0
    for case in sample()[:150]:
        for tensor, x in zip(case.materialize(), case.inputs):
            assert tensor.shape == x.values.shape and tensor.dtype == x.values.dtype
            if tensor.is_floating_point():
                assert torch.equal(bits(tensor), bits(x.values))
            else:
                assert torch.equal(tensor, x.values)
            strided += not tensor.is_contiguous()
    assert strided > 20


def test_same_seed_same_case():
    a, b = generate_case(5, 17), generate_case(5, 17)
    assert print_graph(a.graph) == print_graph(b.graph)
    for x, y in zip(a.inputs, b.inputs):
        assert x.layout == y.layout and torch.equal(x.values.isnan(), y.values.isnan())
    assert print_graph(generate_case(5, 18).graph) != print_graph(a.graph)
