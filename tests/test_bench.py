"""Tests for the benchmark runner, on the quick MLP with a short timing budget."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest
import torch

from kiln import bench
from kiln.bench import BenchResult, PeerUnavailable, TimingConfig
from kiln.cli import markdown_table

FAST = TimingConfig(warmup=1, min_rounds=3, target_s=0.02, cap_s=1.0, block_s=0.0, quiet_s=0.0)
Run = tuple[BenchResult, list[bench.Progress]]


def _raise(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    raise RuntimeError("peer exploded")


def _unavailable(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    raise PeerUnavailable("not installed")


@pytest.fixture(scope="module")
def mlp_result() -> Run:
    events: list[bench.Progress] = []
    peers = {**bench.PEERS, "boom": _raise, "absent": _unavailable}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "PEERS", peers)
        (result,) = bench.run_bench(["mlp"], quick=True, peers=["boom", "absent", "nope"],
                                    opt_levels=[0, 2], timing=FAST, progress=events.append)
    return result, events


def test_contenders_are_timed_and_accurate(mlp_result: Run) -> None:
    result, _ = mlp_result
    assert result.error is None and result.model == "mlp" and result.quick
    assert result.rounds >= FAST.min_rounds
    eager = result.contender("eager")
    assert eager is not None and eager.speedup == 1.0
    for name in ("kiln-O0", "kiln-O2"):
        k = result.contender(name)
        assert k is not None and k.error is None, k
        assert k.median_ms > 0 and k.min_ms <= k.median_ms and k.runs == result.rounds
        assert math.isclose(k.speedup, eager.median_ms / k.median_ms)
        assert k.rel_err < 1e-5 and k.max_abs_err < 1e-4
        assert k.compile_s > 0
        rate = result.gflops(k)  # the model's counted FLOPs over the median
        assert rate is not None and math.isclose(rate, result.gflop / (k.median_ms / 1e3))
        assert k.kiln is not None and k.kiln.nodes_before >= k.kiln.nodes_after > 0
        assert k.kiln.intermediate_bytes > 0 and k.kiln.fallbacks == []
    assert result.gflop is not None and result.gflop > 0  # torch's flop counter on eager


def test_failing_peers_are_reported_not_raised(mlp_result: Run) -> None:
    result, _ = mlp_result
    boom, absent, nope = (result.contender(n) for n in ("boom", "absent", "nope"))
    assert "peer exploded" in boom.error and boom.median_ms is None
    assert absent.note == "not installed" and absent.error is None and absent.median_ms is None
    assert "unknown peer" in nope.error and "inductor" in nope.error


def test_json_round_trip(mlp_result: Run) -> None:
    result, _ = mlp_result
    text = json.dumps(result.to_dict())
    assert BenchResult.from_dict(json.loads(text)) == result


def test_progress_reaches_the_end(mlp_result: Run) -> None:
    _, events = mlp_result
    fractions = [e.fraction for e in events]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert [e.step for e in events][:1] == ["build"] and events[-1].step == "done"


def test_table_has_one_row_per_opt_level_and_notes(mlp_result: Run) -> None:
    result, _ = mlp_result
    table = markdown_table([result])
    assert "| mlp -O0 " in table and "| mlp -O2 " in table
    assert "* mlp, boom: compile failed: RuntimeError: peer exploded" in table
    assert "* mlp, absent: not installed" in table


def test_a_rate_above_the_peak_gets_a_note(mlp_result: Run) -> None:
    """DeBERTa's position projections run in eager but are folded by kiln: its rate over
    eager's FLOPs can pass the FMA peak, which the table must not leave unexplained."""
    result, _ = mlp_result
    kiln_o2 = result.contender("kiln-O2")
    assert kiln_o2 is not None and kiln_o2.median_ms and result.gflop
    above = dataclasses.replace(result, peak_gflops=0.5 * result.gflops(kiln_o2))
    assert "kiln-O2: " in markdown_table([above]) and "above the FMA peak" in \
        markdown_table([above])
    below = dataclasses.replace(result, peak_gflops=2.0 * result.gflops(kiln_o2))
    assert "above the FMA peak" not in markdown_table([below])


def test_unknown_model_is_a_result_with_an_error() -> None:
    (result,) = bench.run_bench(["no_such_model"], quick=True, timing=FAST)
    assert "unknown model" in result.error and "mlp" in result.error
    assert "| no_such_model | error " in markdown_table([result])


def test_compare_flattens_outputs() -> None:
    ref = (torch.tensor([3.0, 4.0]), torch.tensor([0.0]))
    assert bench.compare([torch.tensor([3.0, 4.0]), torch.tensor([0.0])], ref) == (0.0, 0.0)
    max_abs, rel = bench.compare((torch.tensor([3.0, 4.5]), torch.tensor([0.0])), ref)
    assert max_abs == 0.5 and math.isclose(rel, 0.5 / 5.0)
    with pytest.raises(ValueError):
        bench.compare(torch.zeros(3), ref)


def test_inductor_without_a_compiler_is_skipped_with_a_note(monkeypatch) -> None:
    monkeypatch.setattr(bench.shutil, "which", lambda _name: None)
    (result,) = bench.run_bench(["mlp"], quick=True, peers=["inductor"], timing=FAST)
    inductor = result.contender("inductor")
    assert "no C++ compiler" in inductor.note and inductor.error is None
    assert result.contender("kiln-O2").median_ms > 0


def test_every_row_states_the_best_peak_reading_of_the_run(monkeypatch) -> None:  # noqa: ANN001
    """One low reading of the FMA probe (the core's other hardware thread busy) must not
    inflate a model's '% of peak': the run's best reading serves every row."""
    readings = iter([117.0, 234.0, 230.0])

    def fake_model(name: str, **_: object) -> BenchResult:
        return BenchResult(name, True, 2, peak_gflops=next(readings))

    monkeypatch.setattr(bench, "bench_model", fake_model)
    results = bench.run_bench(["a", "b", "c"], quick=True)
    assert [r.peak_gflops for r in results] == [234.0, 234.0, 234.0]


def test_each_round_is_kept_and_contenders_are_compared_round_by_round(mlp_result: Run
                                                                        ) -> None:
    result, _ = mlp_result
    k = result.contender("kiln-O2")
    assert len(k.samples_ms) == k.runs and math.isclose(k.median_ms,
                                                      statistics.median(k.samples_ms))
    # a machine that slows down half way: the medians' ratio follows the phases (2.0 / 1.2),
    # the rounds' ratios do not (kiln is 0.9 of the peer in every round)
    peer = [1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]
    kiln_times = [0.9 * t for t in peer[:3]] + [0.9 * t for t in peer[3:]]
    fake = BenchResult("m", True, 2, contenders=[
        bench.ContenderResult("eager", 5.0, samples_ms=[5.0] * 7),
        bench.ContenderResult("kiln-O2", statistics.median(kiln_times), samples_ms=kiln_times),
        bench.ContenderResult("peer", statistics.median(peer), samples_ms=peer)])
    paired = fake.paired("kiln-O2", "peer")
    assert paired is not None and math.isclose(paired.ratio, 0.9)
    assert (paired.faster, paired.rounds) == (7, 7)
    assert fake.paired("kiln-O2", "absent") is None
    table = markdown_table([fake])
    assert "kiln / peer (faster in)" in table and "| 0.900 (7/7) " in table
