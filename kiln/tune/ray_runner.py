"""Building and measuring candidates on a Ray cluster (``kiln tune --ray ADDRESS``).

:class:`RayMeasurer` is a :class:`~kiln.tune.measure.Measurer`: it starts one actor per worker
(by default one per alive node with a CPU, spread over the nodes), and each actor builds and
measures its share of a round's candidates on its own machine with the local builder and
runner (a library built on one machine is measured there: nothing but knob values and results
travel). Every result carries that worker's machine (host, CPU, Ray node id). The tuner on the
driver writes the records, so a worker lost mid-round loses no records: its share of the round
is measured again on the workers left (a round fails only when none is left).

Ray is the optional extra ``ray`` (``pip install -e ".[ray]"``); every node needs kiln (and a C
compiler) installed. ``address=None`` starts a local Ray instance.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..ir.errors import KilnError
from .measure import LocalMeasurer, LocalRunner, Measurement
from .tasks import Task

__all__ = ["MeasureWorker", "RayMeasurer"]


def _ray() -> Any:
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise KilnError("kiln tune --ray needs Ray: pip install -e \".[ray]\"") from err
    return ray


class MeasureWorker:
    """What runs in a Ray actor: a local builder and runner on that actor's machine."""

    def __init__(self, runner_options: Mapping[str, Any]):
        self.measurer = LocalMeasurer(runner=LocalRunner(**runner_options))
        ray = _ray()
        self.node = ray.get_runtime_context().get_node_id()
        self.measurer.runner.machine = {**self.measurer.runner.machine, "ray_node": self.node,
                                        "pid": os.getpid()}

    def measure(self, task: Task, candidates: Sequence[Mapping[str, Any]]
                ) -> list[Measurement]:
        out = self.measurer.measure(task, candidates)
        for m in out:  # a library path means nothing on the driver's machine
            m.build.artifact, m.build.lowered = None, None
        return out

    def node_id(self) -> str:
        return self.node

    def close(self) -> None:
        self.measurer.close()


class RayMeasurer:
    """Spreads a round's candidates over Ray actors (see the module docstring).

    ``workers``: how many actors (default: one per alive node with CPUs); ``runner_options``
    go to each worker's :class:`~kiln.tune.measure.LocalRunner`.
    """

    def __init__(self, address: str | None = None, workers: int | None = None,
                 runner_options: Mapping[str, Any] | None = None):
        ray = self._ray = _ray()
        self._started = False
        if not ray.is_initialized():
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}}
            try:
                ray.init(address=address, runtime_env=env, log_to_driver=False,
                         include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise KilnError(f"kiln tune: cannot connect to the Ray cluster at {address!r}: "
                                f"{err}") from err
            self._started = True
        nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0]
        if not nodes:
            raise KilnError("kiln tune: the Ray cluster has no alive node with a CPU")
        count = workers or len(nodes)
        actor = ray.remote(num_cpus=1)(MeasureWorker)
        self.actors = [actor.options(scheduling_strategy="SPREAD").remote(runner_options or {})
                       for _ in range(count)]
        self.nodes = ray.get([a.node_id.remote() for a in self.actors])

    def measure(self, task: Task, candidates: Sequence[Mapping[str, Any]]
                ) -> list[Measurement]:
        ray = self._ray
        results: list[Measurement | None] = [None] * len(candidates)
        pending = list(range(len(candidates)))
        while pending:
            if not self.actors:
                raise KilnError("kiln tune: every Ray worker was lost")
            shares = {i: pending[i::len(self.actors)] for i in range(len(self.actors))}
            futures = {i: self.actors[i].measure.remote(task, [candidates[j] for j in share])
                       for i, share in shares.items() if share}
            lost, pending = [], []
            for i, fut in futures.items():
                try:
                    got = ray.get(fut)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
                    lost.append(i)
                    pending += shares[i]
                    continue
                for j, m in zip(shares[i], got):
                    results[j] = m
            self.actors = [a for i, a in enumerate(self.actors) if i not in lost]
            self.nodes = [n for i, n in enumerate(self.nodes) if i not in lost]
            pending.sort()
        return [m for m in results if m is not None]

    def close(self) -> None:
        ray = self._ray
        for a in self.actors:
            try:
                ray.get(a.close.remote(), timeout=30)
                ray.kill(a)
            except Exception:  # noqa: BLE001 - a worker already gone
                pass
        self.actors = []
        if self._started:
            ray.shutdown()
