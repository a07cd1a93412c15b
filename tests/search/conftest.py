"""Graphs the search tests share."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import Graph
from kiln.ir.builder import GraphBuilder
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType


@pytest.fixture
def weight_chain() -> Graph:
    """x @ W1 @ W2 with constant weights: (x W1) W2 costs two GEMMs at run time, x (W1 W2)
    one (the weight product folds)."""
    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((4, 64), DType.F32))
    g = torch.Generator().manual_seed(0)
    w1 = b.constant("w1", torch.randn(64, 64, generator=g))
    w2 = b.constant("w2", torch.randn(64, 64, generator=g))
    return b.build(b.node(Op.MM, b.node(Op.MM, x, w1).out(), w2).out())
