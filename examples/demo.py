"""The bundled demo: import the ONNX model in ``examples/models/demo_resnet.onnx``, compile it,
check it against ONNX's reference evaluator, save and reload the executable, run it at a second
batch size (the model's batch dimension is dynamic), and print its speed next to onnxruntime's
(when installed) and the reference evaluator's.

Run with ``make demo`` (or ``python examples/demo.py [model.onnx]`` inside the venv).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.testing.timing import median_seconds

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "demo_resnet.onnx")


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-12))


def main(argv: list[str]) -> int:
    path = argv[0] if argv else MODEL
    model = onnx.load(path)
    t0 = time.perf_counter()
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    print(f"{os.path.basename(path)}: {len(model.graph.node)} ONNX nodes -> "
          f"{exe.num_kernels} fused kernels, imported and built in "
          f"{time.perf_counter() - t0:.2f} s")

    reference = ReferenceEvaluator(model)
    rng = np.random.default_rng(0)
    ok = True
    for batch in (4, 1):
        x = rng.standard_normal((batch, 3, 32, 32), dtype=np.float32)
        out = np.asarray(exe(image=x))
        ref = reference.run(None, {"image": x})[0]
        err = _rel_err(out, ref)
        good = out.shape == ref.shape and err <= 1e-4
        ok &= good
        print(f"batch {batch}: output {out.shape}, max relative error vs onnx.reference "
              f"{err:.2e} -> {'OK' if good else 'MISMATCH'}")

    x = rng.standard_normal((4, 3, 32, 32), dtype=np.float32)
    out = np.asarray(exe(image=x))
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "demo.kiln")
        exe.save(saved)
        reload_ok = np.array_equal(np.asarray(kiln.load(saved)(image=x)), out)
        ok &= reload_ok
        print(f"saved {os.path.getsize(saved) / 1024:.0f} KiB, reloaded: "
              f"{'same outputs' if reload_ok else 'DIFFERENT OUTPUTS'}")

    t_kiln = median_seconds(lambda: exe(image=x))
    line = f"\nlatency at batch 4 (median): kiln {t_kiln * 1e3:.3f} ms"
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        ort_out = sess.run(None, {"image": x})[0]
        ok &= _rel_err(out, ort_out) <= 1e-4
        t_ort = median_seconds(lambda: sess.run(None, {"image": x}))
        line += f" | onnxruntime {t_ort * 1e3:.3f} ms (kiln/ort {t_kiln / t_ort:.2f})"
    t_ref = median_seconds(lambda: reference.run(None, {"image": x}),
                           min_repeat=3, min_time=0.0, warmup=0)
    line += f" | onnx.reference {t_ref * 1e3:.1f} ms"
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
