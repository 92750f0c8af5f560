"""The CUDA runtime on a real GPU (tests marked ``gpu``: skipped without a CUDA device): kernels
compiled by NVRTC loaded and launched through the driver API, device buffers and the memory
plan, DLPack zero-copy with torch and CuPy, CUDA Graph replay, saved executables."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.gpu.build import build as gpu_build
from kiln.schedule.gpu import schedule_and_lower
from kiln.target import Target
from kiln.testing import models
from kiln.testing.index_checks import check_index_errors
from kiln.testing.op_testing import scheduled
from kiln.testing.tir_testing import (
    elementwise_func,
    gpu_row_reduce_func,
    gpu_scatter_add_func,
    gpu_tiled_matmul_func,
)

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(7)
#: The CPU reference, built for any AVX2 machine: a GPU machine's virtual CPU may list fewer
#: features than its compiler's -march=native enables (an H100 machine's build was refused on
#: avx512fp16, which kiln then spelled unlike Linux's /proc/cpuinfo: avx512_fp16).
CPU = Target("c", mcpu="x86-64-v3")


def _target() -> Target:
    from kiln.runtime.gpu.module import get_device

    arch = get_device("cuda").arch
    return Target("cuda", arch=arch if arch in ("sm_80", "sm_86", "sm_89", "sm_90") else "sm_90")


@pytest.mark.parametrize("threads", [32, 128, 96, 1024])
def test_cross_thread_reductions(threads):
    mod = gpu_build({"r": gpu_row_reduce_func(37, 5000, threads=threads)}, _target())
    x = RNG.standard_normal((37, 5000)).astype("float32")
    out = np.full((37,), np.nan, "float32")
    mod["r"](x, out)
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-4, atol=1e-3)


def test_tiled_matmul_with_shared_memory():
    mod = gpu_build({"mm": gpu_tiled_matmul_func(256, 128, 320)}, _target())
    a = RNG.standard_normal((256, 320)).astype("float32")
    b = RNG.standard_normal((320, 128)).astype("float32")
    c = np.full((256, 128), np.nan, "float32")
    mod["mm"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_elementwise(dtype):
    func = elementwise_func((64, 256), dtype, lambda x, y: x * y + 1.0, nin=2)
    from kiln.schedule.gpu import schedule_prim_func

    mod = gpu_build({"f": schedule_prim_func(func, _target())}, _target())
    np_dt = kiln.ir.DataType(dtype).to_numpy()
    x = RNG.standard_normal((64, 256)).astype(np_dt)
    y = RNG.standard_normal((64, 256)).astype(np_dt)
    out = np.zeros((64, 256), np_dt)
    mod["f"](x, y, out)
    ref = (x.astype("float32") * y.astype("float32") + 1.0).astype(np_dt)
    np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16))


@pytest.mark.parametrize("model", ["mlp", "small_cnn", "resnet_block_cnn"])
def test_models_match_the_cpu(model):
    m = getattr(models, model)()
    cpu = kiln.build(m.mod, CPU)(*m.inputs)
    gpu = kiln.build(m.mod, _target())(*m.inputs)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-4)


def _mlp_module():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((8, 64), "float32"))
    w = g.Var("w", g.TensorStructInfo((64, 32), "float32"))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit(op.matmul(x, w))
            z = bb.emit_output(op.nn.softmax(op.nn.relu(y), axis=-1))
        bb.emit_func_output(z, params=[x, w])
    return bb.get()


def test_torch_tensors_in_and_out_without_copies():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    exe = kiln.build(_mlp_module(), _target())
    x = torch.randn(8, 64, device="cuda")
    w = torch.randn(64, 32, device="cuda")
    out = exe(x, w)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.shape == (8, 32)
    ref = torch.softmax(torch.relu(x @ w), dim=-1)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    # a second run with other tensors replays the graph with updated arguments
    x2 = torch.randn(8, 64, device="cuda")
    out2 = exe(x2, w)
    torch.testing.assert_close(out2, torch.softmax(torch.relu(x2 @ w), dim=-1), rtol=1e-4,
                               atol=1e-5)
    ex = exe._executor("main")
    assert ex.use_graphs and ex._graph is not None
    # numpy inputs give numpy outputs
    np_out = exe(x.cpu().numpy(), w.cpu().numpy())
    np.testing.assert_allclose(np_out, ref.cpu().numpy(), rtol=1e-4, atol=1e-5)


def test_a_misaligned_torch_view_is_refused_and_the_context_survives():
    """A view one float32 element into its allocation starts 4 bytes in: not 16-byte aligned,
    which the kernels' vector loads would fault on (and lose the CUDA context). kiln refuses it with
    an ArgumentError; the aligned copy runs, in the same process."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    exe = kiln.build(_mlp_module(), _target())
    x = torch.randn(9 * 64, device="cuda")[1:513].reshape(8, 64)
    w = torch.randn(64, 32, device="cuda")
    with pytest.raises(kiln.ir.ArgumentError, match="multiple of 16"):
        exe(x, w)
    out = exe(x.clone(), w)
    torch.testing.assert_close(out, torch.softmax(torch.relu(x @ w), dim=-1), rtol=1e-4,
                               atol=1e-5)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    exe = kiln.build(_mlp_module(), _target())
    x = cupy.asarray(RNG.standard_normal((8, 64)).astype("float32"))
    w = cupy.asarray(RNG.standard_normal((64, 32)).astype("float32"))
    out = exe(x, w)
    assert isinstance(out, cupy.ndarray)
    ref = exe(cupy.asnumpy(x), cupy.asnumpy(w))
    np.testing.assert_allclose(cupy.asnumpy(out), ref, rtol=1e-5, atol=1e-6)


def test_saved_executable_reloads_from_its_cubin(tmp_path):
    m = models.mlp()
    exe = kiln.build(m.mod, _target())
    path = str(tmp_path / "mlp.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    np.testing.assert_allclose(loaded(*m.inputs), exe(*m.inputs), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_atomic_scatter_add(dtype):
    n, m = 5000, 7
    mod = gpu_build({"f": gpu_scatter_add_func(dtype, n, m)}, _target())
    idx = RNG.integers(0, m, n).astype("int32")
    val = (RNG.standard_normal(n) * 100).astype(dtype)
    out = np.zeros(m, dtype)
    mod["f"](idx, val, out)
    ref = np.zeros(m, dtype)
    np.add.at(ref, idx, val)
    np.testing.assert_allclose(out, ref, rtol=1e-4)


def test_symbolic_batch_on_the_gpu():
    from kiln.frontend.onnx import from_onnx

    demo = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models",
                        "demo_resnet.onnx")
    mod, params = from_onnx(demo)
    cpu = kiln.build(mod, CPU, params=params)
    gpu = kiln.build(mod, _target(), params=params)
    plan = cpu.plans["main"]
    shape = plan.slots[plan.input_slots[0]].shape
    for batch in (1, 5):
        dims = tuple(d if isinstance(d, int) else batch for d in shape)
        x = RNG.standard_normal(dims).astype("float32")
        np.testing.assert_allclose(gpu(x), cpu(x), rtol=1e-4, atol=1e-5)


def test_out_of_range_indices_raise(tmp_path):
    """The kernels' check record on a CUDA device: the same errors as on the CPU."""
    check_index_errors(_target(), tmp_path)


#: Knob configurations of the tensor-core GEMM whose CUDA side PoCL cannot check: the
#: cp.async pipelines (stage rotation and waits on the real asynchronous copies), ldmatrix's
#: lane addressing, B's chunk layout (the lane stride L of the fragment gathers).
MMA_KNOBS = [
    {},
    # the per-mma route (one intrinsic call per mma), under its knobs
    {"gpu_mma_fragments": False},
    {"gpu_mma_fragments": False, "gpu_mma_async_stages": 2},
    {"gpu_mma_fragments": False, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
     "gpu_mma_async_stages": 3},
    {"gpu_mma_fragments": False, "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32,
     "gpu_mma_async_stages": 4, "gpu_mma_b_chunks": True},
    {"gpu_mma_fragments": False, "gpu_mma_ldmatrix": True},
    {"gpu_mma_fragments": False, "gpu_mma_tiles": (2, 8), "gpu_mma_bk": 64,
     "gpu_mma_async_stages": 3, "gpu_mma_ldmatrix": True, "gpu_mma_b_chunks": True},
    # the warp-tile intrinsic (the default): ldmatrix (.trans for B's column-block order),
    # with the register prefetch, and x2 for an odd NI
    {"gpu_mma_tiles": (4, 4), "gpu_mma_bk": 32, "gpu_mma_async_stages": 0},
    {"gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32, "gpu_mma_async_stages": 3},
    {"gpu_mma_warps": (2, 4), "gpu_mma_tiles": (1, 1), "gpu_mma_async_stages": 2},
    # the wgmma route (knob gpu_mma_wgmma, sm_90a): the default shape (256 x 128 in 4 stages,
    # or the next that divides), one warpgroup of two products in a 2-stage 32-deep pipeline
    # (each step waits for its own products), 128 x 128 in 3 stages (one step in flight);
    # a shape it does not divide takes the mma.sync route: also right
    {"gpu_mma_wgmma": True},
    {"gpu_mma_wgmma": True, "gpu_wgmma_shape": (1, 2, 16), "gpu_mma_bk": 32,
     "gpu_mma_async_stages": 2},
    {"gpu_mma_wgmma": True, "gpu_wgmma_shape": (2, 1, 16), "gpu_mma_async_stages": 3},
]


@pytest.mark.parametrize("knobs", MMA_KNOBS, ids=lambda k: ",".join(
    f"{n[8:]}={v}" for n, v in k.items()) or "default")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(256, 512, 128), (2, 128, 64, 192)])
def test_tensor_core_gemm_matches_numpy(dtype, shape, knobs):
    """mma.sync.m16n8k16 (kiln.tir.tensor_intrin.gpu): each lane's fragments as the PTX ISA
    lays them out, summed in float32 and rounded once; under each of :data:`MMA_KNOBS` (a
    configuration the shape's tiles do not fit takes the SIMT GEMM: also right)."""
    *batch, m, k, n = shape
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    a = RNG.uniform(-1, 1, (*batch, m, k)).astype(np_dt)
    b = RNG.uniform(-1, 1, (*batch, k, n)).astype(np_dt)
    func, _ = scheduled("matmul", [a, b], {}, schedule=False)
    _, lowered = schedule_and_lower(func.with_attr("op_name", "matmul"), _target(), knobs)
    out = np.full((*batch, m, n), np.nan, np_dt)
    gpu_build({"f": lowered}, _target())["f"](a, b, out)
    exact = np.matmul(a.astype("float64"), b.astype("float64"))
    eps = 2.0 ** (-10 if dtype == "float16" else -7)
    err = np.abs(out.astype("float64") - exact)
    assert np.all(err <= eps * np.abs(exact) + 1e-3 * np.abs(exact).max()), err.max()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_dense_matches_numpy(dtype):
    """The wgmma route's dense (knob gpu_mma_wgmma): W[n, k] read K-major (imm-trans-b 0),
    x's rows fused over its leading axis; float32 sums rounded once."""
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    x = RNG.uniform(-1, 1, (2, 192, 256)).astype(np_dt)
    w = RNG.uniform(-1, 1, (384, 256)).astype(np_dt)
    func, _ = scheduled("dense", [x, w], {}, schedule=False)
    _, lowered = schedule_and_lower(func.with_attr("op_name", "dense"), _target(),
                                    {"gpu_mma_wgmma": True})
    out = np.full((2, 192, 384), np.nan, np_dt)
    module = gpu_build({"f": lowered}, _target())
    assert "wgmma.mma_async" in module.program.source
    module["f"](x, w, out)
    exact = np.matmul(x.astype("float64"), w.T.astype("float64"))
    eps = 2.0 ** (-10 if dtype == "float16" else -7)
    err = np.abs(out.astype("float64") - exact)
    assert np.all(err <= eps * np.abs(exact) + 1e-3 * np.abs(exact).max()), err.max()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("xs,ws,stride,pad", [
    ((1, 3, 64, 64), (64, 3, 7, 7), 2, 3),      # the stem: K = 147 padded to 160
    ((2, 64, 14, 14), (64, 64, 3, 3), 1, 1),    # 392 pixels: padded to 416 columns
    ((1, 256, 7, 7), (512, 256, 3, 3), 1, 1),   # 49 pixels: padded to 64 columns
    ((2, 64, 28, 28), (128, 64, 1, 1), 2, 0),   # the downsampling 1 x 1
])
def test_tensor_core_convolution_matches_the_exact_product(dtype, xs, ws, stride, pad):
    """conv2d on mma.sync (kiln.schedule.gpu.conv_mma): float32 sums rounded once."""
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    x = RNG.uniform(-1, 1, xs).astype(np_dt)
    w = RNG.uniform(-1, 1, ws).astype(np_dt)
    attrs = {"strides": (stride, stride), "padding": (pad,) * 4, "dilation": (1, 1),
             "groups": 1}
    func, _ = scheduled("nn.conv2d", [x, w], attrs, schedule=False)
    _, lowered = schedule_and_lower(func.with_attr("op_name", "nn.conv2d"), _target())
    assert "gpu.mma_tile" in str(lowered)
    exact = np.asarray(kiln.build(_conv_module(xs, w.astype("float64"), stride, pad), CPU)(
        x.astype("float64")))
    out = np.full(exact.shape, np.nan, np_dt)
    gpu_build({"f": lowered}, _target())["f"](x, w, out)
    eps = 2.0 ** (-10 if dtype == "float16" else -7)
    err = np.abs(out.astype("float64") - exact)
    assert np.all(err <= eps * np.abs(exact) + 1e-3 * np.abs(exact).max()), err.max()


def _conv_module(xs, w, stride, pad):
    """A float64 convolution (the reference) with ``w`` a constant."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo(xs, "float64"))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit_output(op.nn.conv2d(x, g.const(w), strides=(stride, stride),
                                            padding=(pad, pad)))
        bb.emit_func_output(y, params=[x])
    return bb.get()
