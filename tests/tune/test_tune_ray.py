"""The Ray runner (kiln.tune.ray_runner) on a local cluster of two worker nodes started here:
candidates spread over both, each record names its worker, a lost worker loses no records."""

import pytest

from kiln.testing import models
from kiln.tune.database import TuningDatabase
from kiln.tune.tasks import extract_tasks
from kiln.tune.tuner import Tuner

ray = pytest.importorskip("ray", reason="the Ray runner needs the `ray` extra (pip install -e "
                                        "\".[ray]\")")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from kiln.tune.ray_runner import RayMeasurer  # noqa: E402 - after the skip


@pytest.fixture(scope="module")
def cluster():
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [c.add_node(num_cpus=1), c.add_node(num_cpus=1)]
    c.wait_for_nodes()
    yield c, nodes
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


def test_ray_runner_spreads_over_two_workers_and_survives_losing_one(cluster, tmp_path):
    c, nodes = cluster
    task = max(extract_tasks(models.mlp(batch=4, sizes=(64, 128, 10)).mod, "c"),
               key=lambda t: len(t.tunable))
    db = TuningDatabase(tmp_path / "t.sqlite")
    measurer = RayMeasurer(c.address, runner_options={"repeat": 2, "min_repeat_s": 0.005})
    assert len(set(measurer.nodes)) == 2
    tuner = Tuner(db, measurer, batch=4)
    try:
        [state] = tuner.tune([task], max_trials=5)
        records = db.records(task.key, task.target_key)
        assert len(records) == state.trials == 5
        assert all(r.ok for r in records)
        assert {r.machine["ray_node"] for r in records} == set(measurer.nodes)
        assert all(r.machine["host"] and r.machine["cpu"] for r in records)
        # a worker node dies: its share of the next round goes to the other one
        c.remove_node(nodes[1])
        tuner.tune([task], max_trials=9)
        after = db.records(task.key, task.target_key)
        assert len(after) == 9 and {r.id for r in records} <= {r.id for r in after}
        assert len(measurer.actors) == 1
    finally:
        tuner.close()
