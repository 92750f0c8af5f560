"""The bundled demo: compile a small CNN built with kiln's graph builder, check it against numpy,
save and reload the executable, and print its speed next to the numpy reference.

Run with ``make demo`` (or ``python examples/demo.py`` inside the venv).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln.testing import models
from kiln.testing.timing import median_seconds


def main() -> int:
    model = models.small_cnn(batch=4, channels=32, size=32)
    print("== graph IR ==")
    print(model.mod)
    t0 = time.perf_counter()
    exe = kiln.build(model.mod, target="c")
    print(f"\nbuilt in {time.perf_counter() - t0:.2f} s: {exe.num_kernels} kernels")

    (x,) = model.inputs
    out = exe(x)
    ref = model.reference(x)
    err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-12))
    ok = np.allclose(out, ref, rtol=1e-4, atol=1e-4)
    print(f"check vs numpy (float64 reference): max relative error {err:.2e} -> "
          f"{'OK' if ok else 'MISMATCH'}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "demo.kiln")
        exe.save(path)
        again = kiln.load(path)(x)
        reload_ok = np.array_equal(again, out)
        print(f"saved {os.path.getsize(path) / 1024:.0f} KiB, reloaded: "
              f"{'same outputs' if reload_ok else 'DIFFERENT OUTPUTS'}")

    t_kiln = median_seconds(lambda: exe(x))
    t_numpy = median_seconds(lambda: model.reference(x))
    print(f"\nlatency (median): kiln {t_kiln * 1e3:.3f} ms | numpy reference "
          f"{t_numpy * 1e3:.3f} ms | ratio kiln/numpy {t_kiln / t_numpy:.2f}")
    return 0 if ok and reload_ok else 1


if __name__ == "__main__":
    sys.exit(main())
