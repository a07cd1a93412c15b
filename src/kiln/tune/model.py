"""The learned cost model: gradient-boosted trees (LightGBM) from program features
(`kiln.tune.features`) to a candidate's relative speed.

LightGBM rather than XGBoost: its wheel is a few MB where XGBoost's is over 100 MB with GPU
libraries a CPU tuner never loads, it trains in milliseconds on the few hundred records a
tuning run makes, and it has the same tree model MetaSchedule uses.

The target, as in MetaSchedule, is normalized throughput: for each workload, its fastest
measured time over the candidate's time, in (0, 1]. Times of different kernels never meet
in one number, so one model learns from every workload and ranks candidates of a new one.
The model trains again from all records after each measured batch (online) and is saved as
LightGBM's text file next to the tuning database.

    model = CostModel.load_or_new(path)
    model.fit(records_with_features)        # [(workload, features, median seconds), ...]
    scores = model.predict([features, ...])  # higher is faster
    ranking_quality(model, held_out)         # Kendall tau and top-k recall
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CostModel", "Measured", "RankingQuality", "ranking_quality"]

MIN_RECORDS = 8  # below this the model predicts nothing useful: the search explores at random


@dataclass(frozen=True)
class Measured:
    workload: str
    features: tuple[float, ...]
    seconds: float  # median; math.inf for a failed candidate


class CostModel:
    """Predicts relative speed from features; untrained, it scores every candidate 0."""

    def __init__(self, booster: object | None = None) -> None:
        self.booster = booster

    @property
    def trained(self) -> bool:
        return self.booster is not None

    @staticmethod
    def load_or_new(path: str | os.PathLike[str] | None) -> CostModel:
        if path is None or not Path(path).is_file():
            return CostModel()
        import lightgbm

        try:
            return CostModel(lightgbm.Booster(model_file=str(path)))
        except lightgbm.basic.LightGBMError:
            return CostModel()  # a damaged model file costs a retraining, nothing more

    def save(self, path: str | os.PathLike[str]) -> None:
        if self.booster is not None:
            tmp = Path(f"{path}.tmp")
            self.booster.save_model(str(tmp))  # type: ignore[attr-defined]
            os.replace(tmp, path)

    def fit(self, records: Sequence[Measured]) -> CostModel:
        """Train on every record (failed ones count as speed 0); returns self."""
        rows, targets = training_set(records)
        if len(rows) < MIN_RECORDS or len(set(targets)) < 2:
            return self
        import lightgbm
        import numpy as np

        data = lightgbm.Dataset(np.asarray(rows, dtype=np.float64),
                                label=np.asarray(targets), params={"verbose": -1})
        params = {"objective": "regression", "learning_rate": 0.1, "num_leaves": 15,
                  "min_data_in_leaf": 2, "min_data_in_bin": 1, "feature_fraction": 0.9,
                  "verbose": -1, "num_threads": 1, "deterministic": True, "seed": 0}
        self.booster = lightgbm.train(params, data, num_boost_round=60)
        return self

    def predict(self, rows: Sequence[Sequence[float]]) -> list[float]:
        if self.booster is None or not rows:
            return [0.0] * len(rows)
        import numpy as np

        matrix = np.asarray(rows, dtype=np.float64)
        return [float(x) for x in self.booster.predict(matrix)]  # type: ignore[attr-defined]


def training_set(records: Sequence[Measured]) -> tuple[list[list[float]], list[float]]:
    best: dict[str, float] = {}
    for r in records:
        if math.isfinite(r.seconds):
            best[r.workload] = min(best.get(r.workload, math.inf), r.seconds)
    rows, targets = [], []
    for r in records:
        if r.workload in best:
            rows.append(list(r.features))
            targets.append(best[r.workload] / r.seconds if math.isfinite(r.seconds) else 0.0)
    return rows, targets


@dataclass(frozen=True)
class RankingQuality:
    kendall_tau: float  # rank agreement of predicted and measured speed, in [-1, 1]
    top_k_recall: float  # share of the truly fastest k the model also puts in its top k
    k: int
    candidates: int


def ranking_quality(model: CostModel, held_out: Sequence[Measured], k: int = 5
                    ) -> RankingQuality:
    """How well ``model`` ranks candidates it was not trained on (one workload's, or mixed:
    speeds are normalized per workload first)."""
    from scipy.stats import kendalltau

    rows, speeds = training_set(held_out)
    predicted = model.predict(rows)
    tau = kendalltau(predicted, speeds).statistic if len(rows) > 1 else math.nan
    k = min(k, len(rows))
    truly = set(sorted(range(len(rows)), key=lambda i: -speeds[i])[:k])
    chosen = set(sorted(range(len(rows)), key=lambda i: -predicted[i])[:k])
    recall = len(truly & chosen) / k if k else math.nan
    return RankingQuality(float(tau), recall, k, len(rows))
