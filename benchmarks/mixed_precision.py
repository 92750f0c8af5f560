"""Mixed precision: float32 vs float16 vs bfloat16 (ToMixedPrecision), side by side.

    python benchmarks/mixed_precision.py              # every workload
    python benchmarks/mixed_precision.py conv         # workloads whose name contains "conv"

Each workload is one float32 graph (weights are constants, inputs float32): it is built as is,
and after ``ToMixedPrecision("float16")`` and ``ToMixedPrecision("bfloat16")`` (conv2d and
dense accumulate in float32; element-wise work follows; the model's inputs and outputs keep
float32). The table shows the median latency (the three builds timed in turns), the speed-up
over float32, and the largest error relative to a float64 numpy reference
(``max |out - ref| / max |ref|``).

Whether float16 is computed natively depends on the CPU: with AVX512-FP16 the kernels use
``_Float16`` arithmetic; otherwise (and always for bfloat16) values are stored in 16 bits and
computed in float32 -- half the memory traffic, the same arithmetic.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen import c as cg
from kiln.ir import IRModule
from kiln.target import Target
from kiln.testing import models
from kiln.testing.timing import median_seconds
from kiln.transform import ToMixedPrecision

DTYPES = ("float32", "float16", "bfloat16")
#: Rounds of interleaved timing per workload.
ROUNDS = 5


@dataclass
class Workload:
    name: str
    mod: IRModule
    inputs: list[np.ndarray]
    reference: Callable[..., np.ndarray]


def dense_workload(n: int = 1024) -> Workload:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype("float32")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, n), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.dense(x, g.const(w)))
        bb.emit_func_output(out)
    xv = rng.standard_normal((n, n)).astype("float32")
    return Workload(f"dense {n}x{n}x{n}", bb.get(), [xv],
                    lambda a: a.astype(np.float64) @ w.T.astype(np.float64))


def conv_workload(n: int = 1, c: int = 64, size: int = 56, o: int = 64) -> Workload:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype("float32")
    bias = (0.1 * rng.standard_normal((1, o, 1, 1))).astype("float32")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, c, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, g.const(w), padding=1))
            out = bb.emit_output(op.nn.relu(op.add(h, g.const(bias))))
        bb.emit_func_output(out)

    def reference(a: np.ndarray) -> np.ndarray:
        p = np.pad(a.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        res = np.zeros((n, o, size, size))
        for di in range(3):
            for dj in range(3):
                res += np.einsum("nchw,oc->nohw", p[:, :, di:di + size, dj:dj + size],
                                 w[:, :, di, dj].astype(np.float64))
        return np.maximum(res + bias, 0)

    xv = rng.standard_normal((n, c, size, size)).astype("float32")
    return Workload(f"conv2d+bias+relu {n}x{c}x{size}x{size}->{o}", bb.get(), [xv], reference)


def resnet_workload() -> Workload:
    m = models.resnet_block_cnn(batch=8, channels=64, size=28)
    shape = "x".join(str(d) for d in m.inputs[0].shape)
    return Workload(f"{m.name} {shape}", m.mod, m.inputs, m.reference)


def workloads() -> list[Callable[[], Workload]]:
    return [dense_workload, conv_workload, resnet_workload]


def max_rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(out64 - ref64).max() / max(np.abs(ref64).max(), 1e-30))


def main(argv: list[str]) -> int:
    pattern = argv[1] if len(argv) > 1 else ""
    tgt = Target("c")
    path = "native _Float16" if cg.native_float16(tgt) else "widened (16-bit storage, f32 math)"
    threads = os.environ.get("OMP_NUM_THREADS", f"all {os.cpu_count()} cores")
    print(f"float16 code path: {path}; F16C: {'f16c' in tgt.features}; "
          f"vector bits: {tgt.vector_bits}; threads: {threads}")
    head = f"{'workload':38s}" + "".join(f"{d + ' ms':>14s}" for d in DTYPES)
    head += "".join(f"{'x ' + d:>11s}" for d in DTYPES[1:])
    head += "".join(f"{'err ' + d:>14s}" for d in DTYPES)
    print(head)
    for make in workloads():
        wl = make()
        if pattern not in wl.name:
            continue
        ref = wl.reference(*wl.inputs)
        exes, errs = [], []
        for dtype in DTYPES:
            mod = wl.mod if dtype == "float32" else ToMixedPrecision(dtype)(wl.mod)
            exe = kiln.build(mod, target=tgt)
            errs.append(max_rel_err(exe(*wl.inputs), ref))
            exes.append(exe)
        # the three builds are timed in turns, ROUNDS times, so that a change in the machine's
        # load does not favour one of them; each figure is the median over all rounds
        samples: list[list[float]] = [[] for _ in DTYPES]
        for _ in range(ROUNDS):
            for k, exe in enumerate(exes):
                samples[k].append(median_seconds(lambda exe=exe, args=wl.inputs: exe(*args),
                                                 min_repeat=3, min_time=0.1, warmup=1))
        times = [statistics.median(s) for s in samples]
        row = f"{wl.name:38s}" + "".join(f"{t * 1e3:14.3f}" for t in times)
        row += "".join(f"{times[0] / t:10.2f}x" for t in times[1:])
        row += "".join(f"{e:14.2e}" for e in errs)
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
