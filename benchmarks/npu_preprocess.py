"""NPU PreProcess: what splitting the ops the NPU lacks into ones it has changes.

    python benchmarks/npu_preprocess.py            # on "default"
    python benchmarks/npu_preprocess.py --hw edge

Small blocks whose activation or reduction the NPU has no lowering for -- a transformer FFN
with GELU (erf and tanh forms), a convolution block with SiLU, a mean over a leading axis --
are built with ``kiln.build(target="npu")`` twice: with PreProcess (the default) and with it
disabled (``PassContext(disabled_pass=["PreProcess"])``: the op goes to the CPU between two
NPU programs). Per block: the ops left on the CPU, the program steps (NPU regions and CPU
calls), the simulated NPU cycles (CPU steps not counted), the wall time of one call of the
executable (simulation plus CPU steps; noisy, the median of 3), and the largest difference
between the two results.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu.executable import NpuStep
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext

RNG = np.random.default_rng(0)


def _ffn(approximate: str):
    w1 = (RNG.standard_normal((512, 128)) / 12).astype(np.float32)
    w2 = (RNG.standard_normal((128, 512)) / 23).astype(np.float32)

    def fn(x):
        h = op.gelu(op.dense(x, g.const(w1)), approximate=approximate)
        return op.dense(h, g.const(w2))
    return fn, [(64, 128)]


def _conv_silu():
    w1 = (RNG.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32)
    w2 = (RNG.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)

    def fn(x):
        y = op.silu(op.nn.conv2d(x, g.const(w1), padding=(1, 1)))
        return op.silu(op.nn.conv2d(y, g.const(w2), padding=(1, 1)))
    return fn, [(1, 16, 28, 28)]


def _mean_leading():
    return (lambda x: op.nn.softmax(op.mean(op.exp(x), axis=0), axis=-1)), [(32, 256)]


BLOCKS = {"ffn_gelu": lambda: _ffn("none"), "ffn_gelu_tanh": lambda: _ffn("tanh"),
          "conv_silu": _conv_silu, "mean_axis0": _mean_leading}


def _time(exe, xs) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        exe(*xs)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", default="default")
    ap.add_argument("blocks", nargs="*", default=list(BLOCKS))
    args = ap.parse_args()
    print(f"{'block':14s} {'PreProcess':10s} {'CPU ops':22s} {'steps':>5s} "
          f"{'NPU cycles':>11s} {'call s':>7s} {'max |diff|':>10s}")
    for name in args.blocks:
        fn, shapes = BLOCKS[name]()
        xs = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
        outs = {}
        for on in (False, True):
            with PassContext(disabled_pass=[] if on else ["PreProcess"]):
                exe = kiln.build(graph_module(fn, shapes), target=f"npu -hw={args.hw}")
            outs[on] = np.asarray(exe(*xs))
            wall = _time(exe, xs)
            steps = "".join("N" if isinstance(s, NpuStep) else "C" for s in exe.steps)
            diff = float(np.max(np.abs(outs[on] - outs[False])))
            print(f"{name:14s} {'on' if on else 'off':10s} {', '.join(exe.cpu_ops) or '-':22s} "
                  f"{steps:>5s} {exe.last_cycles:11,.0f} {wall:7.3f} {diff:10.2e}")


if __name__ == "__main__":
    main()
