"""Reproducer files: a case as IR text, with its data beside it.

    write_repro(case, "out/seed7-graph123-O2", note="[O2] mismatch ...")
        out/seed7-graph123-O2.kir   the graph, as `kiln.ir.print_graph` writes it
        out/seed7-graph123-O2.pt    inputs (values and layouts), weights, the note
    case, note = read_repro("out/seed7-graph123-O2.kir")

The ``.kir`` file is plain IR text (``kiln explain --ir FILE`` and `kiln.ir.parse_graph` read
it). IR text holds no tensors, so weights and input values live in the ``.pt`` file, saved
with `torch.save` and loaded with ``weights_only=True``. Without one, inputs and weights get
random values of their types.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.values import Layout, LayoutKind, Profile, random_values
from kiln.ir.graph import Graph
from kiln.ir.ops import Op
from kiln.ir.parser import parse_graph
from kiln.ir.printer import print_graph


def data_path(kir: str | Path) -> Path:
    return Path(kir).with_suffix(".pt")


def write_repro(case: Case, stem: str | Path, note: str = "") -> Path:
    """Write ``stem.kir`` and ``stem.pt``; returns the ``.kir`` path."""
    kir = Path(f"{stem}.kir")
    kir.parent.mkdir(parents=True, exist_ok=True)
    kir.write_text(print_graph(case.graph))
    data = {
        "inputs": [(x.values, x.layout.kind.value, x.layout.arg) for x in case.inputs],
        "constants": dict(case.graph.constants),
        "note": note,
        "origin": case.origin,
    }
    torch.save(data, data_path(kir))
    return kir


def read_repro(kir: str | Path) -> tuple[Case, str]:
    """The case a ``.kir`` file and its ``.pt`` file describe, and the note saved with it.
    Without a ``.pt`` file, inputs and weights get random values (seeded by the text)."""
    text = Path(kir).read_text()
    data_file = data_path(kir)
    if data_file.exists():
        data = torch.load(data_file, weights_only=True)
        graph = parse_graph(text, data["constants"])
        inputs = tuple(FuzzInput(values, Layout(LayoutKind(kind), arg))
                       for values, kind, arg in data["inputs"])
        if len(inputs) != len(graph.inputs):
            raise ValueError(f"{data_file} holds {len(inputs)} inputs; the graph takes "
                             f"{len(graph.inputs)}")
        return Case(graph, inputs, str(kir)), str(data.get("note", ""))
    gen = torch.Generator().manual_seed(random.Random(text).randrange(1 << 62))
    graph = with_random_weights(parse_graph(text), text, gen)
    inputs = tuple(FuzzInput(random_values(n.type, Profile.TAME, gen)) for n in graph.inputs)
    return Case(graph, inputs, str(kir)), "no data file: random inputs and weights"


def with_random_weights(graph: Graph, text: str, gen: torch.Generator) -> Graph:
    """``graph`` with a random tensor for every weight its text names but does not hold."""
    constants = dict(graph.constants)
    for node in graph.nodes:
        name = node.attrs.name if node.op is Op.CONSTANT else None  # type: ignore[attr-defined]
        if name is not None and name not in constants:
            constants[name] = random_values(node.type, Profile.TAME, gen)
    return graph.replace(constants=constants)
