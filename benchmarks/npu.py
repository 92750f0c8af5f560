"""NPU: simulated cycles per layer and per model, against the roofline of the hardware
description, with and without double buffering.

    python benchmarks/npu.py                          # resnet18, mlp, small_cnn on "default"
    python benchmarks/npu.py --hw edge resnet18       # another description, some models
    python benchmarks/npu.py --size 112 resnet18      # a smaller image (faster to simulate)
    python benchmarks/npu.py mobilenet_v2             # depthwise convolutions on the vector unit

Every model is compiled twice with ``kiln.build(target="npu -hw=...")``'s lowering -- double
buffering on (the default) and off -- and run once on the simulator. Per GEMM/conv layer it
prints the simulated cycles, the roofline bound (max of the tensor unit's cycles and the DRAM
cycles of the layer's minimum traffic, both from the description: ``gemm_roofline``),
utilization = bound / cycles, and the cycles without double buffering with the speed-up
(off / on). Per model: total cycles (all kernels, vector ones included), the sum of the bounds,
DRAM traffic, the simulation's wall time, the ops left on the CPU, and the DRAM footprint
with liveness-based reuse against a range per tensor. Outputs are checked
against the float32 reference (torch for ResNet-18 and MobileNetV2, numpy for the others).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln.build import npu_pipeline
from kiln.codegen.npu import build_npu
from kiln.testing import models

GEMM_OPS = ("dense", "matmul", "nn.conv2d", "nn.conv2d.depthwise")


def _torch_net(name: str, size: int):
    import torch

    from kiln.frontend.onnx import from_onnx
    from kiln.testing import torch_models

    net = getattr(torch_models, name)()
    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype("float32")
    data = torch_models.export_onnx(net, (torch.from_numpy(x),), ["x"])
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        f.write(data)
        f.flush()
        mod, params = from_onnx(f.name)
    mod = kiln.transform.BindParams("main", params)(mod)
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    return mod, [x], ref


def _model(name: str, size: int):
    if name in ("resnet18", "mobilenet_v2"):
        return _torch_net(name, size)
    m = {"mlp": lambda: models.mlp(batch=64),
         "small_cnn": lambda: models.small_cnn(batch=8, channels=32, size=32)}[name]()
    return m.mod, m.inputs, m.reference(*m.inputs)


def _run(mod, inputs, hw: str, double_buffer: bool):
    exe = build_npu(npu_pipeline()(mod), kiln.Target("npu", hw=hw),
                    double_buffer=double_buffer)
    t = time.perf_counter()
    out = exe(*inputs)
    return exe, out, time.perf_counter() - t


def bench(name: str, hw: str, size: int) -> None:
    mod, inputs, ref = _model(name, size)
    on, out, wall = _run(mod, inputs, hw, True)
    off, _, _ = _run(mod, inputs, hw, False)
    rel = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    (rep_on,), (rep_off,) = on.last_reports, off.last_reports
    c_on, c_off = rep_on.phase_cycles(), rep_off.phase_cycles()
    print(f"\n== {name} on {hw!r}: {len(on.kernels)} kernels, CPU ops: "
          f"{', '.join(on.cpu_ops) or 'none'}; rel. error vs float32 {rel:.1e}")
    print(f"{'layer':22s} {'tiling':58s} {'cycles':>10s} {'bound':>10s} {'util':>6s} "
          f"{'no dbuf':>10s} {'dbuf x':>6s}")
    for k in on.kernels:
        if k.op not in GEMM_OPS:
            continue
        cyc, cyc_off = c_on[k.label], c_off[k.label]
        print(f"{k.label:22s} {k.tiling.split(', est.')[0]:58s} {cyc:10.0f} {k.roofline:10.0f} "
              f"{k.roofline / cyc:6.1%} {cyc_off:10.0f} {cyc_off / cyc:6.2f}")
    bound = sum(k.roofline for k in on.kernels)
    gemm = [k for k in on.kernels if k.op in GEMM_OPS]
    g_cyc = sum(c_on[k.label] for k in gemm)
    g_bound = sum(k.roofline for k in gemm)
    print(f"{name}: {rep_on.cycles:.0f} cycles ({rep_on.microseconds:.0f} us at "
          f"{rep_on.clock_mhz} MHz), bound {bound:.0f} -> utilization {bound / rep_on.cycles:.1%}"
          f"; GEMM/conv layers {g_bound / g_cyc:.1%}; without double buffering "
          f"{rep_off.cycles:.0f} cycles ({rep_off.cycles / rep_on.cycles:.2f}x); DRAM read "
          f"{rep_on.dram_read / 1e6:.1f} MB, written {rep_on.dram_written / 1e6:.1f} MB; "
          f"simulated in {wall:.1f} s")
    print(f"{name}: DRAM footprint {on.dram_bytes / 1e6:.2f} MB with liveness-based reuse, "
          f"{on.unshared_dram_bytes / 1e6:.2f} MB with a range per tensor "
          f"({on.unshared_dram_bytes / on.dram_bytes:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["resnet18", "mlp", "small_cnn"])
    ap.add_argument("--hw", default="default", help="hardware description (name or path)")
    ap.add_argument("--size", type=int, default=224, help="ResNet-18 / MobileNetV2 image size")
    args = ap.parse_args(argv)
    for name in args.models:
        bench(name, args.hw, args.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
