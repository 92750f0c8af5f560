"""NPU int8 and fp16/bf16: accuracy against float32 and simulated cycles, per model.

    python benchmarks/npu_quant.py                         # all models, "default", 16 images
    python benchmarks/npu_quant.py --hw edge --images 32 resnet18 mobilenet_v2

For each model: the float32 model (torch for ResNet-18 / MobileNetV2 exported to ONNX, numpy
for the MLP and the demo CNN) is quantized with ``kiln.quantize.quantize_model`` (calibration
on ``--calib`` random images, minmax or ``--method percentile``), compiled for the NPU and run
on ``--images`` *other* random images (batch of one image each for the ONNX models). Printed:

- int8: top-1 agreement with float32 over the images, the largest relative error
  (max |int8 - f32| / max |f32| per image), whether every output equals the numpy model of the
  quantized graph (``kiln.testing.quant_reference``) bit for bit (a model ending in softmax
  differs by its float exp, ~1e-7: the NPU's approximation vs numpy's), and the cycles;
- fp16 / bf16 (``ToMixedPrecision``): the largest relative error and the cycles; the float32
  model's own NPU build (float16 products, float32 elsewhere) for reference.

Cycles are the simulator's (one image), not wall time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln.quantize import prepare, quantize_model
from kiln.testing import models
from kiln.testing.quant_reference import run_quantized_graph
from kiln.transform.to_mixed_precision import ToMixedPrecision

MODELS = ("resnet18", "mobilenet_v2", "mlp", "small_cnn")


def _model(name: str, size: int):
    """(float32 module with params bound, input shape, float32 reference function)."""
    if name in ("resnet18", "mobilenet_v2"):
        import torch

        from kiln.frontend.onnx import from_onnx
        from kiln.testing import torch_models

        net = getattr(torch_models, name)()
        x = np.zeros((1, 3, size, size), "float32")
        data = torch_models.export_onnx(net, (torch.from_numpy(x),), ["x"])
        with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
            f.write(data)
            f.flush()
            mod, params = from_onnx(f.name)

        def ref(v):
            with torch.no_grad():
                return net(torch.from_numpy(v)).numpy()

        return prepare(mod, params), x.shape, ref
    m = {"mlp": lambda: models.mlp(batch=8, sizes=(784, 256, 128, 10)),
         "small_cnn": lambda: models.small_cnn(batch=4, channels=16, size=32)}[name]()
    return prepare(m.mod), m.inputs[0].shape, m.reference


def _rel(out, ref) -> float:
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def bench(name: str, hw: str, size: int, images: int, calib: int, method: str) -> None:
    mod, shape, ref = _model(name, size)
    rng = np.random.default_rng(2026)
    samples = [rng.standard_normal(shape).astype("float32") for _ in range(calib)]
    tests = [rng.standard_normal(shape).astype("float32") for _ in range(images)]
    refs = [ref(x) for x in tests]
    target = f"npu -hw={hw}"
    t0 = time.perf_counter()
    qmod = quantize_model(mod, None, samples, method=method)
    t_quant = time.perf_counter() - t0
    exe = kiln.build(qmod, target=target, strict=True)
    agree = total = 0
    worst = 0.0
    diff = 0.0
    t0 = time.perf_counter()
    for x, r in zip(tests, refs):
        out = exe(x)
        diff = max(diff, float(np.max(np.abs(out - run_quantized_graph(qmod, x)))))
        agree += int((out.argmax(-1) == r.argmax(-1)).sum())
        total += out.shape[0]
        worst = max(worst, _rel(out, r))
    t_sim = (time.perf_counter() - t0) / len(tests)
    print(f"{name:13s} {hw:8s} int8      top-1 agree {agree}/{total} ({100 * agree / total:.1f}%)"
          f"  max rel err {worst:.4f}  vs numpy model: "
          f"{'bit-exact' if diff == 0 else f'max diff {diff:.2g}'}  "
          f"cycles {exe.last_cycles:,.0f}  (calibrate {t_quant:.0f} s, simulate {t_sim:.1f} s/img)")
    for label, m in (("fp32->fp16", mod), ("float16", ToMixedPrecision("float16")(mod)),
                     ("bfloat16", ToMixedPrecision("bfloat16")(mod))):
        e = kiln.build(m, target=target, strict=True)
        errs = [_rel(e(x), r) for x, r in zip(tests[:4], refs[:4])]
        print(f"{name:13s} {hw:8s} {label:9s} max rel err {max(errs):.4f} (4 images)  "
              f"cycles {e.last_cycles:,.0f}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--hw", default="default", help="hardware description (name or path)")
    ap.add_argument("--size", type=int, default=32, help="ResNet-18 / MobileNetV2 image size")
    ap.add_argument("--images", type=int, default=16, help="test images")
    ap.add_argument("--calib", type=int, default=8, help="calibration images")
    ap.add_argument("--method", default="minmax", choices=("minmax", "percentile"))
    args = ap.parse_args(argv)
    for name in args.models:
        bench(name, args.hw, args.size, args.images, args.calib, args.method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
