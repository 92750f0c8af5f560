"""Timing helpers used by the demo and the benchmark scripts (never by tests)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


def median_seconds(fn: Callable[[], object], min_repeat: int = 5, min_time: float = 0.3,
                   warmup: int = 2, max_repeat: int = 1000,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Median time of ``fn()`` over at least ``min_repeat`` runs and ``min_time`` seconds (of
    wall time), each run timed by ``clock``: wall time by default; ``time.thread_time``
    counts only the calling thread's CPU time, which time slicing by other processes on a
    busy machine does not inflate -- a fair figure for engines that run on the calling
    thread (one thread each), though the caches stay shared."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeat and (
        len(times) < min_repeat or time.perf_counter() - start < min_time
    ):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


@dataclass(frozen=True)
class Comparison:
    """Per-round median times (seconds) of several engines timed in alternating rounds."""

    rounds: dict[str, list[float]]

    def median(self, name: str) -> float:
        """The median of ``name``'s round medians."""
        return statistics.median(self.rounds[name])

    def ratios(self, a: str, b: str) -> list[float]:
        """``a``'s time over ``b``'s, round by round (both measured under the same load)."""
        return [x / y for x, y in zip(self.rounds[a], self.rounds[b])]

    def ratio(self, a: str, b: str) -> float:
        """The median of the per-round ratios of ``a`` to ``b``."""
        return statistics.median(self.ratios(a, b))

    def ratio_text(self, a: str, b: str) -> str:
        """``"1.10 (1.04-1.21)"``: the median per-round ratio and its range over the rounds."""
        r = self.ratios(a, b)
        return f"{self.ratio(a, b):.2f} ({min(r):.2f}-{max(r):.2f})"


def compare(fns: Mapping[str, Callable[[], object]], rounds: int = 5,
            min_time: float = 0.2, min_repeat: int = 3, settle: float = 0.1,
            clock: Callable[[], float] = time.perf_counter) -> Comparison:
    """Time each engine of ``fns`` in turn, ``rounds`` times over, each turn a block of calls
    (at least ``min_repeat`` and ``min_time`` seconds) whose median is that round's figure.

    On a shared machine the speed of memory and caches drifts over seconds; timing one engine
    and then the other puts each in a different phase of that drift, which moves their ratio
    by tens of percent from run to run. Alternating blocks exposes every engine to the same
    phases, and the per-round ratio compares engines measured seconds apart. Blocks, not
    call-by-call interleaving, because a thread pool left spinning by one engine's call slows
    the next engine's; ``settle`` seconds of sleep between blocks let such a pool park
    (OpenBLAS's spins for tens of milliseconds after numpy's last call). ``clock`` times each
    call (see :func:`median_seconds`)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(settle)
            samples[name].append(median_seconds(fn, min_repeat=min_repeat, min_time=min_time,
                                                warmup=1, clock=clock))
    return Comparison(samples)
