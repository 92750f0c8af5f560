"""The CNN models on OpenCL through PoCL (the CPU as an OpenCL device) next to kiln's C build,
in one run: how long the whole-model OpenCL tests take, and where the GPU schedules stand.

    python benchmarks/gpu_pocl.py                         # ResNet-18, MobileNetV2 at 64 x 64
    python benchmarks/gpu_pocl.py --size 224 resnet18     # one model at full resolution

Each model is ``kiln.testing.torch_models``' architecture (random weights) exported to ONNX at
``--size`` x ``--size``, built for ``opencl`` and ``c``. Printed per model: build seconds, the
mean wall time of ``--repeat`` runs after one warm-up and the process CPU time per run (PoCL's
worker threads included: on a loaded machine wall time alone says little), the C build's
time, their ratio, and the largest difference between the two outputs over the largest
magnitude. ``--target cuda`` is not measured here (benchmarks/gpu.py runs on a GPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend.onnx import from_onnx  # noqa: E402
from kiln.testing import torch_models  # noqa: E402


def export_model(name: str, size: int) -> tuple[bytes, np.ndarray]:
    """(ONNX bytes, a random input) of the model at ``size`` x ``size``, batch 1."""
    import torch

    make, names = torch_models.MODELS[name]
    torch.manual_seed(0)
    module = make()
    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype("float32")
    return torch_models.export_onnx(module, (torch.from_numpy(x),), names), x


def _timed(fn, x: np.ndarray, repeat: int) -> tuple[np.ndarray, float, float]:
    out = fn(x)  # warm-up
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        fn(x)
    return out, (time.perf_counter() - wall) / repeat, (time.process_time() - cpu) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'model':14} {'size':>4} {'build s':>8} {'ocl ms':>9} {'ocl cpu ms':>10} "
          f"{'c ms':>8} {'ocl/c':>6} {'max err':>8}")
    for name in args.models:
        data, x = export_model(name, args.size)
        mod, params = from_onnx(data)
        t0 = time.perf_counter()
        ocl = kiln.build(mod, "opencl", params=params)
        build_s = time.perf_counter() - t0
        cpu_exe = kiln.build(mod, "c", params=params)
        out, wall, cpu = _timed(ocl, x, args.repeat)
        ref, c_wall, _ = _timed(cpu_exe, x, args.repeat)
        err = float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-30))
        print(f"{name:14} {args.size:4d} {build_s:8.1f} {wall * 1e3:9.1f} {cpu * 1e3:10.1f} "
              f"{c_wall * 1e3:8.2f} {wall / c_wall:6.1f} {err:8.1e}", flush=True)


if __name__ == "__main__":
    main()
