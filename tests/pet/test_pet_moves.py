"""PET as a move of the backtracking search: the search takes a corrected mutant when its cost
model prefers it, and the graph it returns computes the original's values."""

from __future__ import annotations

import torch
from pet_cases import assert_same_floats, conv_graph

from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.pet.moves import PetMoves
from kiln.search.backtrack import Limits, backtrack


class _BatchedConvsAreDear:
    """A made-up cost model: a convolution over several images with more than two rows costs
    10, any other convolution 1, everything else nothing."""

    name = "test"

    def node_seconds(self, node) -> float:
        if node.op is not Op.CONVOLUTION:
            return 0.0
        n, _, h, _ = node.type.shape
        return 10.0 if n > 1 and h > 2 else 1.0


def test_the_search_takes_a_pet_move_its_model_prefers():
    graph = conv_graph(4, 2, 6, 5)
    moves = PetMoves(Options(pet=True))
    names = {m.rule for m in moves(graph)}
    assert {"pet:merge_batch(h)", "pet:split(2, 2, naive)"} <= names
    outcome = backtrack(graph, [], Options(), _BatchedConvsAreDear(), Limits(expansions=20),
                        moves=moves)
    assert outcome.path and outcome.path[0][0] == "pet:merge_batch(h)"
    assert outcome.cost_after < outcome.cost_before
    x = torch.randn(4, 2, 6, 5)
    x[0, 0, 5, 0] = float("nan")  # on a seam: the corrections must carry it
    assert_same_floats(interpret(outcome.graph, [x])[0], interpret(graph, [x])[0])


def test_with_no_time_to_verify_the_moves_change_nothing():
    graph = conv_graph(2, 2, 4, 4)
    outcome = backtrack(graph, [], Options(), _BatchedConvsAreDear(), Limits(expansions=5),
                        moves=PetMoves(Options(pet=True), seconds=0.0))
    # no time to verify a single structure: no move, the input is kept
    assert outcome.graph is graph and outcome.path == ()
