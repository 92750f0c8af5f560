"""The index arithmetic of the float16 convolutions on tensor cores (the im2col gathers inside
the shared copies, ``kiln.schedule.gpu.conv_mma``): per kernel of ResNet-18's distinct 3 x 3 /
1 x 1 / 7 x 7 convolutions (batch 1, and layer 4 at batch 32), the integer divisions and the
multiply-highs (what NVRTC turns a division by a constant into) in its PTX, 64- and 32-bit, and
what ptxas reports -- registers, shared memory, spills. No GPU needed (NVRTC only).

    python benchmarks/gpu_conv_gather.py                 # sm_80 and sm_90
    python benchmarks/gpu_conv_gather.py --arch sm_90

A division by a constant in int64 becomes ``mul.hi.s64`` (several 32-bit multiplies in SASS),
in int32 one ``mul.hi.s32``; ``div``/``rem`` instructions would be divisions by a variable.
Run it on another tree (``PYTHONPATH=/path/to/tree``) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from kiln.codegen.gpu.build import build as gpu_build  # noqa: E402
from kiln.codegen.gpu.nvrtc import compile_cuda  # noqa: E402
from kiln.schedule.gpu import schedule_and_lower  # noqa: E402
from kiln.target import Target  # noqa: E402
from kiln.testing.models import RESNET18_CONVS  # noqa: E402
from kiln.testing.op_testing import scheduled  # noqa: E402

#: (data shape, weight shape, stride, padding): ResNet-18's distinct convolutions at 224 x 224.
RESNET18 = RESNET18_CONVS

_DIV = re.compile(r"\b(?:div|rem)\.[su]64\b")
_MULHI64 = re.compile(r"\bmul\.hi\.[su]64\b")
_MULHI32 = re.compile(r"\bmul\.hi\.[su]32\b")


def conv_kernels(arch: str) -> list[tuple[str, int, dict[str, int], object]]:
    """(layer, threads, PTX counts, ptxas resources) per convolution of :data:`RESNET18`."""
    target = Target("cuda", arch=arch)
    funcs = {}
    for k, (xs, ws, s, p) in enumerate(RESNET18):
        arrays = [np.zeros(xs, np.float16), np.zeros(ws, np.float16)]
        attrs = {"strides": (s, s), "padding": (p,) * 4, "dilation": (1, 1), "groups": 1}
        func, _ = scheduled("nn.conv2d", arrays, attrs, schedule=False)
        funcs[f"conv{k}"] = schedule_and_lower(func.with_attr("op_name", "nn.conv2d"), target)[1]
    program = gpu_build(funcs, target).program
    binary = compile_cuda(program.source, arch)
    texts, usage = binary.kernel_ptx(), binary.resources()
    rows = []
    for fname, func in program.functions.items():
        k = int(fname[4:])
        xs, ws, s, _ = RESNET18[k]
        layer = f"{xs[0]}x{xs[1]}x{xs[2]} -> {ws[0]} {ws[2]}x{ws[3]}/{s}"
        for kern in func.kernels:
            ptx = texts[kern.name]
            counts = {"div64": len(_DIV.findall(ptx)), "mulhi64": len(_MULHI64.findall(ptx)),
                      "mulhi32": len(_MULHI32.findall(ptx))}
            rows.append((layer, kern.threads, counts, usage[kern.name]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", help="sm_80, sm_90 (default both)")
    args = ap.parse_args()
    for arch in args.arch or ["sm_80", "sm_90"]:
        print(f"## {arch}")
        print(f"{'layer':30} {'thr':>4} {'div64':>5} {'mulhi64':>7} {'mulhi32':>7} {'regs':>4} "
              f"{'smem B':>6} {'spill':>5}")
        for layer, threads, c, res in conv_kernels(arch):
            print(f"{layer:30} {threads:4d} {c['div64']:5d} {c['mulhi64']:7d} {c['mulhi32']:7d} "
                  f"{res.registers:4d} {res.shared_bytes:6d} "
                  f"{res.spill_stores + res.spill_loads:5d}")


if __name__ == "__main__":
    main()
