"""Task extraction, TIR features, the cost model and the evolutionary search (no measuring:
the tuning loop with real measurements is in test_tune_measure.py)."""

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from kiln.schedule.apply import schedule_with_trace
from kiln.target import Target
from kiln.testing import models
from kiln.tune.cost_model import MIN_SAMPLES, CostModel, spearman
from kiln.tune.features import FEATURE_NAMES, extract_features
from kiln.tune.search import TaskSearch, decision_key
from kiln.tune.tasks import extract_tasks

TARGET = Target.create("c")


@pytest.fixture(scope="module")
def resnet_tasks():
    return extract_tasks(models.resnet_block_cnn().mod, TARGET)


def test_tasks_are_the_distinct_kernels_weighted_by_calls(resnet_tasks):
    keys = [t.key for t in resnet_tasks]
    assert len(keys) == len(set(keys))
    # two residual blocks: their (equal) convolutions are one task called twice
    assert max(t.weight for t in resnet_tasks) >= 2
    assert all(t.tunable and t.flops > 0 for t in resnet_tasks)
    for t in resnet_tasks:
        assert all(t.default[k] in d for k, d in t.space.items())


def test_features_follow_the_schedule(resnet_tasks):
    conv = next(t for t in resnet_tasks if "conv_tile" in t.tunable)
    base, _ = schedule_with_trace(conv.func, TARGET)
    f0 = dict(zip(FEATURE_NAMES, extract_features(base)))
    assert f0["log_flops"] > 10 and f0["parallel_loops"] >= 1 and f0["log_vector_lanes"] > 2
    serial = {**conv.default, "parallel_chunks": 1, "conv_tile": (1, 1)}
    other, _ = schedule_with_trace(conv.func, TARGET, serial)
    f1 = dict(zip(FEATURE_NAMES, extract_features(other)))
    assert f1["log_flops"] == pytest.approx(f0["log_flops"], rel=0.05)  # same arithmetic
    assert f1 != f0


def test_spearman_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(30), rng.standard_normal(30)
    b[:5] = b[5]  # ties
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_cost_model_learns_a_ranking_online():
    rng = np.random.default_rng(1)
    model = CostModel(seed=0)
    x = rng.uniform(0, 4, size=(80, len(FEATURE_NAMES)))
    speed = 0.5 * x[:, 3] - 0.3 * x[:, 7] + 0.05 * rng.standard_normal(80)
    times = 1e-3 / np.exp(speed)
    model.update(list(x[:MIN_SAMPLES - 1]), times[:MIN_SAMPLES - 1], 1e-3)
    assert not model.predict(list(x[60:])).any()  # too few samples: no opinion
    model.update(list(x[MIN_SAMPLES - 1:60]), times[MIN_SAMPLES - 1:60], 1e-3)
    assert spearman(model.predict(list(x[60:])), speed[60:]) > 0.8


def test_search_proposes_new_distinct_points_and_breeds_from_the_best(resnet_tasks):
    task = max(resnet_tasks, key=lambda t: len(t.tunable))
    search = TaskSearch(task, CostModel(seed=0), seed=3)
    search.add(task.default, 1e-3)
    seen = {decision_key(task.default)}
    for _ in range(3):
        batch = search.propose(4)
        assert batch and len(batch) <= 4
        keys = [decision_key(k) for k in batch]
        assert len(set(keys)) == len(keys) and not set(keys) & seen
        for i, k in enumerate(batch):
            assert all(v in task.space[n] for n, v in k.items())
            search.add(k, 2e-3 + i * 1e-4)
        seen |= set(keys)
    assert search.best() == (task.default, 1e-3)
    held_out = search.random_candidates(3)
    assert all(decision_key(k) not in seen for k, _ in held_out)


def test_a_small_space_is_exhausted(resnet_tasks):
    task = min(resnet_tasks, key=lambda t: math.prod(len(d) for d in t.tunable.values()))
    search = TaskSearch(task, CostModel(seed=0), seed=0)
    size = search.space_size()
    for _ in range(20):
        for k in search.propose(8):
            search.add(k, 1e-3)
        if search.exhausted():
            break
    assert search.exhausted() and len(search.measured) == size
    assert search.propose(8) == []
