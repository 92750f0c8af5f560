"""NPU lowering of last resort: injective ops without a lowering of their own on the NPU vs a
CPU step.

    python benchmarks/npu_last_resort.py            # on "default"
    python benchmarks/npu_last_resort.py --hw edge

Small blocks with an op that had no NPU lowering -- a constant, edge and reflect pad before a
convolution, ``where`` of a comparison, ``broadcast_to`` feeding a product, a
``gather_elements`` -- are built with ``kiln.build(target="npu")`` twice: with the lowering of
last resort (``kiln.schedule.npu.tir_nests``, the default) and without
(``KILN_NPU_LAST_RESORT=0``: the op is a CPU step between NPU programs, its operands copied out
of DRAM and its result back). Per block: the ops left on the CPU, the program steps (N: an NPU
program, C: a CPU call), the simulated NPU cycles (CPU steps not counted), the CPU steps' host
time (median of 5 calls of their executables, in microseconds, and that time in NPU clock
cycles at the description's ``clock_mhz``: what the CPU route costs besides the NPU cycles, on
this host), the NPU kernels and how many of them are scalar-unit loops, and the largest difference
between the two results.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu.executable import CpuStep, NpuStep
from kiln.schedule.npu.nest_analysis import unit_shares
from kiln.testing.op_testing import graph_module

os.environ["KILN_EXECUTABLE_CACHE"] = "0"  # the two builds differ only in the environment
RNG = np.random.default_rng(0)


def _pad_conv(mode: str):
    w = (RNG.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)

    def fn(x):
        h = op.pad(op.nn.relu(x), ((0, 0), (0, 0), (1, 1), (1, 1)), mode=mode)
        return op.nn.conv2d(h, g.const(w))
    return fn, [(1, 16, 28, 28)], ["float32"]


def _where():
    def fn(x, y):
        return op.exp(op.where(op.greater(x, y), x, op.negative(y)))
    return fn, [(64, 256), (64, 256)], ["float32", "float32"]


def _broadcast_dense():
    w = (RNG.standard_normal((64, 128)) / 11).astype(np.float32)

    def fn(x):
        return op.dense(op.broadcast_to(op.nn.relu(x), (32, 128)), g.const(w))
    return fn, [(1, 128)], ["float32"]


def _gather():
    idx = RNG.integers(0, 256, (64, 32)).astype(np.int64)

    def fn(x):
        return op.exp(op.gather_elements(op.nn.relu(x), g.const(idx), axis=1))
    return fn, [(64, 256)], ["float32"]


BLOCKS = {"pad_const_conv": lambda: _pad_conv("constant"),
          "pad_edge_conv": lambda: _pad_conv("edge"),
          "pad_reflect_conv": lambda: _pad_conv("reflect"), "where_greater": _where,
          "broadcast_dense": _broadcast_dense, "gather_elements": _gather}


def _cpu_seconds(exe) -> float:
    """Host time of the CPU steps of one call (median of 5), their operands as the last run
    left them in DRAM."""
    total = 0.0
    for step in exe.steps:
        if not isinstance(step, CpuStep):
            continue
        ins = [exe.machine.read(t.addr, t.shape, t.dtype).astype(dt) for t, dt in step.inputs]
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            step.exe(*ins)
            times.append(time.perf_counter() - t0)
        total += float(np.median(times))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", default="default")
    ap.add_argument("blocks", nargs="*", default=list(BLOCKS))
    args = ap.parse_args()
    print(f"{'block':17s} {'last resort':11s} {'CPU ops':18s} {'steps':>5s} "
          f"{'NPU cycles':>11s} {'CPU us':>7s} {'CPU as cyc':>10s} {'kern/scal':>9s} "
          f"{'max |diff|':>10s}")
    for name in args.blocks:
        fn, shapes, dtypes = BLOCKS[name]()
        xs = [RNG.standard_normal(s).astype(dt) for s, dt in zip(shapes, dtypes)]
        ref = None
        for on in (False, True):
            os.environ["KILN_NPU_LAST_RESORT"] = "1" if on else "0"
            exe = kiln.build(graph_module(fn, shapes, dtypes), target=f"npu -hw={args.hw}")
            out = np.asarray(exe(*xs))
            ref = out if ref is None else ref
            cpu_s = _cpu_seconds(exe)
            steps = "".join("N" if isinstance(s, NpuStep) else "C" for s in exe.steps)
            shares = unit_shares(exe)
            n_scalar = len(shares.fallbacks)
            n_vec = len(exe.kernels)
            diff = float(np.max(np.abs(out - ref)))
            print(f"{name:17s} {'on' if on else 'off':11s} {', '.join(exe.cpu_ops) or '-':18s} "
                  f"{steps:>5s} {exe.last_cycles:11,.0f} {cpu_s * 1e6:7.1f} "
                  f"{cpu_s * exe.config.clock_mhz * 1e6:10,.0f} {n_vec:>5d}/{n_scalar:<3d} "
                  f"{diff:10.2e}")
    os.environ.pop("KILN_NPU_LAST_RESORT", None)


if __name__ == "__main__":
    main()
