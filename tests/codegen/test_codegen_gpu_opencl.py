"""OpenCL C from the GPU renderer, run for real on PoCL and checked against numpy: data types
(float16/bfloat16 stored as bits, bool, narrow ints), vector loads and stores, math, symbolic
shapes, scalar parameters, workspaces, one-thread kernels."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen.gpu.build import build, generate_source
from kiln.schedule.gpu import schedule_prim_func
from kiln.target import Target
from kiln.testing.op_testing import check
from kiln.testing.tir_testing import elementwise_func, gpu_scatter_add_func

OPENCL = Target("opencl")
RNG = np.random.default_rng(5)


def _run(func, *arrays):
    mod = build({"f": schedule_prim_func(func, OPENCL)}, OPENCL)
    mod["f"](*arrays)
    return mod


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8", "uint16", "int64"])
def test_arithmetic_types(dtype):
    shape = (33, 40)
    func = elementwise_func(shape, dtype, lambda x, y: x * y + (x - y), nin=2)
    x = (RNG.standard_normal(shape) * 10).astype(dtype)
    y = (RNG.standard_normal(shape) * 10).astype(dtype)
    out = np.zeros(shape, dtype)
    _run(func, x, y, out)
    ref = x * y + (x - y)
    if dtype.startswith("float"):
        check(out, ref, rtol=1e-6)  # fused multiply-adds round once
    else:
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_floats_round_like_numpy(dtype):
    np_dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float16)
    func = elementwise_func((64, 64), dtype, lambda x, y: x * y + x, nin=2)
    x = RNG.standard_normal((64, 64)).astype(np_dt)
    y = RNG.standard_normal((64, 64)).astype(np_dt)
    out = np.zeros((64, 64), np_dt)
    _run(func, x, y, out)
    ref = (x.astype(np.float32) * y.astype(np.float32) + x.astype(np.float32)).astype(np_dt)
    np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16))


def test_vectorized_nest_uses_vector_loads_and_stores():
    func = schedule_prim_func(elementwise_func((128, 256), "float32", lambda x: x * 2.0 + 1.0),
                              OPENCL)
    source, _ = generate_source({"f": func}, OPENCL)
    assert "vload4(0, " in source and "vstore4((float4)(" in source
    x = RNG.standard_normal((128, 256)).astype("float32")
    out = np.zeros_like(x)
    build({"f": func}, OPENCL)["f"](x, out)
    np.testing.assert_allclose(out, x * 2 + 1)


def test_math_functions_and_nan_semantics():
    def f(x):
        return tir.max(tir.exp(x) - tir.tanh(x), tir.sqrt(tir.fabs(x))) + tir.floor(x)

    func = elementwise_func((16, 17), "float32", f)
    x = RNG.standard_normal((16, 17)).astype("float32")
    x[0, :3] = [np.nan, np.inf, -np.inf]
    out = np.zeros_like(x)
    with np.errstate(invalid="ignore"):
        ref = np.maximum(np.exp(x) - np.tanh(x), np.sqrt(np.abs(x))) + np.floor(x)
    _run(func, x, out)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_bool_and_comparisons():
    func = elementwise_func((50,), "bool", lambda x, y: tir.all_of([tir.lt(x, y),
                                                                     tir.ge(y, x)]),
                            nin=2, in_dtypes=["float32", "float32"])
    x = RNG.standard_normal(50).astype("float32")
    y = RNG.standard_normal(50).astype("float32")
    out = np.zeros(50, bool)
    _run(func, x, y, out)
    np.testing.assert_array_equal(out, x < y)


def test_symbolic_shapes_and_scalar_parameters():
    n = tir.Var("n", "int64")
    a = te.placeholder((n, 3), "float32", name="a")
    s = tir.Var("s", "float32")
    b = te.compute((n, 3), lambda i, j: a[i, j] * s + tir.cast("float32", i), name="b")
    func = te.create_prim_func([a, s, b])
    mod = build({"f": schedule_prim_func(func, OPENCL)}, OPENCL)
    for rows in (1, 7, 1000):
        x = RNG.standard_normal((rows, 3)).astype("float32")
        out = np.zeros_like(x)
        mod["f"](x, 2.5, out)
        check(out, x * 2.5 + np.arange(rows)[:, None], rtol=1e-6)


def test_global_intermediate_between_kernels_is_a_workspace():
    x = te.placeholder((40, 70), "float32", name="x")
    k = te.reduce_axis((0, 70), name="k")
    m = te.compute((40,), lambda i: te.max(x[i, k], axis=k), name="m")
    y = te.compute((40, 70), lambda i, j: x[i, j] - m[i], name="y")
    func = te.create_prim_func([x, y])
    mod = build({"f": schedule_prim_func(func, OPENCL)}, OPENCL)
    fn = mod.program.functions["f"]
    assert len(fn.kernels) == 2 and [w.name for w in fn.workspaces] == ["m"]
    xs = RNG.standard_normal((40, 70)).astype("float32")
    out = np.zeros_like(xs)
    mod["f"](xs, out)
    np.testing.assert_allclose(out, xs - xs.max(1, keepdims=True))


def test_one_thread_kernel_runs_what_no_rule_binds():
    func = elementwise_func((5,), "float32", lambda x: x + 1.0)
    mod = build({"f": func}, OPENCL)  # unscheduled: one kernel of one thread
    (k,) = mod.program.functions["f"].kernels
    assert k.block == (1, 1, 1) and k.grid == (1, 1, 1)
    x = RNG.standard_normal(5).astype("float32")
    out = np.zeros_like(x)
    mod["f"](x, out)
    np.testing.assert_allclose(out, x + 1)


def test_one_renderer_two_dialects():
    func = schedule_prim_func(elementwise_func((64, 64), "float32", lambda x: x * x), OPENCL)
    ocl, _ = generate_source({"f": func}, OPENCL)
    cuda, _ = generate_source({"f": schedule_prim_func(elementwise_func(
        (64, 64), "float32", lambda x: x * x), Target("cuda"))}, Target("cuda"))
    assert "__kernel" in ocl and "get_group_id(0)" in ocl and "__global" in ocl
    assert '__global__ void __launch_bounds__' in cuda and "blockIdx.x" in cuda
    assert "__restrict__" in cuda and "get_local_id" not in cuda


def test_kernel_parameter_bytes_are_checked():
    from kiln.ir.errors import CodegenError

    func = schedule_prim_func(elementwise_func((8,), "float32", lambda *xs: sum(xs[1:], xs[0]),
                                               nin=40), OPENCL)
    small = Target("opencl", attrs={"max_kernel_param_bytes": 256})
    with pytest.raises(CodegenError, match=r"41 arguments \(328 bytes\).*256 bytes"):
        generate_source({"f": func}, small)


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "float64"])
def test_atomic_add_scatter(dtype):
    from kiln.codegen.gpu.nvrtc import compile_cuda

    n, m = 1000, 16
    func = gpu_scatter_add_func(dtype, n, m)
    mod = build({"f": func}, OPENCL)
    idx = RNG.integers(0, m, n).astype("int32")
    val = (RNG.standard_normal(n) * 100).astype(dtype)
    out = np.zeros(m, dtype)
    mod["f"](idx, val, out)
    ref = np.zeros(m, dtype)
    np.add.at(ref, idx, val)
    if dtype.startswith("float"):
        check(out, ref, rtol=1e-5)  # the order of the additions varies
    else:
        np.testing.assert_array_equal(out, ref)
    source, _ = generate_source({"f": func}, Target("cuda", arch="sm_80"))
    assert "atomicAdd(" in source
    compile_cuda(source, "sm_80")
