"""Random convolution and GEMM subprograms: every mutant kiln generates, once corrected, must
compute the original's values on float inputs with NaN/inf/-0.0, at sizes down to 1 and
smaller than the kernel. 30 cases by default; KILN_PET_CASES=N runs N."""

from __future__ import annotations

import os
import random

import pytest
import torch
from pet_cases import assert_same_floats, float_inputs

from kiln.ir.attrs import AddmmActAttrs, ConvActAttrs
from kiln.ir.builder import GraphBuilder
from kiln.ir.infer import InferenceError
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.pet.mutate import mutants
from kiln.pet.select import verify_mutant
from kiln.pet.split import split_program

CASES = int(os.environ.get("KILN_PET_CASES", "30"))


def _random_graph(rng: random.Random):
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    b = GraphBuilder()
    if rng.random() < 0.3:
        m, k, n = rng.randint(1, 40), rng.randint(1, 9), rng.randint(1, 40)
        x = b.input("x", TensorType((m, k), DType.F32))
        bias = b.constant("b", torch.randn(n, generator=gen))
        wt = b.constant("wt", torch.randn(k, n, generator=gen))
        attrs = AddmmActAttrs(rng.choice([Op.RELU, Op.GELU, Op.TANH]))
        return b.build(b.op(Op.ADDMM_ACT, bias, x, wt, attrs=attrs))
    c = rng.randint(1, 4)
    groups = rng.choice([1, c])
    k_out = c * rng.randint(1, 2) if groups > 1 else rng.randint(1, 5)
    kernel, stride, pad, dil = (rng.randint(1, 4), rng.randint(1, 2), rng.randint(0, 2),
                                rng.randint(1, 2))
    shape = (rng.randint(1, 3), c, rng.randint(1, 9), rng.randint(1, 9))
    x = b.input("x", TensorType(shape, DType.F32))
    w = b.constant("w", torch.randn(k_out, c // groups, kernel, kernel, generator=gen))
    operands = [x, w]
    has_bias = rng.random() < 0.7
    if has_bias:
        operands.append(b.constant("b", torch.randn(k_out, generator=gen)))
    act = rng.choice([None, Op.RELU, Op.SIGMOID])
    attrs = ConvActAttrs((stride, stride), (pad, pad), (dil, dil), groups, has_bias, False, act)
    y = b.op(Op.CONV_ACT, *operands, attrs=attrs)
    if rng.random() < 0.5:
        y = b.op(Op.MUL, b.op(Op.ADD, y, y), b.scalar(0.5))
    return b.build(y)


@pytest.mark.parametrize("seed", range(CASES))
def test_every_corrected_mutant_computes_the_original(seed):
    rng = random.Random(seed)
    try:
        graph = _random_graph(rng)
    except InferenceError:
        pytest.skip("the drawn convolution has no output (kernel larger than the padded input)")
    (sub,) = split_program(graph)
    checked = 0
    for mutant in mutants(sub, limit=100):
        result = verify_mutant(sub, mutant)
        assert result != "wrong on float inputs", mutant.name  # regions missed a position
        if isinstance(result, str):
            continue
        fixed, _, safety = result
        assert safety == "ieee", mutant.name
        for s in range(2):
            inputs = float_inputs(sub, specials=True, seed=s)
            with torch.no_grad():
                assert_same_floats(interpret(fixed, inputs)[0], interpret(sub.graph, inputs)[0])
        checked += 1
    assert checked or not mutants(sub)
