"""One kiln GEMM kernel, built with given knobs and run a few times: the process to put under
Nsight Compute (``ncu``) on a GPU machine, and its SASS when ``cuobjdump`` is there.

    ncu -k regex:matmul -c 1 --section SpeedOfLight --section WarpStateStats \\
        python benchmarks/gpu_profile.py --knob gpu_mma_async_stages=3
    python benchmarks/gpu_profile.py --sass /tmp/sass --knob gpu_mma_tiles=4x8

The timings of ``benchmarks/gpu_mma_knobs.py`` say which configuration is faster; this says why
(stall reasons, issue slots, shared-memory bank conflicts, the instructions of the main loop).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from gpu import gemm_case, parse_knob, rel_err  # noqa: E402
from gpu_mma_knobs import build  # noqa: E402

from kiln.codegen.gpu.nvrtc import compile_cuda  # noqa: E402
from kiln.target import Target  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", type=parse_knob, action="append", default=[],
                    help="NAME=VALUE for every kernel's schedule (repeatable)")
    ap.add_argument("--n", type=int, default=4096, help="the GEMM's size (n x n x n)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sass", default=None, help="folder for the source, PTX, cubin and SASS")
    args = ap.parse_args()
    knobs = dict(args.knob)
    major, minor = torch.cuda.get_device_capability()
    target = Target("cuda", arch=f"sm_{major}{minor}")
    mod, torch_fn, inputs = gemm_case(args.n)
    exe = build(mod, target, knobs)
    if args.sass:
        os.makedirs(args.sass, exist_ok=True)
        source = exe.module.program.source
        binary = compile_cuda(source, target.arch)
        label = "_".join(f"{k}={v}" for k, v in sorted(knobs.items())) or "default"
        stem = os.path.join(args.sass, label.replace("(", "").replace(")", "").replace(", ", "x"))
        for ext, data in (("cu", source.encode()), ("ptx", binary.ptx),
                          ("cubin", binary.cubin)):
            with open(f"{stem}.{ext}", "wb") as f:
                f.write(data)
        tool = shutil.which("cuobjdump")
        if tool:
            with open(f"{stem}.sass", "w") as f:
                subprocess.run([tool, "-sass", f"{stem}.cubin"], stdout=f, check=False)
        print(f"{label}: {binary.resources()}")
    with torch.no_grad():
        for _ in range(args.runs):
            out = exe(*inputs)
        torch.cuda.synchronize()
        print(f"relative error vs torch.matmul: {rel_err(out, torch_fn(*inputs)):.1e}")


if __name__ == "__main__":
    main()
