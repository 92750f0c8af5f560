"""Worker processes that run fuzz cases, each under a time limit, restarted when one dies.

A worker is a long-lived process (started with ``spawn``: no OpenMP or onnxruntime state
inherited) that loads the corpus once and then runs the cases it is sent, one at a time,
telling the parent which phase it is in (kiln, or a reference). The parent waits for each case
at most ``timeout`` seconds: past it the case is a hang and the worker is killed; a worker that
dies on a signal is a crash. Either way a fresh worker takes its place. A crash or hang while a
reference runs is the reference's (onnxruntime divides INT64_MIN by -1 and traps): the case
keeps kiln's own outcome, noted. Workers run with an address-space limit, so a model that asks
for terabytes gets a MemoryError (which kiln must turn into a KilnError) instead of the
machine's memory.
"""

from __future__ import annotations

import multiprocessing
import resource
import signal
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from .cases import Outcome, execute, make_case
from .corpus import load_corpus

#: Address space a worker may use (bytes).
MEMORY_LIMIT = 6 << 30


def _worker(conn: Any, corpus_path: str, memory_limit: int, kinds: dict | None,
            run: Callable[..., Outcome] = execute) -> None:
    warnings.simplefilter("ignore")
    if memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    corpus = load_corpus(corpus_path)
    import onnxruntime  # noqa: F401

    def report(phase: str, outcome: Outcome | None = None) -> None:
        conn.send(("phase", phase, outcome))

    conn.send(("ready", None, None))
    while True:
        seed = conn.recv()
        if seed is None:
            return
        try:
            case = make_case(seed, corpus, kinds)
            outcome = run(case, report)
        except Exception:  # noqa: BLE001 - a bug of the fuzzer itself: the parent stops
            conn.send(("harness_error", traceback.format_exc(), seed))
            return
        conn.send(("outcome", outcome, None))


@dataclass
class _Slot:
    process: Any
    conn: Any
    seed: int | None = None
    started: float = 0.0
    phase: str = ""
    kiln_outcome: Outcome | None = None


def _signal_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Pool:
    """``workers`` worker processes running cases of seeds (see the module docstring)."""

    def __init__(self, workers: int, timeout: float, corpus_path: str,
                 memory_limit: int = MEMORY_LIMIT, kinds: dict[str, float] | None = None,
                 run: Callable[..., Outcome] = execute):
        self.workers = workers
        self.timeout = timeout
        self.corpus_path = corpus_path
        self.memory_limit = memory_limit
        self.kinds = kinds
        self.run_case = run  # what a worker does with a case (tests put a failing one here)
        self.corpus = load_corpus(corpus_path)
        self.ctx = multiprocessing.get_context("spawn")
        self.restarts = 0

    def _start(self) -> _Slot:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.corpus_path, self.memory_limit,
                                                      self.kinds, self.run_case), daemon=True)
        proc.start()
        child.close()
        return _Slot(proc, parent)

    def _fallback(self, slot: _Slot, cls: str, error: str) -> Outcome:
        """The outcome of a case whose worker died or ran out of time."""
        case = make_case(slot.seed, self.corpus, self.kinds)
        if slot.phase == "reference" and slot.kiln_outcome is not None:
            out = slot.kiln_outcome
            out.notes.append(f"a reference {'hung' if cls == 'hang' else 'crashed'} ({error})")
            return out
        return Outcome(case.seed, case.kind, case.source, case.what, cls, slot.phase, error)

    def run(self, seeds: Iterable[int]) -> Iterator[Outcome]:
        """Run the case of every seed; yields outcomes as they finish (in any order)."""
        pending = iter(seeds)
        slots = [self._start() for _ in range(self.workers)]
        busy = 0
        exhausted = False

        def assign(slot: _Slot) -> None:
            nonlocal exhausted, busy
            if exhausted:
                return
            seed = next(pending, None)
            if seed is None:
                exhausted = True
                return
            slot.seed, slot.phase, slot.kiln_outcome = seed, "start", None
            slot.started = time.monotonic()
            slot.conn.send(seed)
            busy += 1

        ready: set[int] = set()
        try:
            while True:
                for k, slot in enumerate(slots):
                    if k in ready and slot.seed is None:
                        assign(slot)
                if exhausted and busy == 0:
                    return
                now = time.monotonic()
                deadlines = [s.started + self.timeout for s in slots if s.seed is not None]
                wait_for = max(0.0, min(deadlines) - now) if deadlines else 1.0
                for conn in wait([s.conn for s in slots], timeout=wait_for):
                    k = next(i for i, s in enumerate(slots) if s.conn is conn)
                    slot = slots[k]
                    try:
                        kind, value, extra = conn.recv()
                    except (EOFError, OSError):
                        slot.process.join(5)
                        if slot.seed is not None:
                            busy -= 1
                            yield self._fallback(slot, "crash",
                                                 _signal_name(slot.process.exitcode))
                        slots[k] = self._replace(slot)
                        ready.discard(k)
                        continue
                    if kind == "harness_error":  # a bug of the fuzzer: recorded, not kiln's
                        busy -= 1
                        yield Outcome(extra, "?", "?", "?", "harness_error",
                                      message=value.strip().splitlines()[-1],
                                      notes=[value[-2000:]])
                        slots[k] = self._replace(slot)
                        ready.discard(k)
                        continue
                    if kind == "ready":
                        ready.add(k)
                    elif kind == "phase":
                        slot.phase = value
                        if value == "kiln_done":
                            slot.kiln_outcome = extra
                            slot.phase = "kiln"
                    elif kind == "outcome":
                        busy -= 1
                        slot.seed = None
                        yield value
                now = time.monotonic()
                for k, slot in enumerate(slots):
                    if slot.seed is not None and now - slot.started > self.timeout:
                        busy -= 1
                        yield self._fallback(slot, "hang", f"over {self.timeout:.0f} s")
                        slots[k] = self._replace(slot)
                        ready.discard(k)
        finally:
            for slot in slots:
                try:
                    slot.conn.send(None)
                except OSError:
                    pass
            for slot in slots:
                slot.process.join(5)
                if slot.process.is_alive():
                    slot.process.kill()

    def _replace(self, slot: _Slot) -> _Slot:
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(5)
        slot.conn.close()
        self.restarts += 1
        return self._start()
