"""Whole-model speed: kiln next to onnxruntime and torch eager, in one run.

    python benchmarks/models.py                    # every model
    python benchmarks/models.py resnet18 mlp_b1    # some of them
    python benchmarks/models.py --memory           # + peak memory of ResNet-18, kiln vs ORT
    python benchmarks/models.py --bf16             # + bfloat16 (ToMixedPrecision) variants
    python benchmarks/models.py --layers resnet18  # + per-layer times, kiln next to ORT
    python benchmarks/models.py --dynamic-batch    # exported with a symbolic batch dimension
    python benchmarks/models.py --cpu-time         # 1 thread, timed by thread CPU time

The networks (``kiln.testing.torch_models``) are exported from PyTorch to ONNX with random
weights; kiln imports the ONNX file at the default opt level (``-O`` to change). Every engine
gets the same thread count (``KILN_BENCH_THREADS``, default 2). Prints the median latency of each
engine and kiln / onnxruntime (lower is better; the target of the CPU-speed issue is <= 1.0).
The engines are timed in alternating rounds (``kiln.testing.timing.compare``, ``--rounds``,
default 5); the ratio is the median of the per-round ratios, with their range in brackets,
and beside it the ratio of the two engines' median latencies. On a busy shared machine the
wall-time ratios swing by tens of percent from run to run: ``--cpu-time`` runs every engine on
one thread (the calling one) and times each call by that thread's CPU time
(``time.thread_time``), which other processes' time slices do not inflate (shared caches still
do); it compares single-thread speed, not the threads' scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

THREADS = int(os.environ.get("KILN_BENCH_THREADS", "2"))

# name -> (torch_models name, batch)
CASES = {
    "resnet18": ("resnet18", 1),
    "mobilenet_v2": ("mobilenet_v2", 1),
    "text_detector": ("text_detector", 1),
    "mlp_b1": ("mlp", 1),
    "mlp_b64": ("mlp", 64),
    "bert_seq128": ("bert_encoder", 1),
    "lstm_seq64": ("lstm", 1),
}


def ort_session(path: str):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _kiln_build(path: str, opt_level: int, bf16: bool = False):
    import kiln
    from kiln.frontend.onnx import from_onnx
    from kiln.transform import PassContext, ToMixedPrecision

    mod, params = from_onnx(path)
    if bf16:
        mod = kiln.transform.BindParams("main", params)(mod)
        params = None
        mod = ToMixedPrecision("bfloat16")(mod)
    with PassContext(opt_level=opt_level):
        exe = kiln.build(mod, params=params)
    exe.set_num_threads(THREADS)
    return exe


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())


def _ort_node_times(path: str, feeds: dict, runs: int, tmp: str) -> tuple[list[str], np.ndarray]:
    """ORT's own per-node kernel times (its profiler) over ``runs`` runs after a warm-up: the
    nodes in execution order (``"OpType name"``) and a ``(runs, nodes)`` array of seconds."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tmp, "ort_profile")
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        sess.run(None, feeds)
    profile = sess.end_profiling()
    with open(profile) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node"
                  and e["name"].endswith("_kernel_time")]
    os.remove(profile)
    events.sort(key=lambda e: e["ts"])
    per_run = len(events) // (runs + 1)
    names = [f"{e.get('args', {}).get('op_name', '?')[:14]:14s} "
             f"{e['name'][:-len('_kernel_time')][-33:]}" for e in events[:per_run]]
    times = np.array([e["dur"] * 1e-6 for e in events[per_run:per_run * (runs + 1)]])
    return names, times.reshape(runs, per_run)


def bench_layers(exe, path: str, feeds: dict, rounds: int = 5, runs: int = 5) -> None:
    """Per-layer times in execution order: kiln's kernel calls (timed inside its native entry)
    next to ORT's nodes (its profiler), alternating between the engines for ``rounds`` rounds
    of ``runs`` runs each; medians over all of them. The two graphs are fused differently, so
    the rows are not matched: read the columns side by side."""
    kiln_rounds, ort_rounds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            kiln_rounds.append([t for _, t in exe.call_times(**feeds, repeat=runs)])
            ort_names, times = _ort_node_times(path, feeds, runs, tmp)
            ort_rounds.append(np.median(times, axis=0))
    kernels = [k for k, _ in exe.call_times(**feeds, repeat=1)]
    k_ms = np.median(kiln_rounds, axis=0) * 1e3
    o_ms = np.median(ort_rounds, axis=0) * 1e3
    print(f"  {'kiln kernel call':38s} {'ms':>7s} | {'onnxruntime node':48s} {'ms':>7s}")
    for i in range(max(len(kernels), len(ort_names))):
        left = f"{kernels[i][:38]:38s} {k_ms[i]:7.3f}" if i < len(kernels) else " " * 46
        right = f"{ort_names[i]:48s} {o_ms[i]:7.3f}" if i < len(ort_names) else ""
        print(f"  {left} | {right}")
    print(f"  {'sum':38s} {k_ms.sum():7.3f} | {'sum':48s} {o_ms.sum():7.3f}   "
          f"kiln/ort {k_ms.sum() / o_ms.sum():.2f}", flush=True)


def bench_case(name: str, opt_level: int, bf16: bool, layers: bool = False,
               dynamic_batch: bool = False, cpu_time: bool = False, rounds: int = 5) -> None:
    import torch

    from kiln.testing import torch_models
    from kiln.testing.timing import compare, median_seconds

    model_name, batch = CASES[name]
    module, data, inputs = torch_models.exported(model_name, batch, dynamic_batch)
    label = name + (" dyn" if dynamic_batch else "")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        with open(path, "wb") as f:
            f.write(data)
        sess = ort_session(path)
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
        ref = sess.run(None, feeds)[0]

        exe = _kiln_build(path, opt_level)
        out = np.asarray(exe(**feeds))
        err = _rel_err(out, ref)

        torch.set_num_threads(THREADS)
        targs = [torch.from_numpy(a) for a in inputs]
        with torch.inference_mode():
            times = compare({"kiln": lambda: exe(**feeds),
                             "onnxruntime": lambda: sess.run(None, feeds),
                             "torch": lambda: module(*targs)},
                            rounds=rounds,
                            clock=time.thread_time if cpu_time else time.perf_counter)
        t_ort = times.median("onnxruntime")
        print(f"{label:14s} kiln {times.median('kiln') * 1e3:9.3f} ms | onnxruntime "
              f"{t_ort * 1e3:9.3f} ms | torch {times.median('torch') * 1e3:9.3f} ms | "
              f"kiln/ort {times.ratio_text('kiln', 'onnxruntime')} "
              f"(of the medians {times.median('kiln') / t_ort:.2f}) | "
              f"rel.err {err:.1e} | {exe.num_kernels} kernels", flush=True)
        if layers:
            bench_layers(exe, path, feeds)
        if bf16:
            exe16 = _kiln_build(path, opt_level, bf16=True)
            out16 = np.asarray(exe16(**feeds)).astype(np.float32)
            t16 = median_seconds(lambda: exe16(**feeds))
            print(f"{label + ' bf16':14s} kiln {t16 * 1e3:9.3f} ms | speed-up over ORT fp32 "
                  f"{t_ort / t16:5.2f}x | rel.err vs fp32 ORT {_rel_err(out16, ref):.1e}",
                  flush=True)


_MEMORY_CHILD = r"""
import sys
import numpy as np
engine, path = sys.argv[1], sys.argv[2]
def status_kib(field):
    # /proc/self/status, not getrusage: ru_maxrss survives fork + exec, so a child would report
    # at least its parent's resident size (this script's, with torch and every model loaded).
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) * 1024
def rss():
    return status_kib("VmRSS")
if engine == "ort":
    import onnxruntime
else:
    import kiln, kiln.frontend.onnx
x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
base = rss()
if engine == "ort":
    sys.path.insert(0, sys.argv[3]); from models import _ort_session
    s = ort_session(path); run = lambda: s.run(None, {"input": x})
else:
    sys.path.insert(0, sys.argv[3]); from models import _kiln_build
    exe = _kiln_build(path, int(sys.argv[4])); run = lambda: exe(input=x)
for _ in range(3):
    run()
print(status_kib("VmHWM") - base, status_kib("VmRSS") - base)
"""


def bench_memory(opt_level: int) -> None:
    """Peak resident memory added by loading and running ResNet-18 (fresh process per engine,
    measured from just before the model is loaded; weights included; kiln's peak is reached while
    compiling), and what stays resident after the runs."""
    from kiln.testing import torch_models

    data, _ = torch_models.onnx_model("resnet18")
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "resnet18.onnx")
        with open(path, "wb") as f:
            f.write(data)
        peaks = {}
        for engine in ("kiln", "ort"):
            res = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, engine, path, here,
                                  str(opt_level)], capture_output=True, text=True, check=True)
            peaks[engine] = [int(v) for v in res.stdout.strip().splitlines()[-1].split()]
    for i, what in enumerate(("peak memory", "resident after runs")):
        kiln_mib, ort_mib = peaks["kiln"][i] / 2**20, peaks["ort"][i] / 2**20
        print(f"resnet18 {what}: kiln {kiln_mib:.1f} MiB | onnxruntime {ort_mib:.1f} MiB | "
              f"kiln/ort {kiln_mib / ort_mib:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"subset of {sorted(CASES)}")
    ap.add_argument("-O", "--opt-level", type=int, default=2)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--layers", action="store_true",
                    help="also print per-layer times, kiln next to onnxruntime")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread per engine, each call timed by the calling thread's CPU "
                    "time (steady on a busy machine)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="alternating timing rounds per model (default 5)")
    ap.add_argument("--dynamic-batch", action="store_true",
                    help="export the models with a symbolic batch dimension (as users often "
                    "do); both engines then compile for any batch")
    args = ap.parse_args(argv)
    unknown = set(args.cases) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {sorted(CASES)}")
    if args.cpu_time:
        global THREADS
        THREADS = 1
    print(f"threads: {THREADS}; kiln opt level {args.opt_level}"
          + ("; timed by thread CPU time" if args.cpu_time else ""))
    for name in args.cases or CASES:
        bench_case(name, args.opt_level, args.bf16, args.layers, args.dynamic_batch,
                   args.cpu_time, rounds=args.rounds)
    if args.memory:
        bench_memory(args.opt_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
