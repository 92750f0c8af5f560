"""Auto-tuning: model latency before and after tuning, next to onnxruntime; the cost model's
rank correlation with measured times on held-out candidates.

    python benchmarks/tuning.py                          # ResNet-18, MobileNetV2, BERT encoder
    python benchmarks/tuning.py resnet18 --budget 10m --budget 30m
    python benchmarks/tuning.py mobilenet_v2 --budget 2m --db /tmp/tuning   # keep the databases
    python benchmarks/tuning.py --db /tmp/tuning --retime   # re-time kept databases, no tuning

Each model (``kiln.testing.torch_models``, exported to ONNX, batch 1) is tuned into a fresh
database (``kiln.tune``) for each budget in turn (the budgets are cumulative: ``--budget 10m
--budget 30m`` tunes 10 minutes, measures, then 20 more), and after each the executable built
with ``tuning_db=`` is timed against the default build and onnxruntime in alternating rounds
(``kiln.testing.timing.compare``; medians, ratios lower is better). Then the tuner's cost model
ranks held-out candidates -- random points of the heaviest kernels' spaces that the search did
not measure -- and they are measured: the Spearman correlation of predicted with measured
speed-ups over each kernel's default, pooled and per kernel. ``--retime`` tunes nothing: it
re-times the databases an earlier run kept (``--db``) at each budget, each as it stood that long
after its first record (a tuning on a busy machine, timed later on a quiet one). Every engine gets
``KILN_BENCH_THREADS`` threads (default 2).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np
from models import ort_session  # the script's folder: benchmarks/models.py

THREADS = int(os.environ.get("KILN_BENCH_THREADS", "2"))
ROUNDS = 5  # alternating timing rounds (--rounds)

# name -> (torch_models name, batch)
CASES = {
    "resnet18": ("resnet18", 1),
    "mobilenet_v2": ("mobilenet_v2", 1),
    "bert_seq128": ("bert_encoder", 1),
}


def held_out_correlation(tuner, states, kernels: int = 4, per_kernel: int = 6):
    """(pooled Spearman, mean per-kernel Spearman, candidates measured) of the cost model's
    predictions against measurements of unmeasured random candidates."""
    from kiln.tune.cost_model import spearman

    pred_all, meas_all, per = [], [], []
    heavy = sorted((s for s in states if s.default_s), key=lambda s: -s.task.weight * s.default_s)
    for state in heavy[:kernels]:
        search = tuner.searches[state.task.key]
        picked = search.random_candidates(per_kernel)
        if len(picked) < 3:
            continue
        pred = tuner.model.predict([f for _, f in picked])
        measured = tuner.measurer.measure(state.task, [k for k, _ in picked])
        pairs = [(p, -math.log(m.run.ratio)) for p, m in zip(pred, measured) if m.run.ratio]
        if len(pairs) >= 3:
            rho = spearman(*zip(*pairs))
            if not math.isnan(rho):
                per.append(rho)
            pred_all += [p for p, _ in pairs]
            meas_all += [m for _, m in pairs]
    pooled = spearman(pred_all, meas_all) if len(pred_all) >= 3 else float("nan")
    return pooled, (float(np.mean(per)) if per else float("nan")), len(pred_all)


def time_tuned(name: str, budget: float, mod: Any, params: Any, db: Any, default: Any,
               sess: Any, feeds: dict, ref: np.ndarray, trials: int) -> str:
    """Build ``mod`` with ``db`` and time it against the default build and onnxruntime in
    alternating rounds; the printed (and returned) row."""
    import kiln
    from kiln.testing.timing import compare

    tuned = kiln.build(mod, params=params, tuning_db=db)
    tuned.set_num_threads(THREADS)
    err = float(np.max(np.abs(np.asarray(tuned(**feeds)) - ref)) / (np.max(np.abs(ref)) + 1e-12))
    times = compare({"default": lambda: default(**feeds),
                     "tuned": lambda: tuned(**feeds),
                     "onnxruntime": lambda: sess.run(None, feeds)}, rounds=ROUNDS)
    row = (f"{name:13s} {budget / 60:5.1f} min | default "
           f"{times.median('default') * 1e3:8.3f} ms | tuned "
           f"{times.median('tuned') * 1e3:8.3f} ms | ORT "
           f"{times.median('onnxruntime') * 1e3:8.3f} ms | tuned/default "
           f"{times.ratio_text('tuned', 'default')} | default/ORT "
           f"{times.ratio_text('default', 'onnxruntime')} | tuned/ORT "
           f"{times.ratio_text('tuned', 'onnxruntime')} (of the medians "
           f"{times.median('tuned') / times.median('onnxruntime'):.2f}) | "
           f"{trials} trials | rel.err {err:.1e}")
    print(row, flush=True)
    return row


def snapshot(db_path: str, seconds: float, out_path: str) -> int:
    """Copy the tuning database ``db_path`` to ``out_path`` as it stood ``seconds`` after its
    first record (the records created later removed): a cumulative budget's state, re-timed
    by ``--retime``. Returns the records kept."""
    import sqlite3

    src = sqlite3.connect(db_path)
    dst = sqlite3.connect(out_path)
    try:
        src.backup(dst)  # consistent with a WAL-mode source
        (first,) = dst.execute("SELECT MIN(created) FROM records").fetchone()
        if first is not None:
            dst.execute("DELETE FROM records WHERE created > ?", (first + seconds,))
            dst.commit()
        return dst.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    finally:
        src.close()
        dst.close()


def bench_case(name: str, budgets: list[float], db_dir: str, batch: int,
               retime: bool = False) -> list[str]:
    import kiln
    from kiln.frontend.onnx import from_onnx
    from kiln.testing import torch_models
    from kiln.tune.database import TuningDatabase
    from kiln.tune.report import summary
    from kiln.tune.tasks import extract_tasks
    from kiln.tune.tuner import Tuner

    model_name, mbatch = CASES[name]
    _, data, inputs = torch_models.exported(model_name, mbatch)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        with open(path, "wb") as f:
            f.write(data)
        sess = ort_session(path)
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
        ref = sess.run(None, feeds)[0]
        mod, params = from_onnx(path)
        default = kiln.build(mod, params=params)
        default.set_num_threads(THREADS)
        db_path = os.path.join(db_dir, f"{name}.sqlite")
        if retime:
            if not os.path.exists(db_path):
                raise SystemExit(f"--retime: no database {db_path}")
            for budget in budgets:
                snap = os.path.join(tmp, f"{name}-{budget:g}.sqlite")
                kept = snapshot(db_path, budget, snap)
                db = TuningDatabase(snap, create=False)
                try:
                    rows.append(time_tuned(name, budget, mod, params, db, default, sess, feeds,
                                           ref, kept))
                finally:
                    db.close()
            return rows
        t0 = time.monotonic()
        tasks = extract_tasks(mod, "c", params)
        print(f"{name}: {len(tasks)} tasks extracted in {time.monotonic() - t0:.1f} s",
              flush=True)
        if os.path.exists(db_path):
            os.remove(db_path)
        db = TuningDatabase(db_path)
        tuner = Tuner(db, batch=batch)
        spent = 0.0
        states = []
        try:
            for budget in budgets:
                states = tuner.tune(tasks, budget - spent)
                spent = budget
                print(summary(states), flush=True)
                rows.append(time_tuned(name, budget, mod, params, db, default, sess, feeds, ref,
                                       sum(s.trials for s in states)))
            pooled, mean, n = held_out_correlation(tuner, states)
            row = (f"{name:13s} cost model on {n} held-out candidates "
                   f"({tuner.model.samples} training samples): Spearman pooled {pooled:.2f}, "
                   f"per kernel mean {mean:.2f}")
            print(row, flush=True)
            rows.append(row)
        finally:
            tuner.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    from kiln.tune.report import parse_duration

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"subset of {sorted(CASES)}")
    ap.add_argument("--budget", action="append", default=[],
                    help="tuning time per model, cumulative when repeated (default 10m, 30m)")
    ap.add_argument("--batch", type=int, default=8, help="candidates per round")
    ap.add_argument("--db", default=None, help="folder for the databases (default: temporary)")
    ap.add_argument("--retime", action="store_true",
                    help="tune nothing: time the databases in --db as they stood at each budget "
                    "(records created within that long of the first one)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    args = ap.parse_args(argv)
    if args.retime and not args.db:
        ap.error("--retime needs --db (the folder of an earlier run's databases)")
    global ROUNDS
    ROUNDS = args.rounds
    unknown = set(args.cases) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {sorted(CASES)}")
    budgets = sorted(parse_duration(b) for b in (args.budget or ["10m", "30m"]))
    print(f"threads: {THREADS}; budgets {[f'{b / 60:g} min' for b in budgets]}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        db_dir = args.db or tmp
        os.makedirs(db_dir, exist_ok=True)
        for name in args.cases or CASES:
            rows += bench_case(name, budgets, db_dir, args.batch, args.retime)
    print("\n".join(["", "summary:"] + rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
