"""Scheduled functions still compute the same thing: lowered, compiled to C, run, vs numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as cg
from kiln.ir.errors import ScheduleError
from kiln.tir import Schedule

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


def _run(func, *arrays):
    mod = cg.build({"f": func}, "c")
    mod["f"](*arrays)
    return arrays[-1]


def _matmul(n, m, p, relu=False):
    A = te.placeholder((n, p), "float32", name="A")
    B = te.placeholder((p, m), "float32", name="B")
    k = te.reduce_axis((0, p), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    if not relu:
        return te.create_prim_func([A, B, C])
    D = te.compute((n, m), lambda i, j: tir.max(C[i, j], tir.const("float32", 0.0)), name="D")
    return te.create_prim_func([A, B, D])


def _schedule_matmul(sch: Schedule, tile: int = 8) -> None:
    """split + reorder + cache_write + decompose_reduction + parallel + vectorize."""
    c = sch.get_block("C")
    cw = sch.cache_write(c, 0, "local")
    i, j, k = sch.get_loops(c)
    i0, i1 = sch.split(i, factors=[None, tile])
    j0, j1 = sch.split(j, factors=[None, tile])
    k0, k1 = sch.split(k, factors=[None, 4])
    sch.reorder(i0, j0, k0, i1, k1, j1)
    sch.reverse_compute_at(cw, j0)
    sch.decompose_reduction(c, k0)
    sch.parallel(i0)
    sch.vectorize(j1)
    sch.unroll(k1)


@pytest.mark.parametrize("shape", [(32, 48, 40), (30, 21, 13)])
def test_scheduled_matmul_matches_numpy(shape):
    n, m, p = shape
    sch = Schedule(_matmul(n, m, p))
    _schedule_matmul(sch)
    a = RNG.standard_normal((n, p), dtype=np.float32)
    b = RNG.standard_normal((p, m), dtype=np.float32)
    out = _run(sch.func, a, b, np.zeros((n, m), np.float32))
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_matmul_relu_tiled_with_compute_at_and_cache_read():
    n = 24
    sch = Schedule(_matmul(n, n, n, relu=True))
    c, d = sch.get_block("C"), sch.get_block("D")
    i, j = sch.get_loops(d)
    i0, i1 = sch.split(i, factors=[None, 8])
    j0, j1 = sch.split(j, factors=[None, 8])
    sch.reorder(i0, j0, i1, j1)
    sch.compute_at(c, j0)
    cr = sch.cache_read(c, 1, "local")  # B tile
    sch.compute_at(cr, j0)
    sch.decompose_reduction(c, sch.get_loops(c)[-1])
    sch.vectorize(j1)  # (not parallel: the tiles share the full-size B_local)
    a = RNG.standard_normal((n, n), dtype=np.float32)
    b = RNG.standard_normal((n, n), dtype=np.float32)
    out = _run(sch.func, a, b, np.zeros((n, n), np.float32))
    np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)


def test_inlined_elementwise_chain_matches_numpy():
    shape = (13, 37)
    A = te.placeholder(shape, "float32", name="A")
    B = te.compute(shape, lambda i, j: tir.exp(A[i, j]), name="B")
    C = te.compute(shape, lambda i, j: B[i, j] * 2.0 + A[i, j], name="C")
    D = te.compute(shape, lambda i, j: C[i, j] - 1.0, name="D")
    E = te.compute(shape, lambda i, j: tir.sqrt(tir.fabs(D[i, j])), name="E")
    sch = Schedule(te.create_prim_func([A, E]))
    sch.compute_inline(sch.get_block("B"))
    sch.compute_inline(sch.get_block("C"))
    sch.reverse_compute_inline(sch.get_block("E"))
    (blk,) = sch.get_child_blocks(sch.get_block("root"))
    i, j = sch.get_loops(blk)
    fused = sch.fuse(i, j)
    outer, inner = sch.split(fused, factors=[None, 8])  # 481 = 61 * 8 - 7: predicated tail
    sch.parallel(outer)
    a = RNG.standard_normal(shape, dtype=np.float32)
    out = _run(sch.func, a, np.zeros(shape, np.float32))
    np.testing.assert_allclose(out, np.sqrt(np.abs(np.exp(a) * 2 + a - 1)), rtol=1e-5)


def test_stencil_compute_at_with_predicates():
    # padded 1-D convolution: P is computed per tile of C, with overlap and a partial last tile
    n = 19
    A = te.placeholder((n,), "float32", name="A")
    W = te.placeholder((3,), "float32", name="W")
    P = te.compute((n + 2,), lambda i: te.if_then_else(
        tir.logical_and(i >= 1, i < n + 1), A[i - 1], tir.const("float32", 0.0)), name="P")
    r = te.reduce_axis((0, 3), name="r")
    C = te.compute((n,), lambda i: te.sum(P[i + r] * W[r], axis=r), name="C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    i, _ = sch.get_loops(sch.get_block("C"))
    i0, _ = sch.split(i, factors=[None, 4])
    sch.compute_at(sch.get_block("P"), i0)
    a = RNG.standard_normal((n,), dtype=np.float32)
    w = RNG.standard_normal((3,), dtype=np.float32)
    out = _run(sch.func, a, w, np.zeros((n,), np.float32))
    padded = np.pad(a, 1)
    np.testing.assert_allclose(out, np.convolve(padded, w[::-1], "valid"), rtol=1e-5,
                               atol=1e-5)


def test_symbolic_shape_compute_at_and_split_tail():
    n = te.size_var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((n,), lambda i: B[i] + 1.0, name="C")
    sch = Schedule(te.create_prim_func([A, C]))
    (i,) = sch.get_loops(sch.get_block("C"))
    i0, _ = sch.split(i, factors=[None, 8])
    sch.compute_at(sch.get_block("B"), i0)
    mod = cg.build({"f": sch.func}, "c")
    for size in (8, 21):
        a = RNG.standard_normal((size,), dtype=np.float32)
        out = np.zeros((size,), np.float32)
        mod["f"](a, out)
        np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)


def test_cache_write_in_float32_sums_half_products_in_float32():
    """``cache_write(C, 0, "local", "float32")`` of a float16 product: the accumulator is
    float32, the result rounded once (float16 sums of 2048 products drift far from it)."""
    n, p = 8, 2048
    A = te.placeholder((n, p), "float16", name="A")
    B = te.placeholder((p, n), "float16", name="B")
    k = te.reduce_axis((0, p), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    copy = sch.cache_write(sch.get_block("C"), 0, "local", "float32")
    assert str(sch.get(sch.get_block("C")).writes[0].buffer.dtype) == "float32"
    assert str(sch.get(copy).writes[0].buffer.dtype) == "float16"  # rounded at the copy
    a = RNG.uniform(-1, 1, (n, p)).astype("float16")
    b = RNG.uniform(-1, 1, (p, n)).astype("float16")
    exact = a.astype("float64") @ b.astype("float64")
    wide = _run(sch.func, a, b, np.zeros((n, n), "float16")).astype("float64")
    narrow = _run(te.create_prim_func([A, B, C]), a, b, np.zeros((n, n), "float16"))
    assert np.abs(wide - exact).max() <= 2 ** -10 * np.abs(exact).max()
    assert np.abs(narrow.astype("float64") - exact).max() > 4 * np.abs(wide - exact).max()


@pytest.mark.parametrize("have,want", [("float32", "float16"), ("int32", "int64"),
                                       ("float16", "int32"), ("float32", "nonsense")])
def test_cache_write_refuses_a_dtype_that_is_not_a_wider_float(have, want):
    A = te.placeholder((4,), have, name="A")
    C = te.compute((4,), lambda i: A[i] + A[i], name="C")
    sch = Schedule(te.create_prim_func([A, C]))
    with pytest.raises(ScheduleError, match="cache_write"):
        sch.cache_write(sch.get_block("C"), 0, "local", want)
