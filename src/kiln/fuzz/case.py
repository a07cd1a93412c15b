"""A fuzz case: a graph and the inputs it runs on (values, and the layout each arrives in)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.fuzz.values import CONTIGUOUS, Layout, LayoutKind, materialize
from kiln.ir.graph import Graph


@dataclass(frozen=True)
class FuzzInput:
    values: torch.Tensor  # the logical values, contiguous
    layout: Layout = CONTIGUOUS


@dataclass(frozen=True)
class Case:
    graph: Graph
    inputs: tuple[FuzzInput, ...]
    origin: str = ""  # where it came from: "seed 7 graph 123", "shrunk from ...", a file

    def materialize(self) -> list[torch.Tensor]:
        """Fresh input tensors, each in its layout (aliased inputs are one tensor)."""
        made: list[torch.Tensor] = []
        for x in self.inputs:
            made.append(materialize(x.values, x.layout, made))
        return made

    def describe_inputs(self) -> str:
        return ", ".join(f"{n.name}: {x.layout}" for n, x in zip(self.graph.inputs, self.inputs)
                         if x.layout.kind is not LayoutKind.CONTIGUOUS) or "all contiguous"
