"""GPU targets: kinds, architectures, limits from the target (and the OpenCL device)."""

from __future__ import annotations

import pytest

from kiln.ir.errors import KilnError
from kiln.target import Target
from kiln.target.gpu import CUDA_ARCHS, OPENCL_DEFAULTS, cuda_arch, opencl_device_limits


def test_cuda_archs_and_their_limits():
    for arch in ("sm_80", "sm_89", "sm_90"):
        t = Target("cuda", arch=arch)
        assert t.is_gpu and t.kind == "cuda" and cuda_arch(t) == arch
        lim = t.gpu
        assert lim.max_threads_per_block == 1024 and lim.warp_size == 32
        assert lim.max_kernel_param_bytes == 4096 and lim.max_registers_per_thread == 255
        assert lim.shared_memory_per_block == 48 * 1024
    assert Target("cuda", arch="sm_90").gpu.shared_memory_per_block_optin == 227 * 1024
    assert Target("cuda", arch="sm_80").gpu.shared_memory_per_block_optin == 163 * 1024
    assert Target("cuda", arch="sm_89").gpu.shared_memory_per_block_optin == 99 * 1024
    assert cuda_arch(Target("cuda")) in CUDA_ARCHS
    assert not Target("c").is_gpu


def test_bad_arch_is_a_clear_error():
    with pytest.raises(KilnError, match="unsupported arch 'sm_70'.*sm_80"):
        Target("cuda", arch="sm_70")
    with pytest.raises(KilnError, match="takes no arch"):
        Target("opencl", arch="sm_80")
    with pytest.raises(KilnError, match="takes no arch"):
        Target("c", arch="sm_80")
    with pytest.raises(KilnError, match="unknown target kind 'vulkan'"):
        Target("vulkan")


def test_opencl_limits_come_from_the_device():
    lim = Target("opencl").gpu
    dev = opencl_device_limits()
    if dev is None:
        assert lim == OPENCL_DEFAULTS
    else:
        import pyopencl as cl

        d = next(d for p in cl.get_platforms() for d in p.get_devices())
        assert lim.max_threads_per_block == d.max_work_group_size
        assert lim.shared_memory_per_block == d.local_mem_size
        assert lim.max_kernel_param_bytes == d.max_parameter_size
        assert lim.buffer_alignment == d.mem_base_addr_align // 8


def test_limits_can_be_overridden_per_target():
    t = Target("opencl", attrs={"max_threads_per_block": 128, "max_block_dims": (128, 4, 1)})
    assert t.gpu.max_threads_per_block == 128 and t.gpu.max_block_dims == (128, 4, 1)
    with pytest.raises(KilnError, match="max_threads_per_block"):
        _ = Target("cuda", attrs={"max_threads_per_block": -1}).gpu
