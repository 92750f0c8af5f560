"""Speed on a busy machine: each model of ``benchmarks/models.py`` with 0, 1 and 2 competing
busy processes, kiln next to onnxruntime.

    python benchmarks/contention.py                  # every model
    python benchmarks/contention.py mlp_b1 resnet18  # some of them
    python benchmarks/contention.py --threads 2      # both engines at 2 threads (default:
                                                     # each engine's own default)
    python benchmarks/contention.py --kiln-env GOMP_SPINCOUNT=300000   # try an OpenMP setting

A competitor is a process spinning in a busy loop, started in its own session
(``start_new_session=True``) as another service on the machine would be: the kernel's
scheduler shares CPU time between sessions first, so a competitor in the *same* session (a
plain child) is shared fairly and hides the problem. Each engine runs in a process of its own
(so neither sees the other's thread pool), loads the model once and is timed at every level of
competition in turn; the slowdown is its median latency with competitors over its median alone.
The target of the serving issue: kiln's slowdown no worse than onnxruntime's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = (0, 1, 2)

_CHILD = r"""
import os, statistics, sys, time
import numpy as np
engine, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from kiln.testing import torch_models
name = sys.argv[5]
model_name, batch = sys.argv[6], int(sys.argv[7])
inputs = torch_models.example_inputs(model_name, batch)
if engine == "ort":
    import onnxruntime as ort
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    run = lambda: sess.run(None, feeds)
else:
    import kiln
    from kiln.frontend.onnx import from_onnx
    mod, params = from_onnx(path)
    exe = kiln.build(mod, params=params)
    if threads:
        exe.set_num_threads(threads)
    feeds = {t.name: a for t, a in zip(exe.inputs, inputs)}
    run = lambda: exe.run(feeds)
for _ in range(3):
    run()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() != "measure":
        break
    budget = float(os.environ.get("KILN_CONTENTION_SECONDS", "2.0"))
    run()
    times, start = [], time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < budget and len(times) < 2000):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    print(f"{statistics.median(times) * 1e3:.4f} {len(times)}", flush=True)
"""


def _competitors(n: int) -> list[subprocess.Popen]:
    """``n`` busy processes, each in a session of its own."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             start_new_session=True) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def measure(engine: str, path: str, case: tuple[str, str, int], threads: int,
            env: dict[str, str]) -> dict[int, tuple[float, int]]:
    """Median ms (and run count) of ``engine`` at each level of competition."""
    name, model_name, batch = case
    root = os.path.dirname(HERE)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, engine, path, str(threads), root, name, model_name,
         str(batch)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, **env}, cwd=root)
    try:
        line = child.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{engine} child failed on {name}")
        out = {}
        for level in LEVELS:
            procs = _competitors(level)
            try:
                time.sleep(0.5)  # let the competitors reach full speed
                child.stdin.write("measure\n")
                child.stdin.flush()
                ms, runs = child.stdout.readline().split()
                out[level] = (float(ms), int(runs))
            finally:
                _stop(procs)
            time.sleep(0.3)
        child.stdin.write("quit\n")
        child.stdin.flush()
        return out
    finally:
        child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, HERE)
    from models import CASES

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"subset of {sorted(CASES)}")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of both engines (default 0: each engine's default)")
    ap.add_argument("--kiln-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of kiln's process (e.g. GOMP_SPINCOUNT=300000)")
    ap.add_argument("--engines", default="kiln,ort", help="comma-separated: kiln, ort")
    args = ap.parse_args(argv)
    unknown = set(args.cases) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {sorted(CASES)}")
    kiln_env = dict(kv.split("=", 1) for kv in args.kiln_env)
    engines = args.engines.split(",")
    from kiln.testing import torch_models

    print(f"{os.cpu_count()} CPUs; threads: {args.threads or 'engine default'}; kiln env: "
          f"{kiln_env or 'none'}; competitors are busy processes in their own sessions")
    header = (f"{'model':14s} {'busy':>4s} | " + " | ".join(f"{e:>4s} ms  slowdown"
                                                            for e in engines))
    print(header)
    print("-" * len(header))
    slowdowns: dict[str, list[float]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases or CASES:
            model_name, batch = CASES[name]
            data, _ = torch_models.onnx_model(model_name, batch)
            path = os.path.join(tmp, f"{name}.onnx")
            with open(path, "wb") as f:
                f.write(data)
            results = {e: measure(e, path, (name, model_name, batch), args.threads,
                                  kiln_env if e == "kiln" else {}) for e in engines}
            for level in LEVELS:
                cells = []
                for e in engines:
                    ms = results[e][level][0]
                    slow = ms / results[e][0][0]
                    if level:
                        slowdowns[e].append(slow)
                    cells.append(f"{ms:7.3f}  {slow:7.2f}x")
                print(f"{name:14s} {level:4d} | " + " | ".join(cells), flush=True)
    for e in engines:
        if slowdowns[e]:
            print(f"{e}: geometric mean slowdown under contention "
                  f"{statistics.geometric_mean(slowdowns[e]):.2f}x, worst "
                  f"{max(slowdowns[e]):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
