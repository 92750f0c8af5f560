"""GPU speed: kiln's CUDA target next to torch eager (and torch.compile) on the same GPU.

    python benchmarks/gpu.py                     # every case
    python benchmarks/gpu.py resnet18 gemm       # some of them
    python benchmarks/gpu.py --compile           # + torch.compile (slow to compile)

Needs a CUDA GPU, torch with CUDA, and kiln's CUDA extra. Every engine gets the same inputs
as torch CUDA tensors (kiln takes them through DLPack, no copies) and is timed with CUDA
events around ``repeat`` calls after a warm-up; the table gives median milliseconds per call
and kiln's time over torch eager's (lower is better). Each result is checked against torch
first (relative error printed). Phase 1 of the GPU work schedules with generic rules only
(element-wise, row reductions, one thread per output elsewhere); the GEMM, convolution and
tensor-core schedules that make these cases fast are phase 2's.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np


def _time(fn, args, repeat: int = 20) -> float:
    import torch

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rel(a, b) -> float:
    a = np.asarray(a.float().cpu() if hasattr(a, "cpu") else a, dtype=np.float64)
    b = np.asarray(b.float().cpu() if hasattr(b, "cpu") else b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def case_gemm(n: int = 1024, dtype: str = "float32"):
    import torch

    from kiln import graph as g
    from kiln import op

    bb = g.BlockBuilder()
    a = g.Var("a", g.TensorStructInfo((n, n), dtype))
    b = g.Var("b", g.TensorStructInfo((n, n), dtype))
    with bb.function("main"):
        with bb.dataflow():
            c = bb.emit_output(op.matmul(a, b))
        bb.emit_func_output(c, params=[a, b])
    tdt = getattr(torch, dtype)
    x, y = torch.randn(n, n, device="cuda", dtype=tdt), torch.randn(n, n, device="cuda",
                                                                    dtype=tdt)
    return bb.get(), {}, (x, y), lambda p, q: p @ q


def case_torch_model(name: str, batch: int = 1):
    import torch

    from kiln.frontend.onnx.importer import from_onnx
    from kiln.testing import torch_models

    module, data, inputs = torch_models.exported(name, batch)
    mod, params = from_onnx(data)
    module = module.cuda().eval()
    targs = tuple(torch.from_numpy(a).cuda() for a in inputs)

    def eager(*xs):
        with torch.no_grad():
            return module(*xs)

    return mod, params, targs, eager


CASES = {
    "gemm": lambda: case_gemm(1024, "float32"),
    "gemm_fp16_4096": lambda: case_gemm(4096, "float16"),
    "mlp": lambda: case_torch_model("mlp", 1),
    "resnet18": lambda: case_torch_model("resnet18", 1),
    "resnet18_b32": lambda: case_torch_model("resnet18", 32),
    "mobilenet_v2": lambda: case_torch_model("mobilenet_v2", 1),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    import torch

    import kiln
    from kiln.runtime.gpu.module import get_device

    arch = get_device("cuda").arch
    target = kiln.Target("cuda", arch=arch if arch in ("sm_80", "sm_86", "sm_89", "sm_90")
                         else "sm_90")
    rows = []
    for name in args.cases:
        mod, params, inputs, eager = CASES[name]()
        exe = kiln.build(mod, target, params=params)
        got = exe(*inputs)
        ref = eager(*inputs)
        err = _rel(got, ref)
        t_kiln = _time(exe, inputs, args.repeat)
        t_eager = _time(eager, inputs, args.repeat)
        t_comp = float("nan")
        if args.compile:
            compiled = torch.compile(eager)
            t_comp = _time(compiled, inputs, args.repeat)
        rows.append((name, t_kiln, t_eager, t_comp, err))
        print(f"{name}: kiln {t_kiln:.3f} ms, eager {t_eager:.3f} ms, rel err {err:.2e}",
              flush=True)
    print(f"\n{'case':16s} {'kiln ms':>9s} {'eager ms':>9s} {'compile':>9s} {'kiln/eager':>10s}"
          f" {'rel err':>8s}")
    for name, tk, te_, tc, err in rows:
        print(f"{name:16s} {tk:9.3f} {te_:9.3f} {tc:9.3f} {tk / te_:10.2f} {err:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
