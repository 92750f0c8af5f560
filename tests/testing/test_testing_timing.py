"""kiln.testing.timing: the clock that times each call is the caller's choice (wall time by
default); the loop's own duration stays in wall time."""

from __future__ import annotations

import itertools
import time

from kiln.testing.timing import compare, median_seconds


def _ticking(step: float):
    """A clock that advances ``step`` per reading."""
    ticks = itertools.count()
    return lambda: next(ticks) * step


def test_median_seconds_times_each_call_by_the_given_clock():
    calls = []
    t = median_seconds(lambda: calls.append(1), min_repeat=4, min_time=0.0, warmup=1,
                       clock=_ticking(0.25))
    assert t == 0.25  # two readings per call
    assert len(calls) == 5  # warm-up + min_repeat


def test_compare_passes_the_clock_to_every_round():
    c = compare({"a": lambda: None, "b": lambda: None}, rounds=3, min_time=0.0, min_repeat=2,
                settle=0.0, clock=_ticking(1.0))
    assert c.rounds == {"a": [1.0] * 3, "b": [1.0] * 3}
    assert c.ratio("a", "b") == 1.0


def test_thread_time_leaves_out_sleeping():
    # wall time counts the sleep, the thread's CPU time does not
    wall = median_seconds(lambda: time.sleep(0.02), min_repeat=3, min_time=0.0, warmup=0)
    cpu = median_seconds(lambda: time.sleep(0.02), min_repeat=3, min_time=0.0, warmup=0,
                         clock=time.thread_time)
    assert wall >= 0.02 and cpu < 0.01
