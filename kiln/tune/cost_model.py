"""The learned cost model: gradient-boosted trees (LightGBM) on TIR features.

It predicts a candidate's *speed-up over its kernel's default schedule* (as a logarithm,
``log(default time / time)``) from :func:`kiln.tune.features.extract_features`, so one model
learns from every kernel measured so far, whatever its size; it is refitted online as
measurements arrive (:meth:`CostModel.update`) and only ranks candidates (higher is faster).
Until it has seen :data:`MIN_SAMPLES` measurements it predicts zero for all (the search then
measures its random picks).

LightGBM is the optional extra ``tune`` (``pip install -e ".[tune]"``); without it a
:class:`~kiln.ir.KilnError` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir.errors import KilnError

__all__ = ["MIN_SAMPLES", "CostModel", "spearman"]

#: Measurements before the model is fitted at all.
MIN_SAMPLES = 8


def _lightgbm() -> Any:
    try:
        import lightgbm
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise KilnError("kiln.tune's cost model needs LightGBM: pip install -e \".[tune]\" "
                        "(or pip install lightgbm)") from err
    return lightgbm


class CostModel:
    """Online gradient-boosted regression of log speed-up on TIR features."""

    def __init__(self, seed: int = 0, rounds: int = 60):
        self._lgb = _lightgbm()
        self.seed, self.rounds = seed, rounds
        self._x: list[np.ndarray] = []
        self._y: list[float] = []
        self._booster: Any = None

    @property
    def samples(self) -> int:
        return len(self._y)

    def update(self, features: Sequence[np.ndarray], times: Sequence[float],
               default_s: float) -> None:
        """Add measured candidates of one kernel (``times`` in seconds, its default
        schedule's ``default_s``) and refit."""
        for f, t in zip(features, times):
            if t > 0 and default_s > 0:
                self._x.append(np.asarray(f, dtype=np.float64))
                self._y.append(math.log(default_s / t))
        self.fit()

    def fit(self) -> None:
        if len(self._y) < MIN_SAMPLES:
            return
        data = self._lgb.Dataset(np.stack(self._x), np.asarray(self._y),
                                 params={"min_data_in_bin": 1, "verbose": -1})
        params = {"objective": "regression", "learning_rate": 0.1, "num_leaves": 15,
                  "min_data_in_leaf": 2, "min_data_in_bin": 1, "feature_fraction": 0.9,
                  "bagging_fraction": 0.9, "bagging_freq": 1, "seed": self.seed,
                  "num_threads": 1, "verbose": -1}
        self._booster = self._lgb.train(params, data, num_boost_round=self.rounds)

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """Predicted log speed-up over the default for each candidate (0 before fitting)."""
        if not len(features):
            return np.zeros(0)
        if self._booster is None:
            return np.zeros(len(features))
        return np.asarray(self._booster.predict(np.stack(features)), dtype=np.float64)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        same = x == value
        if same.sum() > 1:
            ranks[same] = ranks[same].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two sequences (NaN when either is constant)."""
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b, dtype=np.float64))
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])
