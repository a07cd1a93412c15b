"""The PET pass (``Options(pet=True)``): partially equivalent mutants with corrections, kept
where they are faster (`kiln.pet`). Off by default: it spends up to `PetSettings.seconds` per
graph testing and timing mutants, and on most graphs at batch 1 nothing pays."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir.graph import Graph
from kiln.options import Options
from kiln.pet.select import PetSettings, PetSummary, optimize


@dataclass(frozen=True)
class PetPass:
    name: str = "pet"
    min_level: int = 2
    why: str = ("mutants with corrections where faster; after merging (mutants of the merged "
                "contractions), before layout (which converts the mutants' convolutions too)")
    settings: PetSettings = PetSettings()

    def run(self, graph: Graph, options: Options) -> tuple[Graph, PetSummary | None]:
        if not options.pet:
            return graph, None
        return optimize(graph, options, self.settings)
