"""Tuning the NPU's product tilings on the cycle-level simulator, each in its context.

The NPU planner (:func:`kiln.schedule.npu.gemm.plan_gemm`) ranks the feasible tilings of every
product (dense, matmul, a convolution's implicit GEMM, a depthwise convolution's block-diagonal
products) with its cost model and takes the cheapest; its choice is the graph knob
:data:`~kiln.schedule.npu.gemm.TILING_KNOB`, keyed by the planner's whole problem and the
product's context (:func:`~kiln.schedule.npu.gemm.tiling_knob_key`: description, GEMM shape in
units, dtype, gathers, buffers, and the fused element-wise epilogue the kernel runs on each
tile -- its ops, its operands' dtypes and strides, the dtypes it stores), whose domain is the
cost model's best :data:`~kiln.schedule.npu.gemm.TILING_CANDIDATES` tilings, the default
first. A cost model is an estimate; the simulator is the NPU's executable specification, so
here the measurement is the simulator -- of the kernel that runs: the tuner builds the *whole
model* as ``kiln.build`` does, so each product is measured with its fused epilogue (a bias,
batch norm, relu, a residual ``add`` whose operand it loads per tile), its operands where the
build puts them (in DRAM or L1-resident: :mod:`kiln.schedule.npu.residency`) and its
neighbours' buffers placed as in the model. Measured alone, without the epilogue, the tuner
ranked tilings of another kernel: the tuned small_cnn on "edge" was 4% slower than the
untuned one.

Kernels of an NPU program are separated by barriers (every unit drains before the next
kernel starts), so a product's cycles hardly depend on the tilings of the others: the
candidates are measured in *rounds*, round ``i`` one build and one simulated run of the
model with every key at its ``i``-th candidate (those not recorded yet; round 0: the
defaults). A key's cost is the cycles of the kernels it decided (each product kernel names
its key: :attr:`~kiln.schedule.npu.emit.KernelInfo.knob`), summed over the model. Simulated
cycles are deterministic: one run per round, no repeats. A round's output must equal the
default build's bit for bit when every key in it splits K as its default does (the same
float32 roundings; an integer model always), else within :data:`MODEL_RTOL`; a round that
fails (an error, another result) is split in halves and each measured again, down to the
candidate at fault, which is recorded bad. So is a candidate whose kernels are not in its
round's build (with that tiling the epilogue did not fuse: another kernel runs).

The neighbours of a key's kernels differ between its round and the tuned model (where every
key is at its best): the bank-group placement of the whole program's buffers and what stays
L1-resident move a few cycles. So the tuned model is checked: built and run with every key at
its best record, a key whose kernels are slower than in the default build -- or, while the
whole model is slower than the default build, the key that gains least -- has that record
withdrawn (:meth:`~kiln.tune.database.TuningDatabase.withdraw`) and the check repeats, so a
database this writes never makes a model slower than the default build, in the context it
was tuned in (the target, the PassContext's options).

Records go to the tuning database like the CPU's graph knobs (:func:`~kiln.tune.database.
graph_key` of the knob key, the target's :func:`~kiln.tune.database.target_key`: ``npu
-hw=...``): ``times`` the simulated seconds per model run at the description's clock,
``ratio`` over the default tiling's, the cycles in the record's trace text. A run again skips
what is recorded; ``kiln.build(mod, "npu", tuning_db=db)`` builds every product with its best
record's tiling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import progress
from ..build import npu_pipeline
from ..codegen.npu import build_npu, npu_config_of
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..schedule.knobs import graph_knobs
from ..schedule.npu.gemm import TILING_KNOB
from ..schedule.npu.region import static_tensor
from ..target import Target
from ..transform.bind_params import BindParams
from .cost_model import spearman
from .database import Record, TuningDatabase, Workload, graph_key, machine_info, target_key

__all__ = ["MODEL_RTOL", "ModelRun", "NpuCandidate", "NpuTask", "NpuTuneResult",
           "extract_npu_tasks", "kernel_cycles", "random_inputs", "run_model", "tune_npu"]

#: Relative tolerance (of the largest magnitude of the default build's output) of a round
#: whose tilings split K otherwise than the defaults: the float32 sums of the K steps round in
#: another order (about 1e-4 of a layer's output), and the float16 casts between the layers
#: turn such a difference into a float16 rounding step (1e-3) that the next layers carry.
MODEL_RTOL = 1e-2


@dataclass
class NpuTask:
    """The tiling knob of one key: ``domain`` the candidate tilings (``(m_units, n, k_units,
    balance)``, the default first), ``kernels`` the labels of the product kernels it decides
    in the default build (``ops``: their ops, ``tilings``: the default's tiling text)."""

    key: str
    domain: tuple[Any, ...]
    kernels: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    tilings: list[str] = field(default_factory=list)

    @property
    def default(self) -> Any:
        return self.domain[0]

    @property
    def record_key(self) -> str:
        return graph_key(self.key)

    @property
    def calls(self) -> int:
        """Kernels of the model the key decides."""
        return len(self.kernels)

    @property
    def name(self) -> str:
        """The layers as people read them: the first kernel's label (its fused ops) and the
        default's GEMM shape."""
        shape = self.tilings[0].split(" of ", 1)[-1].split(",")[0] if self.tilings else ""
        more = f" (+{len(self.kernels) - 1} more)" if len(self.kernels) > 1 else ""
        return f"{self.kernels[0].split(':', 1)[-1]} {shape}{more}"


@dataclass
class NpuCandidate:
    """One measured tiling of a task: simulated cycles of the key's product kernels per model
    run (None: bad, ``error`` says why) and the cost model's estimate of them."""

    tiling: Any
    cycles: float | None
    estimate: float
    error: str = ""


@dataclass
class NpuTuneResult:
    """What :func:`tune_npu` measured (this run) and found (with the database's records):
    per task key, the default's and the best cycles and the candidates measured now;
    ``model_default``, ``model_tuned``: the whole model's cycles, default build and tuned
    (checked) build; ``withdrawn``: ``(key, tiling)`` of the records the check withdrew."""

    tasks: list[NpuTask] = field(default_factory=list)
    measured: dict[str, list[NpuCandidate]] = field(default_factory=dict)
    default_cycles: dict[str, float] = field(default_factory=dict)
    best_cycles: dict[str, float] = field(default_factory=dict)
    best_tiling: dict[str, Any] = field(default_factory=dict)
    trials: int = 0
    bad: int = 0
    builds: int = 0
    seconds: float = 0.0
    model_default: float = 0.0
    model_tuned: float = 0.0
    withdrawn: list[tuple[str, Any]] = field(default_factory=list)

    def model_cycles(self) -> tuple[float, float]:
        """The tuned products' cycles per model run: with the default tilings, with the best."""
        keys = [t.key for t in self.tasks if t.key in self.default_cycles]
        return (sum(self.default_cycles[k] for k in keys),
                sum(self.best_cycles.get(k, self.default_cycles[k]) for k in keys))

    def rank_correlation(self) -> tuple[float, float]:
        """Spearman's rank correlation of the cost model's estimates with the simulated cycles
        over the good candidates measured in this run: the mean over the tasks with two or more
        (the ranking the planner has to get right is within a layer), and pooled over all."""
        per_task, est, cyc = [], [], []
        for cands in self.measured.values():
            good = [c for c in cands if c.cycles is not None]
            est += [c.estimate for c in good]
            cyc += [c.cycles for c in good]
            rho = spearman([c.estimate for c in good], [c.cycles for c in good])
            if len(good) >= 2 and not math.isnan(rho):
                per_task.append(rho)
        mean = float(np.mean(per_task)) if per_task else float("nan")
        return mean, spearman(est, cyc) if len(est) >= 2 else float("nan")


def random_inputs(mod: IRModule, seed: int) -> list[np.ndarray]:
    """Seeded random values for ``mod``'s main parameters: standard normal floats, integers
    in [-8, 8)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        shape, dtype = static_tensor(p)
        if np.issubdtype(np.dtype(dtype), np.integer):
            out.append(rng.integers(-8, 8, size=shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def kernel_cycles(exe: Any) -> dict[str, float]:
    """Simulated cycles per kernel label of an NPU executable's last call (every region)."""
    out: dict[str, float] = {}
    for r in exe.last_reports:
        out.update(r.phase_cycles())
    return out


@dataclass
class ModelRun:
    """One build and simulated run of a partitioned model under given tilings: the
    executable, the knobs its lowering asked (``key -> name -> (domain, default,
    decision)``), its output, its cycles per kernel label and in all."""

    exe: Any
    asked: dict[str, dict[str, tuple[tuple[Any, ...], Any, Any]]]
    output: Any
    phases: dict[str, float]
    cycles: float

    def key_kernels(self, key: str) -> list[Any]:
        """The product kernels tiling knob ``key`` decided."""
        return [k for k in self.exe.kernels if k.knob == key]

    def key_cycles(self, key: str) -> float:
        return sum(self.phases.get(k.label, 0.0) for k in self.key_kernels(key))


def run_model(part: IRModule, target: Target, tilings: Mapping[str, Any],
              inputs: list[np.ndarray]) -> ModelRun:
    """Build partitioned ``part`` (:func:`kiln.build.npu_pipeline`'s result) with each
    tiling knob key of ``tilings`` at its value (the others at their defaults) and run it
    once on ``inputs``."""
    with graph_knobs(lambda k: {TILING_KNOB: tilings[k]} if k in tilings else None) as asked:
        exe = build_npu(part, target)
    output = exe(*inputs)
    return ModelRun(exe, asked.asked, output, kernel_cycles(exe), float(exe.last_cycles))


def _partition(mod: IRModule, tgt: Target, params: Mapping[str, Any] | None) -> IRModule:
    if tgt.kind != "npu":
        raise KilnError(f"NPU tiling tasks: {tgt.spec!r} is not an NPU target")
    if params:
        mod = BindParams("main", params)(mod)
    return npu_pipeline(target=tgt)(mod)


def _tasks(exe: Any, asked: Mapping[str, Mapping[str, Any]]) -> list[NpuTask]:
    tasks: dict[str, NpuTask] = {}
    for k in exe.kernels:
        knobs = asked.get(k.knob, {})
        if not k.knob or TILING_KNOB not in knobs or len(knobs[TILING_KNOB][0]) < 2:
            continue
        task = tasks.setdefault(k.knob, NpuTask(k.knob, knobs[TILING_KNOB][0]))
        task.kernels.append(k.label)
        task.ops.append(k.op)
        task.tilings.append(k.tiling)
    return sorted(tasks.values(), key=lambda t: -t.calls)


def extract_npu_tasks(mod: IRModule, target: Target | str,
                      params: Mapping[str, Any] | None = None) -> list[NpuTask]:
    """The tiling knobs of the products ``mod`` runs on the NPU of ``target``: the model
    built as ``kiln.build`` builds it (in the current PassContext), each product kernel's
    key (with its context: the fused epilogue); one task per key with two or more
    candidates, most kernels first."""
    tgt = Target.create(target)
    part = _partition(mod, tgt, params)
    with graph_knobs() as asked:
        exe = build_npu(part, tgt)
    return _tasks(exe, asked.asked)


def _same_result(exact: bool, out: np.ndarray, ref: np.ndarray) -> str:
    """'' when a round's output is what the default build computes (see the module
    docstring; ``exact``: every tiling splits K as its default), else why not."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"output {out.dtype}{out.shape}, the default's {ref.dtype}{ref.shape}"
    if exact or np.issubdtype(ref.dtype, np.integer):
        if not np.array_equal(out, ref, equal_nan=True):
            return "output differs from the default build's (same arithmetic: bits expected)"
        return ""
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    err = float(np.max(np.abs(out.astype(np.float64) - ref))) if ref.size else 0.0
    if not math.isfinite(err) or err > MODEL_RTOL * max(scale, 1e-30):
        return f"output differs from the default build's by {err:.3g} (of {scale:.3g})"
    return ""


@dataclass
class _Session:
    """What the rounds of one :func:`tune_npu` share."""

    db: TuningDatabase
    part: IRModule
    tgt: Target
    tkey: str
    clock_hz: float
    inputs: list[np.ndarray]
    ref: ModelRun
    tasks: dict[str, NpuTask]
    machine: dict[str, Any]
    result: NpuTuneResult
    on_trial: Callable[[NpuTask, NpuCandidate, float], None] | None

    def run(self, tilings: Mapping[str, Any]) -> ModelRun:
        self.result.builds += 1
        return run_model(self.part, self.tgt, tilings, self.inputs)

    def measure(self, tilings: dict[str, Any]) -> dict[str, NpuCandidate]:
        """Each key's candidate of ``tilings`` measured in one build (a failing build split
        in halves, down to the candidate at fault)."""
        try:
            run = self.run(tilings)
            exact = all(t[2] == self.tasks[k].default[2] for k, t in tilings.items())
            why = _same_result(exact, run.output, self.ref.output)
        except Exception as err:  # noqa: BLE001 - a candidate that fails is recorded bad
            run, why = None, f"{type(err).__name__}: {err}"
        if why and len(tilings) > 1:
            keys = list(tilings)
            half = len(keys) // 2
            return {**self.measure({k: tilings[k] for k in keys[:half]}),
                    **self.measure({k: tilings[k] for k in keys[half:]})}
        if why or run is None:
            return {k: NpuCandidate(t, None, 0.0, why) for k, t in tilings.items()}
        out = {}
        for k, t in tilings.items():
            took = run.asked.get(k, {}).get(TILING_KNOB)
            kernels = run.key_kernels(k)
            if took is None or took[2] != t or not kernels:
                out[k] = NpuCandidate(t, None, 0.0, "with this tiling the build ran no kernel "
                                      "of the key (another kernel: the epilogue not fused?)")
                continue
            out[k] = NpuCandidate(t, run.key_cycles(k), sum(x.estimate for x in kernels))
        return out

    def record(self, task: NpuTask, cand: NpuCandidate, default_cycles: float) -> Record:
        trace = f"tiling {cand.tiling}: " + (cand.error or f"{cand.cycles:.0f} simulated "
                                             "cycles") + \
            f" per model run, in the model (estimate {cand.estimate:.0f})"
        rec = Record(task.record_key, self.tkey, {TILING_KNOB: cand.tiling}, trace,
                     [] if cand.cycles is None else [cand.cycles / self.clock_hz],
                     cand.cycles is not None, cand.error, self.machine,
                     ratio=None if cand.cycles is None else cand.cycles / default_cycles)
        self.db.add_records([rec])
        self.result.trials += 1
        self.result.bad += cand.cycles is None
        self.result.measured.setdefault(task.key, []).append(cand)
        if self.on_trial is not None:
            self.on_trial(task, cand, default_cycles)
        progress.info("tune npu: %s %s: %s", task.name, cand.tiling, cand.error or
                      f"{cand.cycles:.0f} cycles ({cand.cycles / default_cycles:.3f})")
        return rec


def tune_npu(mod: IRModule, db: TuningDatabase, target: Target | str,
             params: Mapping[str, Any] | None = None, budget_s: float | None = None,
             on_trial: Callable[[NpuTask, NpuCandidate, float], None] | None = None
             ) -> NpuTuneResult:
    """Measure the tiling candidates of ``mod``'s NPU products on the simulator, in the
    model, into ``db`` (see the module docstring) for at most ``budget_s`` seconds (None:
    all; the default build and the check of the tuned model always run). Candidates recorded
    already are not measured again. ``on_trial(task, candidate, default_cycles)`` reports
    each one measured."""
    tgt = Target.create(target)
    start = time.monotonic()
    deadline = start + budget_s if budget_s is not None else math.inf
    part = _partition(mod, tgt, params)
    inputs = random_inputs(part, 0)
    result = NpuTuneResult()
    with graph_knobs() as asked:  # the default build: its kernels name the tasks
        exe = build_npu(part, tgt)
    result.builds += 1
    output = exe(*inputs)
    ref = ModelRun(exe, asked.asked, output, kernel_cycles(exe), float(exe.last_cycles))
    result.tasks = _tasks(exe, asked.asked)
    s = _Session(db, part, tgt, target_key(tgt), npu_config_of(tgt).clock_mhz * 1e6, inputs,
                 ref, {t.key: t for t in result.tasks},
                 {**machine_info(), "simulator": f"kiln.npu.simulator {tgt.spec}"}, result,
                 on_trial)
    records: dict[str, dict[Any, Record]] = {}
    for task in result.tasks:
        records[task.key] = {r.knobs.get(TILING_KNOB): r
                             for r in db.records(task.record_key, s.tkey)}
        d = ref.key_cycles(task.key)
        db.add_workload(Workload(task.record_key, s.tkey, task.name, "npu.tiling",
                                 d / s.clock_hz))
        if task.default not in records[task.key]:
            records[task.key][task.default] = s.record(
                task, NpuCandidate(task.default, d, sum(
                    k.estimate for k in ref.key_kernels(task.key))), d)
    rounds = max((len(t.domain) for t in result.tasks), default=0)
    for i in range(1, rounds):
        todo = {t.key: t.domain[i] for t in result.tasks
                if i < len(t.domain) and t.domain[i] not in records[t.key]}
        if not todo:
            continue
        if time.monotonic() >= deadline:
            break
        for key, cand in s.measure(todo).items():
            task = s.tasks[key]
            records[key][cand.tiling] = s.record(task, cand, ref.key_cycles(key))
    _check_tuned(s)
    for task in result.tasks:
        best = db.best(task.record_key, s.tkey)
        result.default_cycles[task.key] = ref.key_cycles(task.key)
        if best is None or best.mean_s is None:
            continue
        result.best_cycles[task.key] = best.mean_s * s.clock_hz
        result.best_tiling[task.key] = tuple(best.knobs[TILING_KNOB])
    result.model_default = ref.cycles
    result.seconds = time.monotonic() - start
    return result


def _check_tuned(s: _Session) -> None:
    """Build and run the model with every key at its best record; withdraw the records that
    make it slower than the default build (see the module docstring) until none does."""
    ref = s.ref
    while True:
        best = {}
        for task in s.result.tasks:
            rec = s.db.best(task.record_key, s.tkey)
            if rec is not None and tuple(rec.knobs[TILING_KNOB]) != task.default:
                best[task.key] = tuple(rec.knobs[TILING_KNOB])
        if not best:
            s.result.model_tuned = ref.cycles
            return
        try:
            run = s.run(best)
            failed = ""
        except Exception as err:  # noqa: BLE001 - every round built; reported, then undone
            run, failed = None, f"{type(err).__name__}: {err}"
        if run is not None:
            slower = {k: run.key_cycles(k) for k in best
                      if run.key_cycles(k) > ref.key_cycles(k)}
            if not slower and run.cycles <= ref.cycles:
                s.result.model_tuned = run.cycles
                return
        if run is None:
            culprits = list(best)
        elif slower:
            culprits = list(slower)
        else:  # each key as fast as its default, the model not: the least gain goes
            culprits = [min(best, key=lambda k: ref.key_cycles(k) - run.key_cycles(k))]
        for key in culprits:
            if run is None:
                why = f"the tuned model failed to build or run: {failed}"
            else:
                why = (f"in the tuned model {run.key_cycles(key):.0f} cycles against the "
                       f"default build's {ref.key_cycles(key):.0f} (model {run.cycles:.0f} "
                       f"against {ref.cycles:.0f})")
            s.db.withdraw(graph_key(key), s.tkey, {TILING_KNOB: best[key]}, why)
            s.result.withdrawn.append((key, best[key]))
            progress.info("tune npu: %s %s withdrawn: %s", s.tasks[key].name, best[key], why)
