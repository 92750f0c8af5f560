"""The tensor-core schedules' knobs on a CUDA GPU: the 4096^3 float16 GEMM with the default
schedule and with each configuration of :data:`GEMM_CONFIGS`, next to torch.matmul (cuBLAS),
and float16 ResNet-18 at batch 32 with the default schedule and each of :data:`CONV_CONFIGS`,
next to torch eager float16 (channels_last). Sized for about 5 minutes on an H100.

    python benchmarks/gpu_mma_knobs.py                   # on the GPU: time everything
    python benchmarks/gpu_mma_knobs.py --only gemm --repeat 50
    python benchmarks/gpu_mma_knobs.py --nvrtc sm_90     # no GPU: ptxas resources per config
    python benchmarks/gpu_mma_knobs.py --only wgmma      # the wgmma route's configs (sm_90)
    python benchmarks/gpu_mma_knobs.py --pocl            # no GPU: wgmma configs on PoCL

Knobs are :mod:`kiln.schedule.knobs` values given to every kernel's schedule (``build_executable
(..., knobs=...)``; a knob a schedule does not ask for is ignored). ``--nvrtc ARCH`` needs no
GPU: it builds each GEMM configuration for ``ARCH``, compiles it with NVRTC and prints what
ptxas reports (registers, shared memory, spills) and whether the PTX holds ``mma.sync``,
``ldmatrix``, ``wgmma`` and ``cp.async`` -- the check to run before spending device time on a
new knob. ``--pocl`` runs each of :data:`WGMMA_CONFIGS` on OpenCL (PoCL) at 256^3 against
numpy: the wgmma route's thread view through the same layouts and descriptor arithmetic.
Add a knob to the lists below when a schedule grows one (the ``cp.async`` pipelines,
``gpu_mma_async_stages``, and ``gpu_mma_ldmatrix`` are listed; see docs/internals.md, "Tensor
cores").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from gpu import (  # noqa: E402
    fp16_case,
    gemm_case,
    gemm_module,
    model_case,
    rel_err,
    timed,
    warm_up_gpu,
)

from kiln.build import lower_graph  # noqa: E402
from kiln.codegen.executable import build_executable  # noqa: E402
from kiln.codegen.gpu.nvrtc import compile_cuda  # noqa: E402
from kiln.schedule.gpu.linalg import wgmma_refusal  # noqa: E402
from kiln.target import Target  # noqa: E402

#: (label, knobs) of the GEMM: the default first. On an H100 (2026-11-27, two runs; cuBLAS
#: 0.18-0.23 ms): the per-mma route 0.94-1.55 ms, the warp-tile route ("frag", now the
#: default with 4 x 8 tiles, bk 64, cp.async 3) 0.665-0.706 ms (linalg.py's FRAGMENT_TILES).
#: The per-mma route (schedule_mma_gemm without the warp-tile intrinsic), which the older
#: configurations below time.
PER_MMA = {"gpu_mma_fragments": False}
GEMM_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("default, copy bindings substituted", {"gpu_mma_copy_bindings": True}),
    ("default, blocks in row-major order", {"gpu_mma_group_rows": 1}),
    ("default, scalar write-back", {"gpu_mma_vector_stores": False}),
    ("per-mma route (fragments off)", PER_MMA),
    ("tiles 4x8, bk 64", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64}),
    ("tiles 4x8, bk 64, 1 stage", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64,
                                   "gpu_mma_stages": 1}),
    ("tiles 4x8, bk 32", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32}),
    ("warps 4x2, tiles 4x4", {**PER_MMA, "gpu_mma_warps": (4, 2), "gpu_mma_tiles": (4, 4)}),
    ("warps 2x4, tiles 4x4, bk 64", {**PER_MMA, "gpu_mma_warps": (2, 4),
                                     "gpu_mma_tiles": (4, 4), "gpu_mma_bk": 64}),
    # cp.async pipelines (gpu_mma_async_stages; kiln.tir.transform.async_copies)
    ("cp.async 3", {**PER_MMA, "gpu_mma_async_stages": 3}),
    ("tiles 4x8, bk 32, cp.async 3", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
                                      "gpu_mma_async_stages": 3}),
    ("tiles 4x8, bk 32, cp.async 4", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
                                      "gpu_mma_async_stages": 4}),
    ("tiles 4x8, bk 32, cp.async 3, B chk", {**PER_MMA, "gpu_mma_tiles": (4, 8),
                                             "gpu_mma_bk": 32, "gpu_mma_async_stages": 3,
                                             "gpu_mma_b_chunks": True}),
    ("tiles 4x8, bk 64, cp.async 2", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64,
                                      "gpu_mma_async_stages": 2}),
    ("tiles 4x8, bk 64, cp.async 3", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64,
                                      "gpu_mma_async_stages": 3}),
    ("warps 2x4, 4x4, bk 32, cp.async 4", {**PER_MMA, "gpu_mma_warps": (2, 4),
                                           "gpu_mma_tiles": (4, 4), "gpu_mma_bk": 32,
                                           "gpu_mma_async_stages": 4}),
    # ldmatrix.x4 for A from a row-permuted tile (gpu_mma_ldmatrix), with and without cp.async
    ("ldmatrix", {**PER_MMA, "gpu_mma_ldmatrix": True}),
    ("tiles 4x8, bk 32, ldmatrix", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
                                    "gpu_mma_ldmatrix": True}),
    ("tiles 4x8, bk 32, cp.async 3, ldm", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
                                           "gpu_mma_async_stages": 3, "gpu_mma_ldmatrix": True}),
    ("tiles 4x8, bk 64, cp.async 3, ldm", {**PER_MMA, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64,
                                           "gpu_mma_async_stages": 3, "gpu_mma_ldmatrix": True}),
    # the warp-tile intrinsic (gpu_mma_fragments): fragments loaded once per 16-deep step
    ("frag, 4x4, bk 32, register prefetch", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 4),
                                             "gpu_mma_bk": 32, "gpu_mma_async_stages": 0}),
    ("frag, 4x4, bk 32, cp.async 3", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 4),
                                      "gpu_mma_bk": 32, "gpu_mma_async_stages": 3}),
    ("frag, 4x4, bk 32, cp.async 4", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 4),
                                      "gpu_mma_bk": 32, "gpu_mma_async_stages": 4}),
    ("frag, 4x8, bk 32, cp.async 3", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 8),
                                      "gpu_mma_bk": 32, "gpu_mma_async_stages": 3}),
    ("frag, 4x8, bk 32, cp.async 4", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 8),
                                      "gpu_mma_bk": 32, "gpu_mma_async_stages": 4}),
    ("frag, 4x8, bk 64, cp.async 3", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 8),
                                      "gpu_mma_bk": 64, "gpu_mma_async_stages": 3}),
    ("frag, w2x4, 4x4, bk 32, cp.async 4", {"gpu_mma_fragments": True, "gpu_mma_warps": (2, 4),
                                            "gpu_mma_tiles": (4, 4), "gpu_mma_bk": 32,
                                            "gpu_mma_async_stages": 4}),
    ("frag, 4x8, bk 32, register prefetch", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 8),
                                             "gpu_mma_bk": 32, "gpu_mma_async_stages": 0}),
    ("frag, 4x8, bk 64, cp.async 2", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 8),
                                      "gpu_mma_bk": 64, "gpu_mma_async_stages": 2}),
    ("frag, 4x8, bk 64, cp.async 4", {"gpu_mma_fragments": True, "gpu_mma_tiles": (4, 8),
                                      "gpu_mma_bk": 64, "gpu_mma_async_stages": 4}),
    # 8 warps of 64 x 64: 128 x 256 and 256 x 128 block tiles (half the L2 reads of 128 x 128)
    ("frag, w2x4, 4x8, bk 32, cp.async 3", {"gpu_mma_fragments": True, "gpu_mma_warps": (2, 4),
                                            "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
                                            "gpu_mma_async_stages": 3}),
    ("frag, w2x4, 4x8, bk 32, cp.async 4", {"gpu_mma_fragments": True, "gpu_mma_warps": (2, 4),
                                            "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
                                            "gpu_mma_async_stages": 4}),
    ("frag, w2x4, 4x8, bk 64, cp.async 3", {"gpu_mma_fragments": True, "gpu_mma_warps": (2, 4),
                                            "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64,
                                            "gpu_mma_async_stages": 3}),
    ("frag, w4x2, 4x8, bk 32, cp.async 3", {"gpu_mma_fragments": True, "gpu_mma_warps": (4, 2),
                                            "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
                                            "gpu_mma_async_stages": 3}),
    ("frag, w4x2, 4x8, bk 64, cp.async 3", {"gpu_mma_fragments": True, "gpu_mma_warps": (4, 2),
                                            "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64,
                                            "gpu_mma_async_stages": 3}),
]
#: The wgmma route (knob ``gpu_mma_wgmma``, off by default; sm_90a). ``gpu_wgmma_shape`` =
#: (warpgroups, 64-row products a warpgroup, 8-column blocks); the default (linalg.py's
#: WGMMA_SHAPES, WGMMA_STEPS) is (2, 2, 16) with 64-deep steps in 4 stages: the fastest on the
#: H100 (0.756 ms against the mma.sync default's 0.639, cuBLAS 0.245; 2026-11-27). Timed by
#: ``--only wgmma`` alone (its own process: a kernel that faults would end the CUDA context
#: of the configurations after it); ``--nvrtc`` reports them after GEMM_CONFIGS.
WGMMA = {"gpu_mma_wgmma": True}
WGMMA_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("wgmma default (256x128 2wg x2, bk 64, 4)", WGMMA),
    ("wgmma 128x128 2wg, bk 64, cp.async 3", {**WGMMA, "gpu_wgmma_shape": (2, 1, 16),
                                               "gpu_mma_async_stages": 3}),
    ("wgmma 128x128 1wg x2, bk 64, cp.async 3", {**WGMMA, "gpu_wgmma_shape": (1, 2, 16),
                                                  "gpu_mma_async_stages": 3}),
    ("wgmma 128x256 2wg, bk 64, cp.async 3", {**WGMMA, "gpu_wgmma_shape": (2, 1, 32),
                                               "gpu_mma_async_stages": 3}),
    ("wgmma 256x128 2wg x2, bk 64, cp.async 3", {**WGMMA, "gpu_wgmma_shape": (2, 2, 16),
                                                  "gpu_mma_async_stages": 3}),
    ("wgmma 128x128 2wg, bk 64, cp.async 4", {**WGMMA, "gpu_wgmma_shape": (2, 1, 16)}),
    ("wgmma 128x128 2wg, bk 32, cp.async 4", {**WGMMA, "gpu_wgmma_shape": (2, 1, 16),
                                               "gpu_mma_bk": 32}),
    ("wgmma 128x256 2wg, bk 64, cp.async 4", {**WGMMA, "gpu_wgmma_shape": (2, 1, 32)}),
    ("wgmma 256x128, rows row-major", {**WGMMA, "gpu_mma_group_rows": 1}),
]
#: (label, knobs) of float16 ResNet-18 at batch 32.
CONV_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("scalar write-back", {"gpu_mma_vector_stores": False}),
    ("per-mma route (fragments off)", PER_MMA),
    ("taps inner (OIHW K order)", {"gpu_conv_mma_taps_outer": False}),
]
GEMM_N = 4096


def build(mod: Any, target: Target, knobs: dict[str, Any]) -> Any:
    """``mod`` built with ``knobs`` for every kernel's schedule."""
    return build_executable(lower_graph(mod, target), target, knobs=lambda f, t: knobs)


def nvrtc_report(arch: str, configs: list[tuple[str, dict[str, Any]]]) -> None:
    """Resources of each GEMM configuration's kernel, built for ``arch`` (no GPU; a program
    with wgmma compiles for ``sm_90a``)."""
    target = Target("cuda", arch=arch)
    mod = gemm_module(GEMM_N)
    print(f"{'config':40} {'regs':>4} {'smem B':>6} {'spill':>5} {'mma':>4} {'ldmatrix':>8} "
          f"{'wgmma':>5} {'cp.async':>8}")
    for label, knobs in configs:
        exe = build(mod, target, knobs)
        program = exe.module.program
        dynamic = {k.name: k.dynamic_shared_bytes for f in program.functions.values()
                   for k in f.kernels}
        binary = compile_cuda(program.source, arch)
        for name, res in binary.resources().items():
            ptx = binary.kernel_ptx()[name]
            # static (ptxas) + dynamic shared memory (the launch's, above 48 KB)
            print(f"{label:40} {res.registers:4d} {res.shared_bytes + dynamic.get(name, 0):6d} "
                  f"{res.spill_stores + res.spill_loads:5d} {ptx.count('mma.sync'):4d} "
                  f"{ptx.count('ldmatrix'):8d} {ptx.count('wgmma.mma_async'):5d} "
                  f"{ptx.count('cp.async'):8d}")


def pocl_report(n: int = 256) -> None:
    """Each wgmma configuration's n^3 float16 GEMM on OpenCL (PoCL) against numpy (no GPU):
    whether it took the route and the largest error relative to the largest output."""
    import numpy as np

    target = Target("opencl")
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (n, n)).astype(np.float16) for _ in range(2))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    print(f"GEMM {n}^3 float16 on {target.kind} (PoCL)")
    print(f"{'config':40} {'wgmma':>5} {'max err / max':>13} {'s':>6}")
    for label, knobs in WGMMA_CONFIGS:
        t0 = time.perf_counter()
        exe = build(gemm_module(n), target, knobs)
        on = "kiln_wgmma" in exe.module.program.source
        out = np.asarray(exe(a, b)).astype(np.float64)
        err = np.abs(out - exact).max() / np.abs(exact).max()
        print(f"{label:40} {str(on):>5} {err:13.2e} {time.perf_counter() - t0:6.1f}",
              flush=True)


def time_gemm(target: Target, repeat: int, configs: list[tuple[str, dict[str, Any]]]) -> None:
    _, torch_fn, inputs = gemm_case(GEMM_N)
    warm_up_gpu()
    ref = torch_fn(*inputs)
    cublas = timed(lambda: torch_fn(*inputs), repeat)
    flops = 2 * GEMM_N ** 3
    print(f"GEMM {GEMM_N}^3 float16: cuBLAS {cublas * 1e3:.3f} ms "
          f"({flops / cublas / 1e12:.0f} TFLOP/s)")
    print(f"{'config':40} {'ms':>8} {'TFLOP/s':>8} {'% cuBLAS':>8} {'err':>8} {'build s':>7}")
    for label, knobs in configs:
        t0 = time.perf_counter()
        exe = build(gemm_module(GEMM_N), target, knobs)
        build_s = time.perf_counter() - t0
        with torch.no_grad():
            err = rel_err(exe(*inputs), ref)
            t = timed(lambda e=exe: e(*inputs), repeat)
        print(f"{label:40} {t * 1e3:8.3f} {flops / t / 1e12:8.1f} {100 * cublas / t:8.1f} "
              f"{err:8.1e} {build_s:7.1f}", flush=True)


def time_resnet(target: Target, repeat: int) -> None:
    mod, params, module, inputs = model_case("resnet18", 32)
    mod16, module16, inputs16 = fp16_case(mod, params, module, inputs)
    with torch.no_grad():
        ref = module(*inputs)
        eager = timed(lambda: module16(*inputs16), repeat)
    print(f"ResNet-18 float16 batch 32: torch eager (channels_last) {eager * 1e3:.3f} ms")
    print(f"{'config':30} {'ms':>8} {'/ eager':>8} {'err':>8} {'build s':>7}")
    for label, knobs in CONV_CONFIGS:
        t0 = time.perf_counter()
        exe = build(mod16, target, knobs)
        build_s = time.perf_counter() - t0
        with torch.no_grad():
            err = rel_err(exe(*inputs), ref)
            t = timed(lambda e=exe: e(*inputs), repeat)
        print(f"{label:30} {t * 1e3:8.3f} {t / eager:8.2f} {err:8.1e} {build_s:7.1f}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("gemm", "resnet", "wgmma"), default=None,
                    help="wgmma: the default GEMM (and its first two variants), WGMMA_CONFIGS")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--arch", default=None, help="sm_80, sm_90 (default: the device's)")
    ap.add_argument("--nvrtc", metavar="ARCH", default=None,
                    help="no GPU: print each GEMM configuration's ptxas resources for ARCH")
    ap.add_argument("--pocl", action="store_true",
                    help="no GPU: run the wgmma configurations on OpenCL (PoCL) vs numpy")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    configs = [*GEMM_CONFIGS[:3], *WGMMA_CONFIGS] if args.only == "wgmma" else GEMM_CONFIGS
    if args.pocl:
        pocl_report()
        return
    if args.nvrtc:
        nvrtc_report(args.nvrtc, configs if args.only else [*GEMM_CONFIGS, *WGMMA_CONFIGS])
        return
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --nvrtc ARCH for the resources only)")
    major, minor = torch.cuda.get_device_capability()
    target = Target("cuda", arch=args.arch or f"sm_{major}{minor}")
    print(f"{torch.cuda.get_device_name()} ({target.arch}), "
          f"torch {torch.__version__}, repeat {args.repeat}")
    if args.only == "wgmma" and wgmma_refusal(target):
        raise SystemExit(f"--only wgmma: {wgmma_refusal(target)}")
    if args.only in (None, "gemm", "wgmma"):
        time_gemm(target, args.repeat, configs)
    if args.only in (None, "resnet"):
        time_resnet(target, args.repeat)


if __name__ == "__main__":
    main()
