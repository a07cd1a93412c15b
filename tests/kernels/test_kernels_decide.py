"""When the compile-time measurement of a kernel against its library call may stop early:
only where no further round could change which contender is chosen."""

from __future__ import annotations

from kiln.cost.measure import Timing
from kiln.kernels.decide import _settled


def _t(*ms: float) -> Timing:
    return Timing([m * 1e-3 for m in ms])


def test_a_clear_win_and_a_clear_loss_are_settled() -> None:
    library = _t(1.00, 1.02, 1.05)
    assert _settled(library, [_t(0.80, 0.82, 0.85)], [0.95])  # all below 0.95 x 1.00
    assert _settled(library, [_t(1.20, 1.30, 1.25)], [0.95])  # all above 0.95 x 1.05


def test_samples_on_both_sides_of_the_margin_are_not() -> None:
    library = _t(1.00, 1.02, 1.05)
    assert not _settled(library, [_t(0.90, 0.96, 0.97)], [0.95])  # 0.96 > 0.95, < 0.9975
    assert not _settled(library, [_t(0.93, 0.94, 0.96)], [0.95])


def test_two_winners_must_be_ranked_by_every_sample() -> None:
    library = _t(2.0, 2.1, 2.2)
    apart, close = _t(1.0, 1.1, 1.2), _t(1.15, 1.3, 1.4)
    assert _settled(library, [apart, _t(1.3, 1.4, 1.5)], [0.95, 0.95])
    assert not _settled(library, [apart, close], [0.95, 0.95])


def test_errors_and_a_failed_library_call() -> None:
    failed = Timing(error=RuntimeError("boom"))
    assert _settled(_t(1.0, 1.1), [failed, _t(0.5, 0.6)], [0.95, 0.95])
    assert not _settled(failed, [_t(0.5, 0.6)], [0.95])
