"""Timing helper used by the demo and the benchmark scripts (never by tests)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], min_repeat: int = 5, min_time: float = 0.3,
                   warmup: int = 2, max_repeat: int = 1000) -> float:
    """Median wall time of ``fn()`` over at least ``min_repeat`` runs and ``min_time`` seconds."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeat and (
        len(times) < min_repeat or time.perf_counter() - start < min_time
    ):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
