"""tensorize: matching blocks against tensor intrinsics, the AVX2 micro-kernel end to end,
the AMX intrinsics compiled (and run where the CPU has AMX)."""

from __future__ import annotations

import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as cg
from kiln.ir import ScheduleError, structural_equal
from kiln.runtime.amx import AMXPermissionError, amx_permitted
from kiln.target.target import Target, detect_cpu_features
from kiln.tir import PrimFunc, Schedule
from kiln.tir import tensor_intrin as ti
from kiln.tir.tensor_intrin.x86 import tensorize_gemm_amx, tensorize_gemm_avx2

RNG = np.random.default_rng(11)
HOST_AMX = {"amx_tile", "amx_bf16", "amx_int8"} <= detect_cpu_features()
AMX_TARGET = Target("c", features=frozenset({"amx_tile", "amx_bf16", "amx_int8", "avx2"}))


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


def _matmul(n, m, p, dtype="float32", transpose_b=False, reducer=None) -> PrimFunc:
    A = te.placeholder((n, p), dtype, name="A")
    B = te.placeholder((m, p) if transpose_b else (p, m), dtype, name="B")
    k = te.reduce_axis((0, p), name="k")
    red = reducer or te.sum

    def body(i, j):
        b = B[j, k] if transpose_b else B[k, j]
        return red(A[i, k] * b, axis=k)

    C = te.compute((n, m), body, name="C")
    return te.create_prim_func([A, B, C])


def _tile(sch: Schedule, mr: int, nr: int):
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    i0, i1 = sch.split(i, factors=[None, mr])
    j0, j1 = sch.split(j, factors=[None, nr])
    sch.reorder(i0, j0, i1, j1, k)
    return i0, j0, i1


def _check(func: PrimFunc, n: int, m: int, p: int, **shape) -> str:
    a = RNG.standard_normal((n, p), dtype=np.float32)
    b = RNG.standard_normal((p, m), dtype=np.float32)
    out = np.full((n, m), np.nan, np.float32)
    mod = cg.build({"f": func}, "c")
    mod["f"](a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    return mod.source


# ---- AVX2 micro-kernel end to end ---------------------------------------------------------------
def test_avx2_gemm_end_to_end():
    sch = Schedule(_matmul(12, 32, 20))
    i0, _, i1 = _tile(sch, 6, 16)
    outer = sch.blockize(i1)
    sch.tensorize(outer, "x86.avx2.gemm_f32_6x16")
    sch.parallel(i0)
    blk = sch.get(outer)
    assert blk.annotations["kiln.tensor_intrin"] == "x86.avx2.gemm_f32_6x16"
    assert blk.init is not None  # the zeroing stays in TIR
    source = _check(sch.func, 12, 32, 20)
    assert "kiln_avx2_gemm_f32_6x16(" in source
    assert "_mm256_fmadd_ps" in source


def test_tensorize_into_a_compacted_cache():
    """The accumulator is a cache_write tile that lowering shrinks to 6x16: the row stride the
    intrinsic gets must be the tile's (16), not the full buffer's (32)."""
    sch = Schedule(_matmul(12, 32, 20))
    c = sch.get_block("C")
    cw = sch.cache_write(c, 0, "local")
    _, j0, i1 = _tile(sch, 6, 16)
    sch.reverse_compute_at(cw, j0)
    sch.tensorize(i1, "x86.avx2.gemm_f32_6x16")
    _check(sch.func, 12, 32, 20)


def test_tensorize_a_loop_with_symbolic_k():
    """tensorize(loop) blockizes first; the desc's free K binds to the block's extent."""
    K = tir.Var("K", "int64")
    A = te.placeholder((8, K), "float32", name="A")
    B = te.placeholder((K, 16), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((8, 16), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    _, _, i1 = _tile(sch, 4, 8)
    sch.tensorize(i1, "x86.avx2.gemm_f32_4x8")
    assert "sch.tensorize(block_or_loop=" in str(sch.trace)
    for p in (1, 13):
        _check(sch.func, 8, 16, p)


def test_tensorize_trace_replays():
    sch = Schedule(_matmul(12, 16, 5))
    _, _, i1 = _tile(sch, 6, 16)
    sch.tensorize(sch.blockize(i1), "x86.avx2.gemm_f32_6x16")
    replay = sch.trace.apply_to_schedule(Schedule(_matmul(12, 16, 5)))
    assert structural_equal(replay.func, sch.func)


def test_split_reduction_accumulates_across_outer_k():
    """k split with its outer part outside the intrinsic: the outer block is a reduction whose
    init runs at the first k_0 only, each call adds a K=4 slice."""
    sch = Schedule(_matmul(6, 16, 12))
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    k0, k1 = sch.split(k, factors=[None, 4])
    sch.reorder(i, j, k0, k1)
    i0, i1 = sch.split(i, factors=[None, 6])
    j0, j1 = sch.split(j, factors=[None, 16])
    sch.reorder(i0, j0, k0, i1, j1, k1)
    outer = sch.blockize(i1)
    sch.tensorize(outer, "x86.avx2.gemm_f32_6x16")
    assert tir.IterType.COMM_REDUCE in [iv.iter_type for iv in sch.get(outer).iter_vars]
    _check(sch.func, 6, 16, 12)


def test_tensorize_gemm_avx2_helper():
    sch = Schedule(_matmul(24, 32, 7))
    outer = tensorize_gemm_avx2(sch, sch.get_block("C"))
    i0, j0 = sch.get_loops(outer)
    sch.parallel(i0)
    _check(sch.func, 24, 32, 7)
    sch = Schedule(_matmul(20, 32, 7))  # 20 % 6 != 0: refused, schedule untouched
    with pytest.raises(ScheduleError, match="tensorize_gemm_avx2: .*predicate"):
        tensorize_gemm_avx2(sch, sch.get_block("C"))
    assert len(sch.trace) == 1  # only get_block


def test_impl_written_in_tir_is_moved_onto_the_region():
    """An impl need not be C: here a TIR loop on a strided 1-D view (what an NPU backend's
    instruction would be), bound to rows of a 2-D buffer at a loop-invariant offset."""
    n = tir.Var("n", "int64")
    X = tir.Buffer("X", (tir.const("int64", 8),), "float32", strides=(tir.const("int64", 1),))
    Y = tir.Buffer("Y", (tir.const("int64", 8),), "float32", strides=(tir.const("int64", 1),))
    two = tir.const("float32", 2.0)

    def func(body):
        px, py = tir.Var("X", "handle"), tir.Var("Y", "handle")
        root = tir.Block((), (), (), "root", body)
        return PrimFunc((px, py), {px: X, py: Y}, tir.BlockRealize((), tir.true_predicate(),
                                                                    root))

    i, vi = tir.Var("i", "int64"), tir.Var("vi", "int64")
    blk = tir.Block((tir.IterVar(tir.Range(tir.const("int64", 0), tir.const("int64", 8)), vi),),
                    (), (), "b", tir.BufferStore(Y, X[vi] * two, (vi,)))
    desc = func(tir.For(i, tir.const("int64", 0), tir.const("int64", 8), tir.ForKind.SERIAL,
                        tir.BlockRealize((i,), tir.true_predicate(), blk)))
    impl = func(tir.For(n, tir.const("int64", 0), tir.const("int64", 8),
                        tir.ForKind.VECTORIZED, tir.BufferStore(Y, X[n] + X[n], (n,))))
    ti.register("test.double8", desc, impl, override=True)

    A = te.placeholder((3, 16), "float32", name="A")
    B = te.compute((3, 16), lambda r, c: A[r, c] * tir.const("float32", 2.0), name="B")
    sch = Schedule(te.create_prim_func([A, B]))
    _, c = sch.get_loops(sch.get_block("B"))
    _, c1 = sch.split(c, factors=[None, 8])
    sch.tensorize(c1, "test.double8")
    a = RNG.standard_normal((3, 16), dtype=np.float32)
    out = np.zeros((3, 16), np.float32)
    cg.build({"f": sch.func}, "c")["f"](a, out)
    np.testing.assert_array_equal(out, a * 2)


# ---- mismatches ---------------------------------------------------------------------------------
def _refused(sch: Schedule, target, intrin: str, pattern: str) -> None:
    before = sch.func
    with pytest.raises(ScheduleError, match=pattern):
        sch.tensorize(target, intrin)
    assert sch.func is before


def test_unknown_intrinsic():
    sch = Schedule(_matmul(6, 16, 4))
    _, _, i1 = _tile(sch, 6, 16)
    _refused(sch, i1, "x86.nope", "no tensor intrinsic named 'x86.nope'; registered: .*avx2")


def test_mismatch_extent():
    sch = Schedule(_matmul(8, 16, 4))
    _, _, i1 = _tile(sch, 4, 16)
    _refused(sch, sch.blockize(i1), "x86.avx2.gemm_f32_6x16", r"loop 0 .*extent.*4.*6")


def test_mismatch_dtype():
    sch = Schedule(_matmul(6, 16, 4, dtype="float64"))
    _, _, i1 = _tile(sch, 6, 16)
    _refused(sch, i1, "x86.avx2.gemm_f32_6x16", "float64.*float32")


def test_mismatch_transposed_operand():
    sch = Schedule(_matmul(6, 16, 4, transpose_b=True))
    _, _, i1 = _tile(sch, 6, 16)
    _refused(sch, i1, "x86.avx2.gemm_f32_6x16", "not the intrinsic's B.*at a fixed offset")


def test_mismatch_operation():
    sch = Schedule(_matmul(6, 16, 4, reducer=te.max))
    _, _, i1 = _tile(sch, 6, 16)
    _refused(sch, i1, "x86.avx2.gemm_f32_6x16", "found Max .* where the intrinsic has Add")


def test_mismatch_partial_tile_and_structure():
    sch = Schedule(_matmul(10, 16, 4))  # 10 is not a multiple of 6: predicate
    _, _, i1 = _tile(sch, 6, 16)
    _refused(sch, i1, "x86.avx2.gemm_f32_6x16", "predicate")
    sch = Schedule(_matmul(6, 16, 4))
    c = sch.get_block("C")
    _refused(sch, c, "x86.avx2.gemm_f32_6x16", "not a loop nest around one block")
    _, j = sch.get_loops(c)[:2]
    _refused(sch, j, "x86.avx2.gemm_f32_6x16", "it has 2 loops .* the intrinsic 3")


def test_register_checks_desc_and_impl():
    intrin = ti.get("x86.avx2.gemm_f32_6x16")
    with pytest.raises(ScheduleError, match="already registered"):
        ti.register(intrin.name, intrin.desc, intrin.impl)
    other = ti.get("x86.amx.gemm_bf16_16x16")
    with pytest.raises(ScheduleError, match="differ"):
        ti.register("test.bad", intrin.desc, other.impl)
    assert {"x86.avx2.gemm_f32_6x16", "x86.amx.gemm_int8_16x16"} <= set(ti.names())


# ---- AMX ----------------------------------------------------------------------------------------
_AMX_KINDS = {"bf16": ("bfloat16", "float32", 2), "int8": ("int8", "int32", 4)}


def _amx_func(kind: str, m: int, n: int, k: int) -> PrimFunc:
    ind, acc, pack = _AMX_KINDS[kind]
    A = te.placeholder((m, k), ind, name="A")
    Bp = te.placeholder((k // pack, n, pack), ind, name="Bp")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(
        tir.cast(acc, A[i, r]) * tir.cast(acc, Bp[r // pack, j, r % pack]), axis=r), name="C")
    return te.create_prim_func([A, Bp, C])


def _amx_schedule(kind: str, m: int, n: int, k: int) -> Schedule:
    sch = Schedule(_amx_func(kind, m, n, k))
    outer = tensorize_gemm_amx(sch, sch.get_block("C"), AMX_TARGET)
    assert sch.get(outer).annotations["kiln.tensor_intrin"] == f"x86.amx.gemm_{kind}_16x16"
    return sch


def _amx_run(kind: str, func: PrimFunc, m: int, n: int, k: int, target=None):
    ind, acc, pack = _AMX_KINDS[kind]
    if kind == "bf16":
        a = RNG.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        b = RNG.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
    else:
        a = RNG.integers(-128, 128, (m, k)).astype(np.int8)
        b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
        ref = a.astype(np.int64) @ b.astype(np.int64)
    bp = np.ascontiguousarray(b.reshape(k // pack, pack, n).transpose(0, 2, 1))  # VNNI
    out = np.zeros((m, n), acc)
    mod = cg.build({"f": func}, target or "c")
    mod["f"](a, bp, out)
    if kind == "bf16":
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    else:
        np.testing.assert_array_equal(out, ref)
    return mod


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_amx_code_compiles(kind):
    sch = _amx_schedule(kind, 32, 16, 96)
    op = {"bf16": "_tile_dpbf16ps", "int8": "_tile_dpbssd"}[kind]
    source, _ = cg.generate_source({"f": sch.func}, "c")
    assert f"{op}(0, 1, 2)" in source and "_tile_loadconfig" in source
    assert "ARCH_REQ_XCOMP_PERM" in source
    mod = cg.build({"f": sch.func}, "c")  # gcc accepts it on any x86-64 host
    if shutil.which("objdump"):
        asm = subprocess.run(["objdump", "-d", str(mod.lib_path)], capture_output=True,
                             text=True).stdout
        assert {"bf16": "tdpbf16ps", "int8": "tdpbssd"}[kind] in asm
        assert "ldtilecfg" in asm


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_amx_intrinsic_semantics(kind):
    """On this host the helper runs its portable path (no AMX permission) or the tiles (AMX):
    either way the layout binding (VNNI B, strides, K remainder) must give A @ B."""
    m, n, k = 32, 48, 80 * _AMX_KINDS[kind][2] // 2  # K/P = 40: two tile chunks + 8 rows
    _amx_run(kind, _amx_schedule(kind, m, n, k).func, m, n, k)


@pytest.mark.skipif(not HOST_AMX, reason="the CPU has no AMX (amx_tile/amx_bf16/amx_int8)")
@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_amx_runs_natively(kind):
    m, n, k = 64, 32, 256
    _amx_run(kind, _amx_schedule(kind, m, n, k).func, m, n, k, target=AMX_TARGET)
    assert amx_permitted()


@pytest.mark.skipif(HOST_AMX, reason="the CPU has AMX: the kernel grants the permission")
def test_amx_permission_refused_is_a_clear_error():
    sch = _amx_schedule("bf16", 16, 16, 32)
    with pytest.raises(AMXPermissionError, match="refused AMX tile data"):
        cg.build({"f": sch.func}, AMX_TARGET)


def test_tensorize_gemm_amx_checks_target_and_dtype():
    sch = Schedule(_amx_func("bf16", 16, 16, 32))
    before = sch.func
    with pytest.raises(ScheduleError, match="target has no AMX bf16"):
        tensorize_gemm_amx(sch, sch.get_block("C"), Target("c", features=frozenset({"avx2"})))
    assert sch.func is before
    sch = Schedule(_matmul(16, 16, 16, dtype="float64"))
    with pytest.raises(ScheduleError, match="accumulator dtype float64"):
        tensorize_gemm_amx(sch, sch.get_block("C"), AMX_TARGET)


def test_target_amx_flags():
    t = Target("c", features=frozenset({"amx_tile", "amx_bf16"}))
    assert t.has_amx and t.has_amx_bf16 and not t.has_amx_int8
    assert not Target("c", features=frozenset({"amx_bf16"})).has_amx_bf16
