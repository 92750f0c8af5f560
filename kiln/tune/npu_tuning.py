"""Tuning the NPU's product tilings on the cycle-level simulator.

The NPU planner (:func:`kiln.schedule.npu.gemm.plan_gemm`) ranks the feasible tilings of every
product (dense, matmul, a convolution's implicit GEMM) with its cost model and takes the
cheapest; its choice is the graph knob :data:`~kiln.schedule.npu.gemm.TILING_KNOB`, keyed by
the planner's whole problem (:func:`~kiln.schedule.npu.gemm.tiling_knob_key`: description,
GEMM shape in units, dtype, gathers, buffers), whose domain is the cost model's best
:data:`~kiln.schedule.npu.gemm.TILING_CANDIDATES` tilings, the default first. A cost model is an
estimate; the simulator is the NPU's executable specification, so here the measurement is the
simulator: every candidate of a key is built into the *layer's* program -- each distinct op
call of the model that asks the key, alone in a one-op module (same operands' shapes and
dtypes, the same constant weights) -- and run once on random inputs. Simulated cycles are
deterministic: one run per candidate, no repeats, no noise, no alternation with the default.
A candidate's cost is the cycles of the call's product kernels (the casts around them do not
depend on the tiling), summed over the model's calls of the key; its outputs must equal the
default tiling's bit for bit when both split K alike (the same float32 roundings), else within
a float32 accumulation-order tolerance (exactly, for integer products), or it is recorded bad.

Kernels of an NPU program are separated by barriers (every unit drains before the next
kernel starts), so a product's cycles do not depend on the tilings of the others: the layers
are tuned independently, every candidate of every key once, and the model with every key at
its best is the tuned model.

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

from .. import graph as g
from .. import progress
from ..build import npu_pipeline
from ..codegen.npu import build_npu, npu_config_of
from ..graph.block_builder import BlockBuilder
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..schedule.knobs import graph_knobs
from ..schedule.npu.emit import DramTensor
from ..schedule.npu.gemm import TILING_KNOB
from ..schedule.npu.lowering import lowering_rejection
from ..schedule.npu.ops import GEMM_OPS
from ..schedule.npu.region import static_tensor
from ..target import Target
from ..transform.bind_params import BindParams
from ..transform.npu import CODEGEN
from .cost_model import spearman
from .database import Record, TuningDatabase, Workload, graph_key, machine_info, target_key

__all__ = ["ACCUMULATION_RTOL", "LayerRun", "NpuCandidate", "NpuLayer", "NpuTask",
           "NpuTuneResult", "extract_npu_tasks", "kernel_cycles", "layer_module", "measure_layer",
           "random_inputs", "tune_npu"]

#: Relative tolerance (of the largest magnitude of the default's output) between tilings that
#: split K differently: the float32 sums of the K steps round in another order.
ACCUMULATION_RTOL = 1e-4


@dataclass
class NpuLayer:
    """One distinct product call of the model (op, operands' shapes and dtypes, attributes):
    ``call`` the first such call (of its region function), ``count`` how many the model has."""

    call: g.Call
    signature: str
    count: int = 1


@dataclass
class NpuTask:
    """The tiling knob of one key: ``domain`` the candidate tilings (``(m_units, n,
    k_units)``, the default first), ``layers`` the model's calls that ask the key."""

    key: str
    domain: tuple[Any, ...]
    layers: list[NpuLayer] = field(default_factory=list)

    @property
    def default(self) -> Any:
        return self.domain[0]

    @property
    def record_key(self) -> str:
        return graph_key(self.key)

    @property
    def calls(self) -> int:
        return sum(layer.count for layer in self.layers)

    @property
    def name(self) -> str:
        """The layers as people read them: op and operand shapes of the first call."""
        layer = self.layers[0]
        shapes = " x ".join(str(list(static_tensor(a)[0])) for a in layer.call.args
                            if isinstance(a, (g.Var, g.Constant)))
        more = f" (+{len(self.layers) - 1} more)" if len(self.layers) > 1 else ""
        return f"{layer.call.op.name} {shapes}{more}"


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
    per task key, the default's and the best cycles and the candidates measured now."""

    tasks: list[NpuTask] = field(default_factory=list)
    measured: dict[str, list[NpuCandidate]] = field(default_factory=dict)
    default_cycles: dict[str, float] = field(default_factory=dict)
    best_cycles: dict[str, float] = field(default_factory=dict)
    best_tiling: dict[str, Any] = field(default_factory=dict)
    trials: int = 0
    bad: int = 0
    seconds: float = 0.0

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


def _region_functions(mod: IRModule) -> list[g.Function]:
    return [f for _, f in mod.items()
            if isinstance(f, g.Function) and f.attrs.get("Codegen") == CODEGEN]


def _signature(call: g.Call) -> str:
    operands = [("const" if isinstance(a, g.Constant) else "var", *static_tensor(a))
                for a in call.args]
    return f"{call.op.name} {operands} {call.attrs!r}"


def _probe_operand(arg: Any) -> Any:
    if isinstance(arg, g.Constant):
        return np.asarray(arg.data)
    return DramTensor(0, *static_tensor(arg))


def extract_npu_tasks(mod: IRModule, target: Target | str,
                      params: Mapping[str, Any] | None = None) -> list[NpuTask]:
    """The tiling knobs of the products ``mod`` runs on the NPU of ``target``: the graph
    partitioned as ``kiln.build`` does, every product call of every NPU region probed (its
    lowering run into a scratch context) for the keys it asks; one task per key with two or
    more candidates, most calls first."""
    tgt = Target.create(target)
    if tgt.kind != "npu":
        raise KilnError(f"NPU tiling tasks: {tgt.spec!r} is not an NPU target")
    cfg = npu_config_of(tgt)
    if params:
        mod = BindParams("main", params)(mod)
    part = npu_pipeline(target=tgt)(mod)
    tasks: dict[str, NpuTask] = {}
    for func in _region_functions(part):
        for blk in func.body.blocks:
            for b in blk.bindings:
                call = b.value
                if not (isinstance(call, g.Call) and isinstance(call.op, g.Op) and
                        call.op.name in GEMM_OPS):
                    continue
                with graph_knobs() as asked:
                    why = lowering_rejection(cfg, call, [_probe_operand(a) for a in call.args],
                                             static_tensor(b.var))
                if why is not None:  # the partitioner put it on the NPU: cannot happen
                    raise KilnError(f"NPU tiling tasks: {call.op.name} ({b.var.name_hint}) "
                                    f"does not lower: {why}")
                sig = _signature(call)
                for key, knobs in asked.asked.items():
                    if TILING_KNOB not in knobs or len(knobs[TILING_KNOB][0]) < 2:
                        continue
                    task = tasks.setdefault(key, NpuTask(key, knobs[TILING_KNOB][0]))
                    layer = next((lay for lay in task.layers if lay.signature == sig), None)
                    if layer is None:
                        task.layers.append(NpuLayer(call, sig))
                    else:
                        layer.count += 1
    return sorted(tasks.values(), key=lambda t: -t.calls)


def layer_module(call: g.Call) -> IRModule:
    """``main(operands) = call(operands)``: the product alone, its run-time operands as
    parameters of their shapes and dtypes, its constants (weights) as they are."""
    params, args = [], []
    for i, a in enumerate(call.args):
        if isinstance(a, g.Constant):
            args.append(a)
            continue
        shape, dtype = static_tensor(a)
        v = g.Var(f"x{i}", g.TensorStructInfo(shape, dtype))
        params.append(v)
        args.append(v)
    bb = BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(call.replace(args=tuple(args)))
        bb.emit_func_output(out)
    return bb.get()


def random_inputs(mod: IRModule, seed: int) -> list[np.ndarray]:
    """Seeded random values for ``mod``'s main parameters (a layer's run-time operands):
    standard normal floats, integers in [-8, 8)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        shape, dtype = static_tensor(p)
        if np.issubdtype(np.dtype(dtype), np.integer):
            out.append(rng.integers(-8, 8, size=shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


@dataclass
class LayerRun:
    """One simulated layer: its product kernels' cycles and estimate, and its output."""

    cycles: float
    estimate: float
    output: np.ndarray
    tiling: str


def kernel_cycles(exe: Any) -> dict[str, float]:
    """Simulated cycles per kernel label of an NPU executable's last call (every region)."""
    out: dict[str, float] = {}
    for r in exe.last_reports:
        out.update(r.phase_cycles())
    return out


def measure_layer(call: g.Call, target: Target, key: str, tiling: Any, seed: int = 0
                  ) -> LayerRun:
    """Build ``call`` alone (:func:`layer_module`) with ``key``'s tiling knob at ``tiling``
    and simulate it on seeded random inputs."""
    mod = layer_module(call)
    with graph_knobs(lambda k: {TILING_KNOB: tiling} if k == key else None) as asked:
        exe = build_npu(npu_pipeline(target=target)(mod), target)
    got = asked.asked.get(key, {}).get(TILING_KNOB)
    if got is None or got[2] != tiling:
        raise KilnError(f"NPU tiling: the layer {call.op.name} did not take tiling {tiling} "
                        f"of key {key!r} (asked: {got})")
    output = np.asarray(exe(*random_inputs(mod, seed)))
    phases = kernel_cycles(exe)
    kernels = [k for k in exe.kernels if k.op == call.op.name]
    return LayerRun(sum(phases.get(k.label, 0.0) for k in kernels),
                    sum(k.estimate for k in kernels), output,
                    "; ".join(dict.fromkeys(k.tiling.split(", est.")[0] for k in kernels)))


def _same_result(tiling: Any, default: Any, out: np.ndarray, ref: np.ndarray) -> str:
    """'' when a candidate's output is what the default tiling computes (see the module
    docstring), else why not."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"output {out.dtype}{out.shape}, the default's {ref.dtype}{ref.shape}"
    if np.issubdtype(ref.dtype, np.integer) or tiling[2] == default[2]:
        if not np.array_equal(out, ref, equal_nan=True):
            return "output differs from the default tiling's (same arithmetic: bits expected)"
        return ""
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    err = float(np.max(np.abs(out.astype(np.float64) - ref))) if ref.size else 0.0
    if not math.isfinite(err) or err > ACCUMULATION_RTOL * max(scale, 1e-30):
        return f"output differs from the default tiling's by {err:.3g} (of {scale:.3g})"
    return ""


def _cycles_of(rec: Record, clock_hz: float) -> float | None:
    return None if rec.mean_s is None else rec.mean_s * clock_hz


def tune_npu(mod: IRModule, db: TuningDatabase, target: Target | str,
             params: Mapping[str, Any] | None = None, budget_s: float | None = None,
             on_trial: Callable[[NpuTask, NpuCandidate, float], None] | None = None
             ) -> NpuTuneResult:
    """Measure the tiling candidates of ``mod``'s NPU products on the simulator into ``db``
    (see the module docstring) for at most ``budget_s`` seconds (None: all). Candidates
    recorded already are not measured again. ``on_trial(task, candidate, default_cycles)``
    reports each one measured."""
    tgt = Target.create(target)
    tkey = target_key(tgt)
    clock_hz = npu_config_of(tgt).clock_mhz * 1e6
    start = time.monotonic()
    deadline = start + budget_s if budget_s is not None else math.inf
    result = NpuTuneResult(extract_npu_tasks(mod, tgt, params))
    machine = {**machine_info(), "simulator": f"kiln.npu.simulator {tgt.spec}"}
    for task in result.tasks:
        records = {r.knobs.get(TILING_KNOB): r for r in db.records(task.record_key, tkey)}
        todo = [c for c in task.domain if c not in records]
        if todo and time.monotonic() < deadline:
            _measure_task(db, task, todo, records, tgt, tkey, clock_hz, machine, result,
                          deadline, on_trial)
        default = records.get(task.default)
        if default is None or default.mean_s is None:
            continue
        result.default_cycles[task.key] = _cycles_of(default, clock_hz)
        best = min((r for r in records.values() if r.mean_s is not None),
                   key=lambda r: r.mean_s)
        result.best_cycles[task.key] = _cycles_of(best, clock_hz)
        result.best_tiling[task.key] = best.knobs[TILING_KNOB]
    result.seconds = time.monotonic() - start
    return result


def _measure_task(db: TuningDatabase, task: NpuTask, todo: list[Any],
                  records: dict[Any, Record], tgt: Target, tkey: str, clock_hz: float,
                  machine: dict[str, Any], result: NpuTuneResult, deadline: float,
                  on_trial: Callable[[NpuTask, NpuCandidate, float], None] | None) -> None:
    """Measure ``todo`` of ``task`` (the default first: every candidate's output is compared
    with its), adding a record per candidate to ``db`` and to ``records``."""
    try:
        refs = [measure_layer(layer.call, tgt, task.key, task.default)
                for layer in task.layers]
    except Exception as err:  # noqa: BLE001 - recorded; the other layers are still tuned
        why = f"the default tiling failed: {type(err).__name__}: {err}"
        db.add_records([Record(task.record_key, tkey, {TILING_KNOB: task.default}, why, [],
                               False, why, machine)])
        progress.info("tune npu: %s: %s", task.name, why)
        result.trials += 1
        result.bad += 1
        return
    default_cycles = sum(lay.count * r.cycles for lay, r in zip(task.layers, refs))
    db.add_workload(Workload(task.record_key, tkey, task.name, "npu.tiling",
                             default_cycles / clock_hz))
    measured = result.measured.setdefault(task.key, [])
    for tiling in todo:
        if time.monotonic() >= deadline and tiling != task.default:
            break
        cand = _measure_candidate(task, tiling, tgt, refs)
        trace = f"tiling {tiling}: {cand.error or f'{cand.cycles:.0f} simulated cycles'}"\
            f" per model run (estimate {cand.estimate:.0f})"
        rec = Record(task.record_key, tkey, {TILING_KNOB: tiling}, trace,
                     [] if cand.cycles is None else [cand.cycles / clock_hz],
                     cand.cycles is not None, cand.error, machine,
                     ratio=None if cand.cycles is None else cand.cycles / default_cycles)
        db.add_records([rec])
        records[tiling] = rec
        measured.append(cand)
        result.trials += 1
        result.bad += cand.cycles is None
        if on_trial is not None:
            on_trial(task, cand, default_cycles)
        progress.info("tune npu: %s %s: %s", task.name, tiling, cand.error or
                      f"{cand.cycles:.0f} cycles ({cand.cycles / default_cycles:.3f})")


def _measure_candidate(task: NpuTask, tiling: Any, tgt: Target, refs: list[LayerRun]
                       ) -> NpuCandidate:
    cycles = estimate = 0.0
    for layer, ref in zip(task.layers, refs):
        try:
            run = ref if tiling == task.default else \
                measure_layer(layer.call, tgt, task.key, tiling)
        except Exception as err:  # noqa: BLE001 - a candidate that fails is recorded bad
            return NpuCandidate(tiling, None, estimate, f"{type(err).__name__}: {err}")
        why = _same_result(tiling, task.default, run.output, ref.output)
        if why:
            return NpuCandidate(tiling, None, estimate, why)
        cycles += layer.count * run.cycles
        estimate += layer.count * run.estimate
    return NpuCandidate(tiling, cycles, estimate)
