#!/usr/bin/env bash
# The GPU checks of issue 29 as one device call (about 8 minutes on an H100): what a session
# that is lent a GPU runs first, from the repository root, e.g. with the `device` tool:
#
#   bash benchmarks/gpu_device_check.sh          # writes its logs to $OUT (or /tmp/gpu-check)
#   bash benchmarks/gpu_device_check.sh wgmma    # step 0 only (about 4 minutes)
#
# 0. the wgmma route (knob gpu_mma_wgmma, sm_90a; built and checked on PoCL/NVRTC only before
#    a device ran it): its `gpu` tests (numerics vs numpy), then its GEMM configurations timed
#    against cuBLAS (benchmarks/gpu_mma_knobs.py --only wgmma), each in its own process so that
#    a faulting kernel cannot take the later steps' CUDA context with it;
# 1. the tests marked `gpu` (CUDA runtime, tensor-core GEMM and convolutions vs numpy/torch);
# 2. benchmarks/gpu_mma_knobs.py: the 4096^3 float16 GEMM under each mma knob configuration
#    against torch.matmul (cuBLAS), float16 ResNet-18 b32 with the conv knobs;
# 3. benchmarks/gpu.py: the issue's table (GEMM, ResNet-18 b1/b32 fp32 and fp16, the encoder)
#    against torch eager and torch.compile.
# Each step has its own time limit so that one slow step leaves the others their time.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-/tmp/kiln-gpu-cache}"
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
timeout 120 python -m pytest -q -m gpu tests/runtime/test_runtime_gpu_cuda.py -k wgmma 2>&1 \
    | tail -40 | tee "$out/wgmma_tests.txt"
timeout 150 python benchmarks/gpu_mma_knobs.py --only wgmma 2>&1 | tee "$out/wgmma_knobs.txt"
[ "${1:-}" = wgmma ] && exit 0
timeout 150 python -m pytest -q -m gpu tests/runtime/test_runtime_gpu_cuda.py 2>&1 \
    | tail -40 | tee "$out/tests.txt"
timeout 200 python benchmarks/gpu_mma_knobs.py 2>&1 | tee "$out/knobs.txt"
timeout 210 python benchmarks/gpu.py 2>&1 | tee "$out/table.txt"
