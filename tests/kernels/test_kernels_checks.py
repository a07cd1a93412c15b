"""A kernel's correctness check is asked once: its answer is kept in the decisions database
under a key of everything it depends on; layers with ordinary weights share it, and a weight
with an infinity, a NaN or a huge value asks on its own values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kiln.ir import parse_graph
from kiln.ir.graph import Graph
from kiln.kernels import checks as checks_module
from kiln.kernels.checks import Checks
from kiln.kernels.decide import Decisions
from kiln.kernels.gemm import gemm_candidate
from kiln.kernels.outcome import Built
from kiln.options import Options
from kiln.passes.partition import gemms


def _graph(w: torch.Tensor) -> Graph:
    text = ("graph(%x: f32[9, 24]) {\n  %w = constant {name='w'} : f32[24, 40]\n"
            "  %b = constant {name='b'} : f32[40]\n"
            "  %y = addmm(%b, %x, %w) {beta=1, alpha=1} : f32[9, 40]\n  return %y\n}")
    return parse_graph(text, {"w": w, "b": torch.ones(40)})


class _Unasked(Checks):
    def agrees(self, graph: Graph, built: Built) -> bool:
        return True


def _built(graph: Graph, options: Options) -> Built:
    """The graph's GEMM kernel, built without a check (the tests ask for theirs)."""
    built = gemm_candidate(graph, gemms(graph)[0], options, _Unasked())
    assert isinstance(built, Built)
    return built


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The answers `agrees_with_library` gave, one per check actually run."""
    ran: list[bool] = []
    real = checks_module.agrees_with_library

    def agrees(graph: Graph, built: Built) -> bool:
        ran.append(real(graph, built))
        return ran[-1]

    monkeypatch.setattr(checks_module, "agrees_with_library", agrees)
    return ran


def test_an_answer_is_kept_across_compiles(kernel_options: Options, tmp_path: Path,
                                           counted: list[bool]) -> None:
    graph = _graph(torch.randn(24, 40))
    built = _built(graph, kernel_options)
    db = tmp_path / "decisions.sqlite"
    assert Checks(Decisions(db)).agrees(graph, built) and counted == [True]
    assert Checks(Decisions(db)).agrees(graph, built)  # a new compile: read, not run
    assert counted == [True]


def test_layers_with_ordinary_weights_share_one_check(kernel_options: Options, tmp_path: Path,
                                                      counted: list[bool]) -> None:
    """Two layers with the same kernel and other finite weights: one check serves both
    (a model's repeated layers), in one compile and the next."""
    db = tmp_path / "decisions.sqlite"
    first, second = _graph(torch.randn(24, 40)), _graph(torch.randn(24, 40) * 1e6)
    checks = Checks(Decisions(db))
    assert checks.key(first, _built(first, kernel_options)) == \
        checks.key(second, _built(second, kernel_options))
    for graph in (first, second):
        assert checks.agrees(graph, _built(graph, kernel_options))
    assert Checks(Decisions(db)).agrees(second, _built(second, kernel_options))
    assert counted == [True]


@pytest.mark.parametrize("special", [float("inf"), float("-inf"), float("nan"), 1e30])
def test_a_weight_with_a_special_value_is_checked_on_its_values(
        kernel_options: Options, tmp_path: Path, counted: list[bool], special: float) -> None:
    """An infinity, a NaN or a value past `ORDINARY_BOUND` keys the check by the weight's
    values: not the ordinary layers' answer, and another place of the value is another
    check."""
    db = tmp_path / "decisions.sqlite"
    ordinary = torch.randn(24, 40)
    odd, elsewhere = ordinary.clone(), ordinary.clone()
    odd[3, 5] = special
    elsewhere[7, 1] = special
    checks = Checks(Decisions(db))
    graphs = [_graph(w) for w in (ordinary, odd, elsewhere, odd.clone())]
    keys = [checks.key(g, _built(g, kernel_options)) for g in graphs]
    assert len(set(keys[:3])) == 3 and keys[3] == keys[1]
    for graph in graphs:
        checks.agrees(graph, _built(graph, kernel_options))
    assert len(counted) == 3


def test_a_weights_key_follows_its_layout() -> None:
    """The same ordinary values seen with other strides (a transposed weight) are another
    key: the kernel's packing reads them through those strides."""
    from kiln.kernels.checks import weight_key

    w = torch.randn(8, 8)
    assert weight_key(w) == weight_key(torch.randn(8, 8))
    assert weight_key(w.t()) != weight_key(w)
    assert weight_key(torch.empty(0, 3)) == repr((3, 1))  # (no values: its layout alone)
    index = torch.tensor([0, 2, 1])  # (integers: their values decide what a kernel reads)
    assert weight_key(index) != weight_key(torch.tensor([0, 1, 2]))


def test_a_transposed_weight_is_scanned_in_memory_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan for large or non-finite values reads a transposed Linear weight in the order
    of its memory (strided, it took 19x as long), and still finds what is in it."""
    from kiln.kernels.checks import weight_key

    scanned = []
    aminmax = torch.aminmax
    monkeypatch.setattr(checks_module.torch, "aminmax",
                        lambda t: scanned.append(t.is_contiguous()) or aminmax(t))
    w = torch.randn(12, 5)
    ordinary = weight_key(w.t())
    w[3, 4] = float("inf")
    assert weight_key(w.t()) != ordinary  # (its values' digest now)
    assert scanned == [True, True]


def test_a_disagreement_is_kept_too(kernel_options: Options, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph(torch.randn(24, 40))
    built = _built(graph, kernel_options)
    db = tmp_path / "decisions.sqlite"
    monkeypatch.setattr(checks_module, "agrees_with_library", lambda g, b: False)
    assert not Checks(Decisions(db)).agrees(graph, built)
    monkeypatch.setattr(checks_module, "agrees_with_library", lambda g, b: True)
    assert not Checks(Decisions(db)).agrees(graph, built)  # kept: not asked again
    assert Checks().agrees(graph, built)  # no database: asked


def test_an_unusable_database_costs_the_answers_only(kernel_options: Options, tmp_path: Path,
                                                     counted: list[bool]) -> None:
    graph = _graph(torch.randn(24, 40))
    built = _built(graph, kernel_options)
    blocked = tmp_path / "file"
    blocked.write_text("")
    for _ in range(2):  # its directory is a file: nothing is kept, every compile checks
        assert Checks(Decisions(blocked / "decisions.sqlite")).agrees(graph, built)
    assert counted == [True, True]


def test_a_weights_digest_follows_its_values_and_never_copies_a_transposed_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal values in the same layout: equal digests; one changed value, or the same bytes
    read with other strides: another. A transposed weight is hashed in place (no copy); a
    slice of a larger storage as its contiguous copy."""
    from kiln.kernels.checks import weight_digest

    torch.manual_seed(0)
    w = torch.randn(48, 32)
    t = w.t()
    assert weight_digest(t) == weight_digest(w.clone().t())
    assert weight_digest(t) != weight_digest(w)  # (the same storage, other strides)
    changed = w.clone()
    changed[5, 7] += 1.0
    assert weight_digest(changed.t()) != weight_digest(t)
    piece = w[:, :16]  # (a slice: the storage is twice its size)
    assert weight_digest(piece) == weight_digest(piece.contiguous())
    monkeypatch.setattr(torch.Tensor, "contiguous",
                        lambda self, *a, **k: pytest.fail("copied a transposed weight"))
    weight_digest(t)
    assert weight_digest(torch.empty(0, 3)) == weight_digest(torch.empty(3, 0))


def test_a_large_weights_digest_hashes_its_pieces_in_parallel_and_follows_every_piece(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight over one piece is hashed piece by piece: the same values give the same digest
    on one thread or two, and a change in any piece, the last (short) one included, gives
    another."""
    from kiln.kernels import checks

    monkeypatch.setattr(checks, "_PIECE", 1 << 10)  # (4 KiB weights make several pieces)
    torch.manual_seed(0)
    w = torch.randn(3, 1000)  # 12000 bytes: 11 full pieces and one of 736 bytes
    digest = checks.weight_digest(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert checks.weight_digest(w.clone()) == digest
    finally:
        torch.set_num_threads(threads)
    for flat in (0, 1500, 2999):
        changed = w.clone()
        changed.view(-1)[flat] = -changed.view(-1)[flat]
        assert checks.weight_digest(changed) != digest
    assert checks.weight_digest(w.t()) != checks.weight_digest(w.t().contiguous())
