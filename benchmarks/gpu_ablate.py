"""Where a GPU GEMM kernel's time goes: the generated 4096^3 float16 kernel timed as built and
with parts of its main loop deleted -- the operands' shared copies (each, both) or the
tensor-core products -- on a CUDA GPU.

    python benchmarks/gpu_ablate.py                       # the default schedule
    python benchmarks/gpu_ablate.py --knob gpu_mma_wgmma=True
    python benchmarks/gpu_ablate.py --check               # no GPU: build and compile only

The variants compute wrong results on purpose (a deleted copy leaves its tile as it was): they
are timings, run on all-ones operands (cheaper for the tensor cores than random data, so the
times are lower than ``benchmarks/gpu_mma_knobs.py``'s). A kernel as fast without its copies
as without its products is bound by neither alone; one much faster without its copies is
bound by them (2026-11-27, H100: the wgmma route's 256 x 128 kernel 0.617 ms as built,
0.204 ms without copies, 0.600 ms without products). Launched through CuPy from the cubin
NVRTC compiled (``kiln.codegen.gpu.nvrtc``), with the launch shape kiln's program records.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu import gemm_module, parse_knob  # noqa: E402

from kiln.build import lower_graph  # noqa: E402
from kiln.codegen.executable import build_executable  # noqa: E402
from kiln.codegen.gpu.nvrtc import compile_cuda  # noqa: E402
from kiln.target import Target  # noqa: E402

#: variant -> the statements (a regular expression on a source line) it deletes
VARIANTS = {
    "as built": None,
    "no B copies": r"kiln_cp_async_\d+\(\w*B_shared",
    "no A copies": r"kiln_cp_async_\d+\(\w*A_shared",
    "no copies": r"kiln_cp_async_\d+\(\w*(A|B)_shared",
    "no products": r"\(void\)kiln_(wgmma|mma)",
}


def without(source: str, pattern: str | None) -> str:
    """``source`` without its lines that match ``pattern``; the same when that is None."""
    if pattern is None:
        return source
    return "\n".join(line for line in source.split("\n") if not re.search(pattern, line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", type=parse_knob, action="append", default=[],
                    help="NAME=VALUE for the GEMM's schedule (repeatable)")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--check", action="store_true", help="build and compile only (no GPU)")
    args = ap.parse_args()
    knobs = dict(args.knob)
    target = Target("cuda", arch="sm_90")
    exe = build_executable(lower_graph(gemm_module(args.n), target), target,
                           knobs=lambda f, t: knobs)
    (kernel,) = [k for f in exe.module.program.functions.values() for k in f.kernels]
    source = exe.module.program.source
    if not args.check:
        import cupy as cp

        ones = [cp.ones((args.n, args.n), cp.float16) for _ in range(2)]
        out = cp.empty((args.n, args.n), cp.float16)
    print(f"GEMM {args.n}^3 float16, knobs {knobs or 'default'}: kernel {kernel.name}, grid "
          f"{kernel.grid}, block {kernel.block}, {kernel.dynamic_shared_bytes} B dynamic shared")
    for name, pattern in VARIANTS.items():
        binary = compile_cuda(without(source, pattern), target.arch)
        (res,) = binary.resources().values()
        if args.check:
            print(f"{name:12s} {res.registers:4d} registers")
            continue
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(binary.cubin)
        fn = cp.RawModule(path=f.name).get_function(kernel.name)
        os.unlink(f.name)
        fn.max_dynamic_shared_size_bytes = kernel.dynamic_shared_bytes

        launch = (kernel.grid, kernel.block, (*ones, out))
        for _ in range(3):
            fn(*launch, shared_mem=kernel.dynamic_shared_bytes)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(args.repeat):
            fn(*launch, shared_mem=kernel.dynamic_shared_bytes)
        end.record()
        end.synchronize()
        ms = cp.cuda.get_elapsed_time(start, end) / args.repeat
        print(f"{name:12s} {res.registers:4d} registers {ms:8.3f} ms "
              f"{2 * args.n ** 3 / ms / 1e9:7.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
