"""kiln on a CUDA GPU next to torch eager and torch.compile, on the same GPU, in one run.

    python benchmarks/gpu.py                      # GEMM, ResNet-18 (batch 1, 32), the encoder
    python benchmarks/gpu.py gemm resnet18_b1     # some of them
    python benchmarks/gpu.py --arch sm_90 --repeat 50
    python benchmarks/gpu.py gemm --knob gpu_gemm_stages=1 --knob gpu_gemm_bk=32

The workloads:

- ``gemm``: a 4096 x 4096 x 4096 float16 matrix product (kiln's ``matmul``; torch.matmul is
  cuBLAS), reported in TFLOP/s too;
- ``resnet18_b1``, ``resnet18_b32``: ResNet-18 at 224 x 224 (``kiln.testing.torch_models``,
  random weights, BatchNorm statistics randomized), float32;
- ``resnet18_fp16_b1``, ``resnet18_fp16_b32``: the same in float16: kiln builds the float32
  model after ``ToMixedPrecision("float16")`` (float16 convolutions accumulating in float32,
  on tensor cores where a shape fits the mma tiles: ``kiln.schedule.gpu.conv_mma``; input and
  output stay float32), torch runs ``module.half()`` on float16 inputs in ``channels_last``
  (cuDNN's tensor-core layout; torch.compile gets the same); errors are against float32 eager;
- ``encoder_b8``: the BERT-base-style encoder (6 layers, hidden 768, 12 heads) at sequence 128,
  batch 8, float32, with an attention mask.

kiln builds each model from its ONNX export (``kiln.build(..., Target("cuda", arch=...))``)
and is called with ``torch.cuda`` tensors (zero-copy DLPack; a static model replays as a CUDA
Graph). torch eager and ``torch.compile`` (inductor) run the same module on the same GPU.
``--knob NAME=VALUE`` (repeatable) gives kiln's GPU schedules a knob value
(:mod:`kiln.schedule.knobs`; the GEMM's are ``gpu_gemm_threads``, ``gpu_gemm_register_tile``
as ``8x8``, ``gpu_gemm_bk``, ``gpu_gemm_stages``), to compare tile choices on the device.
Each engine's output is checked against eager's before timing (``max err`` is the largest
absolute difference over the largest magnitude). Times: mean of ``--repeat`` calls after
warm-up, the device synchronized before and after (so batch-1 latencies include each engine's
launch overhead). Ratios are kiln's time over the peer's: above 1, kiln is slower.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kiln  # noqa: E402
from kiln import graph as g  # noqa: E402
from kiln import op  # noqa: E402
from kiln.build import lower_graph  # noqa: E402
from kiln.codegen.executable import build_executable  # noqa: E402
from kiln.frontend.onnx import from_onnx  # noqa: E402
from kiln.target import Target  # noqa: E402
from kiln.testing import torch_models  # noqa: E402
from kiln.transform import ToMixedPrecision  # noqa: E402
from kiln.transform.bind_params import bind_params  # noqa: E402

WORKLOADS = ("gemm", "resnet18_b1", "resnet18_b32", "resnet18_fp16_b1", "resnet18_fp16_b32",
             "encoder_b8")
#: workload -> (model, batch, float16)
MODELS = {"resnet18_b1": ("resnet18", 1, False), "resnet18_b32": ("resnet18", 32, False),
          "resnet18_fp16_b1": ("resnet18", 1, True), "resnet18_fp16_b32": ("resnet18", 32, True),
          "encoder_b8": ("bert_encoder", 8, False)}


def timed(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
    """Mean seconds per call of ``fn`` on the GPU (synchronized around the timed calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeat


def warm_up_gpu(seconds: float = 1.0) -> None:
    """Keep the GPU busy with float16 products for ``seconds``: an idle H100 runs its first
    timed calls at low clocks (the first configuration timed after start-up measured 1.85 ms
    where the same kernel measured 1.37 ms later in the run)."""
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            x @ x
        torch.cuda.synchronize()


def rel_err(got: Any, ref: Any) -> float:
    got = torch.as_tensor(got).float().cpu()
    ref = ref.float().cpu()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def gemm_module(n: int) -> Any:
    """The kiln module of an n x n x n float16 matrix product."""
    bb = g.BlockBuilder()
    a = g.Var("a", g.TensorStructInfo((n, n), "float16"))
    b = g.Var("b", g.TensorStructInfo((n, n), "float16"))
    with bb.function("main"):
        with bb.dataflow():
            c = bb.emit_output(op.matmul(a, b))
        bb.emit_func_output(c, params=[a, b])
    return bb.get()


def gemm_case(n: int) -> tuple[Any, Callable, list]:
    """(kiln module, torch function, inputs) of an n x n x n float16 matrix product."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(n, n, device="cuda", dtype=torch.float16, generator=gen)
              for _ in range(2)]
    return gemm_module(n), torch.matmul, inputs


def model_case(name: str, batch: int) -> tuple[Any, Any, Any, list]:
    """(kiln module, params, torch module on the GPU, inputs on the GPU)."""
    module, data, arrays = torch_models.exported(name, batch)
    mod, params = from_onnx(data)
    module = module.eval().cuda()
    return mod, params, module, [torch.from_numpy(a).cuda() for a in arrays]


def fp16_case(mod: Any, params: Any, module: Any, inputs: list
              ) -> tuple[Any, Callable, list]:
    """(kiln module in float16 with its weights bound, torch's float16 channels_last module,
    its inputs) of a float32 model case."""
    mod16 = ToMixedPrecision("float16")(bind_params(mod, params))
    module16 = copy.deepcopy(module).half().to(memory_format=torch.channels_last)
    inputs16 = [x.half().contiguous(memory_format=torch.channels_last) for x in inputs]
    return mod16, module16, inputs16


def parse_knob(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``--knob``: VALUE an int, ``AxB`` (a tile), ``true``/``false``, else
    the string."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--knob {text!r}: expected NAME=VALUE")
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    if "x" in value and all(p.isdigit() for p in value.split("x")):
        return name, tuple(int(p) for p in value.split("x"))
    return name, int(value) if value.lstrip("-").isdigit() else value


def build(mod: Any, target: Target, params: Any, knobs: dict[str, Any]) -> Any:
    """kiln.build, or with ``knobs`` for every kernel's schedule."""
    if not knobs:
        return kiln.build(mod, target, params=params)
    if params:
        raise SystemExit("--knob applies to the gemm workload (no parameters) only")
    return build_executable(lower_graph(mod, target), target, knobs=lambda f, t: knobs)


def run(workload: str, target: Target, repeat: int, knobs: dict[str, Any] | None = None,
        with_compile: bool = True) -> dict[str, Any]:
    if workload == "gemm":
        mod, torch_fn, inputs = gemm_case(4096)
        params = None
        flops = 2 * 4096 ** 3
        kiln_inputs, ref_fn = inputs, torch_fn
    else:
        name, batch, fp16 = MODELS[workload]
        mod, params, module, inputs = model_case(name, batch)
        torch_fn, flops, kiln_inputs, ref_fn = module, 0, inputs, module
        if fp16:  # kiln: float32 in and out, float16 inside; torch: float16 throughout
            mod, torch_fn, inputs = fp16_case(mod, params, module, inputs)
            params = None
    t0 = time.perf_counter()
    exe = build(mod, target, params, knobs or {})
    build_s = time.perf_counter() - t0
    row: dict[str, Any] = {"workload": workload, "build_s": build_s, "flops": flops,
                           "kernels": sum(len(f.kernels) for f in
                                          exe.module.program.functions.values())}
    with torch.no_grad():
        ref = ref_fn(*kiln_inputs)
        row["err_kiln"] = rel_err(exe(*kiln_inputs), ref)
        row["kiln"] = timed(lambda: exe(*kiln_inputs), repeat)
        row["eager"] = timed(lambda: torch_fn(*inputs), repeat)
        row["err_eager"] = rel_err(torch_fn(*inputs), ref)
        # torch.compile only now: its compile workers (CPU processes) must not run beside
        # the other engines' timed calls
        compiled = torch.compile(torch_fn) if with_compile else None
        if compiled is not None:
            row["err_compile"] = rel_err(compiled(*inputs), ref)
            row["compile"] = timed(lambda: compiled(*inputs), repeat)
        else:
            row["compile"] = float("nan")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--arch", default=None, help="sm_80, sm_89, sm_90 (default: the device's)")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--knob", type=parse_knob, action="append", default=[],
                    help="NAME=VALUE for kiln's GPU schedules (repeatable), e.g. "
                         "gpu_gemm_stages=1, gpu_gemm_register_tile=8x4")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave torch.compile out (its compile time is long on the big models)")
    args = ap.parse_args()
    knobs = dict(args.knob)
    warnings.simplefilter("ignore")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    major, minor = torch.cuda.get_device_capability()
    arch = args.arch or f"sm_{major}{minor}"
    target = Target("cuda", arch=arch)
    print(f"{torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, "
          f"repeat {args.repeat}" + (f", knobs {knobs}" if knobs else ""))
    warm_up_gpu()
    print(f"{'workload':14s} {'kiln ms':>9s} {'eager ms':>9s} {'compile ms':>10s} "
          f"{'kiln/eager':>10s} {'kiln/compile':>12s} {'kiln err':>9s} {'build s':>8s} "
          f"{'kernels':>7s}")
    for w in args.workloads:
        try:
            r = run(w, target, args.repeat, knobs, with_compile=not args.no_compile)
        except Exception:  # noqa: BLE001 - report and go on with the next workload
            print(f"{w:14s} FAILED")
            traceback.print_exc()
            continue
        print(f"{w:14s} {r['kiln'] * 1e3:9.3f} {r['eager'] * 1e3:9.3f} "
              f"{r['compile'] * 1e3:10.3f} {r['kiln'] / r['eager']:10.2f} "
              f"{r['kiln'] / r['compile']:12.2f} {r['err_kiln']:9.1e} {r['build_s']:8.1f} "
              f"{r['kernels']:7d}", flush=True)
        if r["err_eager"] > 0:
            print(f"{'':14s} torch eager's error against float32 eager: {r['err_eager']:.1e}",
                  flush=True)
        if r["flops"]:
            print(f"{'':14s} TFLOP/s: kiln {r['flops'] / r['kiln'] / 1e12:.1f}, cuBLAS "
                  f"(torch.matmul) {r['flops'] / r['eager'] / 1e12:.1f}, torch.compile "
                  f"{r['flops'] / r['compile'] / 1e12:.1f}; kiln at "
                  f"{100 * r['eager'] / r['kiln']:.1f}% of cuBLAS", flush=True)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
