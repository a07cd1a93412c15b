"""PET as one more move of the backtracking search (`kiln.search.backtrack`), as the issue and
PET's own design have it: from a graph, each verified mutant-plus-corrections of one of its
subprograms is a neighbouring graph, named ``pet:<mutant>`` in the search path.

    moves = PetMoves(seconds=3.0)
    backtrack(graph, rules, options, model, limits, moves=moves)

Verification (regions, corrections, float and NaN/inf checks: `select.verify_mutant`) runs once
per distinct subprogram structure and is cached; the search's cost model, not this module,
decides whether a move is taken. Mutants tagged ``fast_math`` are offered only with
``Options.fast_math``. After ``seconds`` spent verifying, no new structure is verified (known
ones still give moves).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from kiln.ir.graph import Graph, substitute
from kiln.options import Options
from kiln.pet.mutate import mutants
from kiln.pet.select import parented, structure, verify_mutant
from kiln.pet.split import split_program
from kiln.rewrite.engine import Move

__all__ = ["PetMoves"]


class PetMoves:
    def __init__(self, options: Options, seconds: float = 3.0) -> None:
        self.options = options
        self.seconds = seconds
        self.spent = 0.0
        self._verified: dict[tuple, list[tuple[str, Graph]]] = {}

    def __call__(self, graph: Graph) -> Iterator[Move]:
        for sub in split_program(graph):
            key = structure(sub)
            if key not in self._verified:
                if self.spent >= self.seconds:
                    continue
                start = time.perf_counter()
                self._verified[key] = self._verify(sub)
                self.spent += time.perf_counter() - start
            for name, fixed in self._verified[key]:
                mapping = dict(zip(sub.outputs, parented(sub, fixed)))
                yield Move(f"pet:{name}", sub.anchor.name, substitute(graph, mapping))

    def _verify(self, sub) -> list[tuple[str, Graph]]:
        found = []
        for mutant in mutants(sub):
            checked = verify_mutant(sub, mutant)
            if isinstance(checked, str):
                continue
            fixed, _, safety = checked
            if safety == "ieee" or self.options.fast_math:
                found.append((mutant.name, fixed))
        return found
