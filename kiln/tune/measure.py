"""Building and measuring candidates: the builder/runner interface and the local runner.

A *builder* turns a task and knob values into an :class:`Artifact` (the kernel scheduled with
those knobs, lowered, compiled into a shared library) or the reason it could not
(:class:`BuildResult`). A *runner* measures artifacts against the task's reference (the default
schedule's artifact): each :class:`RunResult` is good (times) or bad (a crash, outputs that
differ from the reference's, a timeout), and a bad one never stops the tuning.

:class:`LocalRunner` measures in one child process (``python -m kiln.tune.worker``) that it
restarts after a crash or a timeout; the Ray runner (:mod:`kiln.tune.ray_runner`) spreads the
same work over a cluster.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import progress
from ..codegen.c.build import generate_source
from ..codegen.c.compiler import compile_jobs, compile_source
from ..ir.errors import KilnError
from ..runtime.module import FunctionInfo
from ..schedule.apply import schedule_with_trace
from ..tir.transform.lower import lower
from .database import machine_info
from .tasks import Task
from .worker import receive, send

__all__ = ["Artifact", "BuildResult", "Builder", "LocalBuilder", "LocalMeasurer", "LocalRunner",
           "Measurement", "Measurer", "RunResult", "Runner", "build_candidate",
           "compile_candidate", "prepare_candidate"]

#: The kernel's name in a candidate's library.
KERNEL = "kernel"


@dataclass(frozen=True)
class Artifact:
    """A built candidate: a shared library and what a process needs to load and call it."""

    lib_path: str
    source: str
    infos: dict[str, FunctionInfo]
    name: str
    target: str


@dataclass
class BuildResult:
    """A candidate's build: ``knobs`` asked for, ``decisions`` the schedule took (every knob
    it asked, see :meth:`kiln.tir.schedule.Schedule.knob_decisions`), its trace, and the
    artifact or the error."""

    knobs: dict[str, Any]
    decisions: dict[str, Any] = field(default_factory=dict)
    trace: str = ""
    artifact: Artifact | None = None
    error: str = ""
    lowered: Any = None
    infos: dict[str, FunctionInfo] = field(default_factory=dict)


@dataclass
class RunResult:
    """A measured candidate: seconds per call (good) or why it is bad. ``ref_times`` are the
    reference's, each measured right before the candidate's of the same index."""

    times: list[float]
    ok: bool
    error: str = ""
    machine: dict[str, Any] = field(default_factory=machine_info)
    ref_times: list[float] = field(default_factory=list)

    @property
    def mean_s(self) -> float | None:
        return sum(self.times) / len(self.times) if self.ok and self.times else None

    @property
    def ratio(self) -> float | None:
        """The median of the paired time ratios candidate / reference (None: not paired)."""
        pairs = sorted(t / r for t, r in zip(self.times, self.ref_times) if r > 0)
        if not self.ok or not pairs:
            return None
        mid = len(pairs) // 2
        return pairs[mid] if len(pairs) % 2 else 0.5 * (pairs[mid - 1] + pairs[mid])


class Builder(Protocol):
    def build(self, task: Task, candidates: Sequence[Mapping[str, Any]]) -> list[BuildResult]:
        """Build every candidate (knob values) of ``task``."""


class Runner(Protocol):
    def run(self, reference: Artifact, artifacts: Sequence[Artifact | None]
            ) -> list[RunResult]:
        """Measure ``artifacts`` (None: a failed build, reported bad) against ``reference``."""


def build_candidate(task: Task, knobs: Mapping[str, Any]) -> BuildResult:
    """Schedule ``task``'s kernel with ``knobs``, lower it and compile it (cached by source).
    A schedule or compiler that refuses the candidate makes a failed result, not an error."""
    result, source = prepare_candidate(task, knobs)
    return result if source is None else compile_candidate(task, result, source)


def prepare_candidate(task: Task, knobs: Mapping[str, Any]) -> tuple[BuildResult, str | None]:
    """Everything of :func:`build_candidate` up to the C compile: schedule, lower, generate.
    Returns the result so far and the C source (None where the candidate already failed).

    Runs in the tuner's own thread: the schedule records the knobs it asked on ``task``
    (:meth:`~kiln.tune.tasks.Task.learn_knobs`)."""
    result = BuildResult(dict(knobs))
    with progress.quiet():
        try:
            func, sch = schedule_with_trace(task.func, task.target, knobs)
            if sch is not None:
                result.decisions, result.trace = sch.knob_decisions(), str(sch.trace)
                task.learn_knobs(sch)
            lowered = lower(func.with_attr("global_symbol", KERNEL), task.target)
            result.lowered = lowered
            source, infos = generate_source({KERNEL: lowered}, task.target)
        except KilnError as err:
            result.error = f"{type(err).__name__}: {err}"
            return result, None
    result.infos = infos
    return result, source


def compile_candidate(task: Task, result: BuildResult, source: str) -> BuildResult:
    """The C compile of a prepared candidate (safe to run in several threads at once: the
    compiler runs in its own process and the kernel cache writes atomically)."""
    with progress.quiet():
        try:
            compiled = compile_source(source, march=task.target.mcpu)
        except KilnError as err:
            result.error = f"{type(err).__name__}: {err}"
            return result
    result.artifact = Artifact(compiled.lib_path, source, result.infos, KERNEL, task.target.spec)
    return result


class LocalBuilder:
    """Builds candidates on this machine: scheduling, lowering and code generation one after
    the other in this process, then the C compiles -- the slow part, about a second of gcc
    each -- ``jobs`` at a time (default: the CPUs this process may use, see
    :func:`kiln.codegen.c.compiler.compile_jobs`; results keep the candidates' order)."""

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs

    def build(self, task: Task, candidates: Sequence[Mapping[str, Any]]) -> list[BuildResult]:
        prepared = [prepare_candidate(task, k) for k in candidates]
        todo = [(r, src) for r, src in prepared if src is not None]
        jobs = min(len(todo), self.jobs or compile_jobs())
        if jobs <= 1:
            for r, src in todo:
                compile_candidate(task, r, src)
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(lambda item: compile_candidate(task, *item), todo))
        return [r for r, _ in prepared]


class LocalRunner:
    """Measures candidates in a child process, one at a time (see the module docstring).

    ``timeout_s`` bounds one candidate (loading, checking, timing; the child's start-up,
    importing kiln, has ``startup_timeout_s``); ``repeat`` timings of ``min_repeat_s`` each are
    taken per candidate.
    """

    def __init__(self, timeout_s: float = 30.0, repeat: int = 5, min_repeat_s: float = 0.05,
                 startup_timeout_s: float = 300.0):
        self.timeout_s, self.repeat, self.min_repeat_s = timeout_s, repeat, min_repeat_s
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen | None = None
        self.machine = machine_info()

    def _worker(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kiln.tune.worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=os.getcwd(),
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    p for p in (_kiln_root(), os.environ.get("PYTHONPATH", "")) if p)})
            # the child says when its imports are done (seconds on a busy machine): the
            # candidates' timeout counts from there
            ready, _, _ = select.select([self._proc.stdout], [], [], self.startup_timeout_s)
            try:
                if not ready:
                    raise EOFError(f"no sign of life within {self.startup_timeout_s:g} s")
                receive(self._proc.stdout)
            except EOFError as err:
                self.close()
                raise KilnError(f"kiln.tune: the measuring process (python -m "
                                f"kiln.tune.worker) did not start: {err}") from None
        return self._proc

    def close(self) -> None:
        """Stop the measuring process."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
            self._proc = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _ask(self, request: dict[str, Any]) -> RunResult:
        proc = self._worker()
        try:
            send(proc.stdin, request)
        except (BrokenPipeError, OSError):
            self.close()
            proc = self._worker()
            send(proc.stdin, request)
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
        if not ready:
            self.close()
            return RunResult([], False, f"timeout: no result within {self.timeout_s:g} s",
                             self.machine)
        try:
            answer = receive(proc.stdout)
        except EOFError:
            code = proc.wait()
            self.close()
            what = (f"signal {signal.Signals(-code).name}" if code < 0 and -code in
                    signal.valid_signals() else f"exit code {code}")
            return RunResult([], False, f"crash: the measuring process died ({what})",
                             self.machine)
        return RunResult(answer["times"], answer["ok"], answer["error"], self.machine,
                         answer.get("ref_times", []))

    def run(self, reference: Artifact, artifacts: Sequence[Artifact | None]
            ) -> list[RunResult]:
        out = []
        for art in artifacts:
            if art is None:
                out.append(RunResult([], False, "build failed", self.machine))
                continue
            out.append(self._ask({"reference": reference, "candidate": art,
                                  "repeat": self.repeat, "min_repeat_s": self.min_repeat_s}))
        return out


    def run_models(self, reference: str, candidates: Sequence[str | None]) -> list[RunResult]:
        """Measure whole models saved as .kiln files (paths) against the one at
        ``reference``: outputs compared, run times alternating (graph knobs,
        :mod:`kiln.tune.graph_tuning`). None: a candidate that did not build."""
        out = []
        for path in candidates:
            if path is None:
                out.append(RunResult([], False, "build failed", self.machine))
                continue
            out.append(self._ask({"model": True, "reference": reference, "candidate": path,
                                  "repeat": self.repeat, "min_repeat_s": self.min_repeat_s}))
        return out


def _kiln_root() -> str:
    """The directory this ``kiln`` package is imported from (the child imports the same)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Measurement:
    """A candidate's build and run."""

    build: BuildResult
    run: RunResult


class Measurer(Protocol):
    """What the tuner measures with: builds and runs candidates of a task (the first call for
    a task also measures its default schedule, the reference)."""

    def measure(self, task: Task, candidates: Sequence[Mapping[str, Any]]
                ) -> list[Measurement]: ...

    def close(self) -> None: ...


class LocalMeasurer:
    """A builder and a runner on this machine (default: :class:`LocalBuilder`,
    :class:`LocalRunner`). The reference of a task is its default schedule, built once."""

    def __init__(self, builder: Builder | None = None, runner: Runner | None = None):
        self.builder = builder or LocalBuilder()
        self.runner = runner or LocalRunner()
        self._references: dict[str, BuildResult] = {}

    def reference(self, task: Task) -> BuildResult:
        ref = self._references.get(task.key)
        if ref is None:
            ref = self._references[task.key] = build_candidate(task, task.default)
        return ref

    def measure(self, task: Task, candidates: Sequence[Mapping[str, Any]]
                ) -> list[Measurement]:
        ref = self.reference(task)
        builds = self.builder.build(task, candidates)
        if ref.artifact is None:
            bad = [RunResult([], False, f"the default schedule does not build: {ref.error}")
                   for _ in builds]
            return [Measurement(b, r) for b, r in zip(builds, bad)]
        runs = self.runner.run(ref.artifact, [b.artifact for b in builds])
        for b, r in zip(builds, runs):
            if b.artifact is None:
                r.error = f"build failed: {b.error}"
        return [Measurement(b, r) for b, r in zip(builds, runs)]

    def close(self) -> None:
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()
