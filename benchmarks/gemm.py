"""Dense float32 GEMM against the machine's FMA peak, kiln beside numpy (OpenBLAS).

    python benchmarks/gemm.py                 # peak, then 1024^3 and 2048^3
    python benchmarks/gemm.py --sizes 1024    # some sizes
    python benchmarks/gemm.py --peak-only     # the FMA peak alone
    python benchmarks/gemm.py --target x86-64-v3   # kiln's AVX2 code on an AVX-512 machine
    KILN_BENCH_THREADS=1 python benchmarks/gemm.py # one thread

The peak is measured by ``benchmarks/fma_peak.c`` (compiled here with ``$CC`` or gcc, ``-O3
-march=native``): independent FMA chains in registers, no memory traffic, on the benchmark's
thread count (``KILN_BENCH_THREADS``, default 2), for AVX2 (ymm, 8 lanes) and, where the CPU
has it, AVX-512 (zmm, 16 lanes). Each runs ``--peak-runs`` times; the best run is printed as
the peak (a shared machine only ever makes a run slower) with the spread.

Then ``y = x @ w.T`` (``kiln.op.dense``, n x n x n) in two forms: ``w`` a constant (packed once
at compile time, as in a model) and ``w`` a run-time input (packed on every call, in the
timing). kiln, numpy and the FMA loop (the faster kind) are timed in alternating rounds
(:func:`alternate`), so each GEMM's fraction of peak compares it with the loop under the same
load, round by round. Printed: GFLOP/s (2 n^3 flops over the median wall time); the fraction
of peak by wall time and by CPU time (flops per CPU-second of the process against the loop's,
median and range over the rounds: on a machine shared with other work the wall fraction moves
with the load, the CPU fraction measures the code -- note that a thread pool's idle spinning
counts as CPU time); and kiln / numpy, the median of the per-round wall-time ratios with their
range.

OpenBLAS reads ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` when numpy is imported; a
value set for another machine slows it down, so this script removes both from its own
environment before importing numpy, and gives OpenBLAS the benchmark's thread count.
"""

from __future__ import annotations

import os

THREADS = int(os.environ.get("KILN_BENCH_THREADS", "2"))
for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_var, None)
os.environ["OPENBLAS_NUM_THREADS"] = str(THREADS)

import argparse  # noqa: E402 - the environment above must be set before numpy loads OpenBLAS
import ctypes  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from kiln import graph as g  # noqa: E402
from kiln import op  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class FmaPeak:
    """``benchmarks/fma_peak.c`` compiled as a shared library (``$CC`` or gcc, ``-O3
    -march=native``): :meth:`seconds` runs its register-only FMA loop ``trips`` times per
    thread on :data:`THREADS` threads, :meth:`flops` says how many flops that is."""

    KINDS = {"ymm": 0, "zmm": 1}

    def __init__(self, tmp: str) -> None:
        cc = shlex.split(os.environ.get("CC", "gcc"))
        path = os.path.join(tmp, "fma_peak.so")
        subprocess.run([*cc, "-O3", "-march=native", "-pthread", "-shared", "-fPIC", "-o",
                        path, os.path.join(HERE, "fma_peak.c")], check=True)
        self.lib = ctypes.CDLL(path)
        for fn in (self.lib.fma_peak_seconds, self.lib.fma_peak_flops):
            fn.restype = ctypes.c_double
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong]
        self.kinds = [k for k, wide in self.KINDS.items() if self.seconds(k, 1000) >= 0]

    def seconds(self, kind: str, trips: int) -> float:
        return self.lib.fma_peak_seconds(self.KINDS[kind], THREADS, trips)

    def flops(self, kind: str, trips: int) -> float:
        return self.lib.fma_peak_flops(self.KINDS[kind], THREADS, trips)

    def trips_for(self, kind: str, seconds: float) -> int:
        """Loop trips that take about ``seconds`` now."""
        t = self.seconds(kind, 100_000)
        return max(1000, int(100_000 * seconds / max(t, 1e-6)))


def peak_table(peak: FmaPeak, runs: int) -> dict[str, float]:
    """The best GFLOP/s of ``runs`` runs of about 0.3 s per register kind, printed with the
    spread; the best of every kind."""
    best = {}
    for kind in peak.kinds:
        trips = peak.trips_for(kind, 0.3)
        rates = [peak.flops(kind, trips) / peak.seconds(kind, trips) / 1e9 for _ in range(runs)]
        best[kind] = max(rates)
        print(f"FMA peak {kind} ({THREADS} threads): {max(rates):7.1f} GFLOP/s "
              f"(runs {min(rates):.1f}-{max(rates):.1f})", flush=True)
    return best


def dense_module(n: int, w: np.ndarray | None) -> kiln.IRModule:
    """``main(x[, w]) = dense(x, w)`` of n x n float32 matrices; ``w`` given: a constant."""
    bb = g.BlockBuilder()
    sinfo = g.TensorStructInfo((n, n), "float32")
    params = [g.Var("x", sinfo)] + ([g.Var("w", sinfo)] if w is None else [])
    with bb.function("main", params):
        with bb.dataflow():
            rhs = params[1] if w is None else g.const(w)
            out = bb.emit_output(op.dense(params[0], rhs))
        bb.emit_func_output(out)
    return bb.get()


def alternate(engines: dict[str, Callable[[], object]], rounds: int, min_time: float = 0.25
              ) -> dict[str, list[tuple[float, float]]]:
    """``(wall seconds, CPU seconds)`` per call of each engine, round by round: in every round
    each engine runs a block of calls (one untimed first, then at least 3 and ``min_time``
    seconds) in turn, so all engines see the same phases of a shared machine's load. CPU
    seconds are the process's (every thread's, ``time.process_time``): on a loaded machine
    they leave out the time spent waiting for a CPU, which the wall time includes."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, fn in engines.items():
            fn()
            calls, t0, c0 = 0, time.perf_counter(), time.process_time()
            while calls < 3 or time.perf_counter() - t0 < min_time:
                fn()
                calls += 1
            out[name].append(((time.perf_counter() - t0) / calls,
                              (time.process_time() - c0) / calls))
    return out


def _spread(values: list[float], fmt: str) -> str:
    return (f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-"
            f"{format(max(values), fmt)})")


def bench_dense(n: int, const_w: bool, peak: FmaPeak, kind: str, rounds: int,
                target: str = "c") -> None:
    """kiln, numpy and the FMA loop in alternating rounds: each GEMM's GFLOP/s as a fraction
    of the loop's in the same round, by wall time and by CPU time (median and range)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal((n, n), dtype=np.float32)
    exe = kiln.build(dense_module(n, w if const_w else None), target=target)
    exe.set_num_threads(THREADS)
    args = (x,) if const_w else (x, w)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    err = float(np.abs(np.asarray(exe(*args)) - ref).max() / np.abs(ref).max())
    trips = peak.trips_for(kind, 0.02)
    times = alternate({"kiln": lambda: exe(*args), "numpy": lambda: x @ w.T,
                       "peak": lambda: peak.seconds(kind, trips)}, rounds)
    flops, peak_flops = 2.0 * n**3, peak.flops(kind, trips)
    cells = []
    for name in ("kiln", "numpy"):
        wall = [flops / t / (peak_flops / p) for (t, _), (p, _) in zip(times[name],
                                                                      times["peak"])]
        cpu = [flops / c / (peak_flops / p) for (_, c), (_, p) in zip(times[name],
                                                                     times["peak"])]
        rate = flops / statistics.median(t for t, _ in times[name]) / 1e9
        cells.append(f"{name} {rate:6.1f} GFLOP/s, of peak: wall {_spread(wall, '.0%')} "
                     f"cpu {_spread(cpu, '.0%')}")
    ratio = [k / m for (k, _), (m, _) in zip(times["kiln"], times["numpy"])]
    peak_rate = peak_flops / statistics.median(t for t, _ in times["peak"]) / 1e9
    label = f"dense {n}^3 {'const w' if const_w else 'w input'}"
    print(f"{label:22s} | {' | '.join(cells)} | kiln/numpy time {_spread(ratio, '.2f')} | "
          f"{kind} loop {peak_rate:.1f} GFLOP/s | rel.err {err:.1e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--peak-runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds per case")
    ap.add_argument("--peak-only", action="store_true")
    ap.add_argument("--target", default="c",
                    help="kiln's target (default: this CPU; x86-64-v3 for the AVX2 code)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        peak = FmaPeak(tmp)
        best = peak_table(peak, args.peak_runs)
        if args.peak_only:
            return 0
        kind = max(best, key=best.__getitem__)
        for n in args.sizes:
            for const_w in (True, False):
                bench_dense(n, const_w, peak, kind, args.rounds, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
