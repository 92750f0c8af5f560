"""Per kernel of a model built for CUDA: the launch shape and what ptxas (through NVRTC, no GPU
needed) reports -- registers per thread, static shared memory, stack and spills.

    python benchmarks/gpu_kernel_resources.py                        # ResNet-18, sm_90
    python benchmarks/gpu_kernel_resources.py mobilenet_v2 --arch sm_80 --size 224 --grep conv
    python benchmarks/gpu_kernel_resources.py --fp16          # float16 (conv on tensor cores)

The model is ``kiln.testing.torch_models``' architecture at ``--size`` x ``--size`` (batch 1).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpu_pocl import export_model  # noqa: E402

import kiln  # noqa: E402
from kiln.codegen.gpu.nvrtc import compile_cuda  # noqa: E402
from kiln.frontend.onnx import from_onnx  # noqa: E402
from kiln.target import Target  # noqa: E402
from kiln.transform import ToMixedPrecision  # noqa: E402
from kiln.transform.bind_params import bind_params  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="resnet18")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--grep", default="conv", help="only kernels whose name holds this")
    ap.add_argument("--fp16", action="store_true",
                    help="build the model after ToMixedPrecision('float16')")
    args = ap.parse_args()
    data, _ = export_model(args.model, args.size)
    mod, params = from_onnx(data)
    if args.fp16:
        mod, params = ToMixedPrecision("float16")(bind_params(mod, params)), None
    exe = kiln.build(mod, Target("cuda", arch=args.arch), params=params)
    program = exe.module.program
    kernels = {k.name: k for f in program.functions.values() for k in f.kernels}
    usage = compile_cuda(program.source, args.arch).resources()
    print(f"{'kernel':44} {'threads':>7} {'regs':>5} {'smem B':>7} {'stack':>5} {'spill':>5}")
    for name in sorted(usage):
        if args.grep not in name:
            continue
        res = usage[name]
        print(f"{name:44} {kernels[name].threads:7d} {res.registers:5d} {res.shared_bytes:7d} "
              f"{res.stack_bytes:5d} {res.spill_stores + res.spill_loads:5d}")


if __name__ == "__main__":
    main()
