"""Every kernel of the models compiles with NVRTC for sm_80 and sm_90 and stays within the
target's limits (registers per thread and per block, shared memory, no spills): ResNet-18,
MobileNetV2, the MLP and the BERT-style encoder (``kiln.testing.torch_models``) and the
bundled demo CNN. No GPU is needed: NVRTC runs ptxas and reports each kernel's resources."""

from __future__ import annotations

import os

import pytest

import kiln
from kiln.codegen.gpu.nvrtc import compile_cuda
from kiln.frontend.onnx import from_onnx
from kiln.target import Target
from kiln.testing import torch_models

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models",
                    "demo_resnet.onnx")


def _model(name: str):
    if name == "demo":
        return from_onnx(DEMO)
    data, _ = torch_models.onnx_model(name)
    return from_onnx(data)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "mlp", "bert_encoder", "demo"])
def test_model_kernels_compile_within_limits(name):
    mod, params = _model(name)
    exe = kiln.build(mod, Target("cuda", arch="sm_80"), params=params)
    program = exe.module.program
    kernels = {k.name: k for f in program.functions.values() for k in f.kernels}
    assert kernels
    for arch in ("sm_80", "sm_90"):
        limits = Target("cuda", arch=arch).gpu
        usage = compile_cuda(program.source, arch).resources()
        assert set(usage) == set(kernels), arch
        for kname, res in usage.items():
            spec = kernels[kname]
            where = f"{name} {arch} {kname}"
            assert res.registers <= limits.max_registers_per_thread, where
            assert res.registers * spec.threads <= limits.max_registers_per_block, where
            assert res.shared_bytes + spec.dynamic_shared_bytes <= \
                limits.shared_memory_per_block_optin, where
            assert res.spill_stores == 0 and res.spill_loads == 0, where
