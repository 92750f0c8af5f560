"""What ``kiln tune`` prints: the live progress line of a round and the database report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .database import TuningDatabase
from .graph_tuning import GraphTuneResult
from .npu_tuning import NpuCandidate, NpuTask, NpuTuneResult
from .tuner import TaskProgress

__all__ = ["format_duration", "graph_summary", "graph_trial_line", "npu_summary",
           "npu_trial_line", "parse_duration", "progress_line", "report", "summary"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"90"``, ``"90s"``, ``"10m"``, ``"1.5h"``; ValueError otherwise."""
    t = text.strip().lower()
    unit = _UNITS.get(t[-1:]) if t else None
    number = t[:-1] if unit is not None else t
    value = float(number) * (unit or 1.0)
    if not value > 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return value


def format_duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4f} ms"


def progress_line(state: TaskProgress, states: Sequence[TaskProgress], left_s: float) -> str:
    """One line after a round: the task's trials, best time and speed-up over its default,
    the whole model's estimated kernel-time speed-up, and the time left (the ETA)."""
    k = next((i for i, s in enumerate(states) if s is state), 0) + 1
    speed = f"{state.speedup:.2f}x" if state.speedup else "-"
    return (f"[{k}/{len(states)}] {state.task.name}: {state.trials} trials "
            f"({state.bad} bad), best {_ms(state.best_s)} = {speed} default | model "
            f"{model_speedup(states):.3f}x | ETA {format_duration(left_s)}")


def graph_trial_line(key: str, decision: dict[str, Any], ratio: float | None) -> str:
    """One line per measured graph-knob candidate: the op call, the decision, the model's
    time with it over the model's time with the call's default decision."""
    got = "bad" if ratio is None else f"{ratio:.3f} of the default's model time"
    return f"[layout] {key}: {decision}: {got}"


def graph_summary(result: GraphTuneResult) -> str:
    """The graph part of ``kiln tune``'s final table: per op call, its best decision's time
    ratio (the whole model's time, that call's default = 1)."""
    lines = [f"layouts: {result.trials} candidates measured ({result.bad} bad) in "
             f"{result.seconds:.0f} s"]
    for key, ratios in result.ratios.items():
        good = {d: r for d, r in ratios.items() if r is not None}
        if good:
            best = min(good, key=good.__getitem__)
            lines.append(f"  {key[:90]}: best {best} {good[best]:.3f}")
    return "\n".join(lines)


def npu_trial_line(task: NpuTask, cand: NpuCandidate, default_cycles: float) -> str:
    """One line per simulated tiling candidate: the layer, the tiling, its cycles per model
    run against the default tiling's."""
    got = f"bad: {cand.error[:80]}" if cand.cycles is None else \
        f"{cand.cycles:.0f} cycles = {cand.cycles / default_cycles:.3f} of the default's"
    return f"[npu] {task.name[:60]}: tiling {cand.tiling}: {got}"


def npu_summary(result: NpuTuneResult) -> str:
    """``kiln tune --target npu``'s final table: per tiling key (its layers), the calls, the
    default's and the best tiling's simulated cycles per model run; the products' total; the
    cost model's rank correlation with the simulator over this run's candidates."""
    lines = [f"NPU tilings: {result.trials} candidates simulated ({result.bad} bad) in "
             f"{result.seconds:.0f} s",
             f"{'layer':<58} {'calls':>5} {'default':>10} {'best':>10} {'speed-up':>8}  tiling"]
    for t in result.tasks:
        if t.key not in result.default_cycles:
            lines.append(f"{t.name[:58]:<58} {t.calls:>5} {'-':>10} {'-':>10} {'-':>8}  "
                         "not measured")
            continue
        d, b = result.default_cycles[t.key], result.best_cycles[t.key]
        lines.append(f"{t.name[:58]:<58} {t.calls:>5} {d:>10.0f} {b:>10.0f} {d / b:>7.3f}x  "
                     f"{result.best_tiling[t.key]}")
    before, after = result.model_cycles()
    if after:
        lines.append(f"products' cycles per model run: {before:.0f} -> {after:.0f} "
                     f"({before / after:.3f}x)")
    mean, pooled = result.rank_correlation()
    if not (mean != mean and pooled != pooled):  # both NaN: nothing measured now
        lines.append(f"cost model vs simulator (Spearman, this run's candidates): per layer "
                     f"{mean:.3f}, pooled {pooled:.3f}")
    return "\n".join(lines)


def model_speedup(states: Sequence[TaskProgress]) -> float:
    """Estimated speed-up of the tuned tasks' share of a model run (calls x time)."""
    before = sum(s.task.weight * s.default_s for s in states if s.default_s)
    after = sum(s.task.weight * (s.best_s or s.default_s) for s in states if s.default_s)
    return before / after if after else 1.0


def summary(states: Sequence[TaskProgress]) -> str:
    """The table ``kiln tune`` prints at its end."""
    lines = [f"{'kernel':<48} {'calls':>5} {'trials':>6} {'default':>12} {'best':>12} "
             f"{'speed-up':>8}"]
    for s in sorted(states, key=lambda s: -(s.task.weight * (s.default_s or 0))):
        speed = f"{s.speedup:.2f}x" if s.speedup else s.error[:40] or "-"
        lines.append(f"{s.task.name[:48]:<48} {s.task.weight:>5} {s.trials:>6} "
                     f"{_ms(s.default_s):>12} {_ms(s.best_s):>12} {speed:>8}")
    lines.append(f"estimated speed-up of the tuned kernels' time per run: "
                 f"{model_speedup(states):.3f}x")
    return "\n".join(lines)


def report(db: TuningDatabase) -> str:
    """A summary of a database: per target and kernel, the measured candidates (good and
    bad), the default's and the best time, and the machines that measured them."""
    workloads = db.workloads()
    if not workloads and not db.records():
        return f"{db.path}: no tuning records"
    lines = [f"{db.path}: {len(workloads)} kernels, {len(db.records())} measured candidates"]
    for target in sorted({w.target for w in workloads}):
        lines.append(f"target {target}")
        lines.append(f"  {'kernel':<44} {'key':<16} {'good':>5} {'bad':>4} {'default':>12} "
                     f"{'best':>12} {'speed-up':>8}  machines")
        for w in sorted((w for w in workloads if w.target == target), key=lambda w: w.name):
            recs = db.records(w.kernel, target)
            good = [r for r in recs if r.ok]
            best, speed = None, "-"
            if good and good[0].ratio:
                speed = f"{1 / good[0].ratio:.2f}x"
                best = w.default_s * good[0].ratio if w.default_s else good[0].mean_s
            elif good:
                best = good[0].mean_s
                speed = f"{w.default_s / best:.2f}x" if best and w.default_s else "-"
            hosts = sorted({r.machine.get("host", "?") for r in recs})
            lines.append(f"  {w.name[:44]:<44} {w.kernel:<16} {len(good):>5} "
                         f"{len(recs) - len(good):>4} {_ms(w.default_s):>12} {_ms(best):>12} "
                         f"{speed:>8}  {', '.join(hosts)}")
    return "\n".join(lines)
