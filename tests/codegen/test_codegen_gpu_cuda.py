"""CUDA C from the GPU renderer, compiled with NVRTC for sm_80 and sm_90 (no GPU needed): the
source's CUDA spellings, ptxas' resource report against the target's limits, dynamic shared
memory beyond 48 KiB, and the KilnError when NVRTC is missing."""

from __future__ import annotations

import sys

import pytest

import kiln
from kiln import te
from kiln.codegen.gpu.build import compile_program, generate_source
from kiln.codegen.gpu.nvrtc import compile_cuda, resource_usage
from kiln.ir.errors import CompileError, KilnError
from kiln.schedule.gpu import schedule_prim_func
from kiln.target import Target
from kiln.testing.index_checks import gather_scatter_model
from kiln.testing.tir_testing import (
    elementwise_func,
    gpu_row_reduce_func,
    gpu_tiled_matmul_func,
)
from kiln.tir import Schedule

ARCHS = ("sm_80", "sm_90")


def _funcs(target):
    return {
        "reduce32": gpu_row_reduce_func(64, 1000, threads=32),
        "reduce256": gpu_row_reduce_func(64, 1000, threads=256),
        "reduce96": gpu_row_reduce_func(64, 1000, threads=96),
        "matmul": gpu_tiled_matmul_func(128, 128, 128),
        "ew32": schedule_prim_func(elementwise_func((64, 128), "float32", lambda x: x * 3.0),
                                   target),
        "half": schedule_prim_func(elementwise_func((64, 64), "float16", lambda x, y: x * y,
                                                    nin=2), target),
        "bf16": schedule_prim_func(elementwise_func((64, 64), "bfloat16", lambda x: x + 1.0),
                                   target),
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_within_the_limits(arch):
    target = Target("cuda", arch=arch)
    program = compile_program(_funcs(target), target)
    assert program.binaries["cubin"] and program.binaries["ptx"].startswith(b"//")
    usage = compile_cuda(program.source, arch).resources()
    kernels = {k.name: k for f in program.functions.values() for k in f.kernels}
    assert set(usage) == set(kernels)
    limits = target.gpu
    for name, res in usage.items():
        threads = kernels[name].threads
        assert res.registers <= limits.max_registers_per_thread, name
        assert res.registers * threads <= limits.max_registers_per_block, name
        assert res.shared_bytes <= limits.shared_memory_per_block, name
        assert res.spill_stores == 0, name


def test_cuda_spellings():
    target = Target("cuda", arch="sm_90")
    source, _ = generate_source(_funcs(target), target)
    for text in ('extern "C" __global__', "__launch_bounds__(256)", "__shfl_down_sync(",
                 "__shfl_sync(", "__syncthreads();", "__shared__ __align__(16) float",
                 "*(const float4*)(", "make_float4(", "*(const ushort4*)(", "cvt.f32.f16",
                 "const int32_t threadIdx_x = (int32_t)threadIdx.x;"):
        assert text in source, text


def test_kernels_that_check_indices_compile_with_their_check_record():
    """Checked indices write the check record (a 32-bit atomicCAS claims it); the function
    lists its checks' messages by number."""
    mod, params = gather_scatter_model()
    program = kiln.build(mod, Target("cuda", arch="sm_90"), params=params).module.program
    assert program.binaries["cubin"]
    assert "atomicCAS((int*)(r), 0, 1) == 0" in program.source
    checks = {f.checks for f in program.functions.values() if f.has_checks}
    assert checks == {("take along axis 0",), ("scatter_elements along axis 1",)}


def test_dynamic_shared_memory_beyond_48k():
    """A 64 KiB row staged in shared memory: CUDA's dynamic shared memory and its opt-in."""
    x = te.placeholder((4, 16384), "float32", name="x")
    y = te.compute((4, 16384), lambda i, j: x[i, 16383 - j] * 2.0, name="y")
    sch = Schedule(te.create_prim_func([x, y]))
    i, j = sch.get_loops(sch.get_block("y"))
    jo, ji = sch.split(j, [None, 256])
    sch.reorder(ji, jo)
    sch.bind(i, "blockIdx.x")
    sch.bind(ji, "threadIdx.x")
    cache = sch.cache_read(sch.get_block("y"), 0, "shared")
    sch.compute_at(cache, i)
    loop = sch.get_loops(cache)[-1]
    lo, li = sch.split(loop, [None, 256])
    sch.reorder(li, lo)
    sch.bind(li, "threadIdx.x")
    target = Target("cuda", arch="sm_90")
    program = compile_program({"rev": sch.func}, target)
    (k,) = program.functions["rev"].kernels
    assert k.dynamic_shared_bytes == 65536
    assert "extern __shared__ __align__(16) unsigned char kiln_dyn_shared[];" in program.source
    with pytest.raises(KilnError, match="shared memory exceed"):
        compile_program({"rev": sch.func}, Target("cuda", arch="sm_80", attrs={
            "shared_memory_per_block_optin": 48 * 1024}))


def test_resource_report_parsing():
    log = ("ptxas info    : Compiling entry function 'k1' for 'sm_90'\n"
           "ptxas info    : Function properties for k1\n"
           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem\n")
    (res,) = resource_usage(log).values()
    assert (res.registers, res.shared_bytes, res.stack_bytes, res.spill_stores) == (40, 2048,
                                                                                      8, 4)


def test_compile_errors_carry_nvrtc_log():
    with pytest.raises(CompileError, match=r"(?s)NVRTC could not compile.*undeclared_name"):
        compile_cuda('extern "C" __global__ void k() { undeclared_name = 1; }', "sm_80")


def test_missing_nvrtc_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(KilnError, match=r'pip install "kiln\[cuda\]"'):
        compile_cuda("x", "sm_80")
