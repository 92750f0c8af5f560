"""permute_layouts: a block's PERMUTE_LAYOUT annotation reorders the digits of one axis of the
buffer it writes, for every access (the copy that fills a shared tile and the loads that read
it): the index map against numpy, the same results on OpenCL (PoCL) whatever the layout, the
stored addresses actually permuted, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import tir
from kiln.arith.analyzer import simplify as simplify_expr
from kiln.codegen.gpu.build import build as gpu_build
from kiln.ir.errors import LoweringError
from kiln.target import Target
from kiln.testing.tir_testing import elementwise_func
from kiln.tir import Schedule
from kiln.tir.expr import IntImm, Var, const
from kiln.tir.stmt import BufferStore
from kiln.tir.transform import lower
from kiln.tir.transform.permute_layout import PERMUTE_LAYOUT, permuted_index

OPENCL = Target("opencl")
RNG = np.random.default_rng(3)


@pytest.mark.parametrize("radices,order", [
    ((2, 8, 4, 2), (0, 2, 3, 1)),   # the mma row order of 2 warps, MI = 4
    ((4, 8), (1, 0)),                # a transposition of 4 x 8
    ((3, 5), (0, 1)),                # the identity
])
def test_permuted_index_is_the_digit_reordering(radices, order):
    n = int(np.prod(radices))
    x = Var("x", "int64")
    expr = permuted_index(x, radices, order)
    got = [int(simplify_expr(tir.substitute(expr, {x: const("int64", i)})).value)
           for i in range(n)]
    # numpy: element i of the axis sits at the position of its digits transposed
    expect = np.arange(n).reshape(radices).transpose(order).reshape(-1)
    where = np.empty(n, int)
    where[expect] = np.arange(n)
    assert got == where.tolist()
    assert sorted(got) == list(range(n))


def _tile(layout) -> Schedule:
    """out = x + 1 for 64 x 128 float32, each block's 8 x 32 tile staged in shared memory
    (the copy shared by 32 threads), the tile's layout permuted by ``layout``."""
    sch = Schedule(elementwise_func((64, 128), "float32", lambda x: x + 1.0))
    blk = sch.get_block("out")
    i, j = sch.get_loops(blk)
    jo, ji = sch.split(j, [None, 32])
    io, ii = sch.split(i, [None, 8])
    sch.reorder(jo, ji, io, ii)
    sch.bind(jo, "blockIdx.x")
    sch.bind(ji, "threadIdx.x")
    copy = sch.cache_read(blk, 0, "shared")
    sch.compute_at(copy, io, cooperative=True)
    a, b = sch.get_loops(copy)[-2:]
    _, tx = sch.split(sch.fuse(a, b), [None, 32])
    sch.bind(tx, "threadIdx.x")
    if layout is not None:
        sch.annotate(copy, PERMUTE_LAYOUT, layout)
    return sch


def _shared_store_indices(func) -> list[str]:
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(str(n.indices[0])) if isinstance(
        n, BufferStore) and n.buffer.scope == "shared" else None)
    return out


@pytest.mark.parametrize("layout", [None, (-2, (2, 4), (1, 0)), (0, (4, 2), (1, 0)),
                                    (-1, (4, 2, 4), (2, 0, 1)), (1, (32,), (0,)),
                                    ((-2, -1), (8, 4, 8), (1, 0, 2))])  # panels of 8 columns
def test_any_layout_computes_the_same_values(layout):
    lowered = lower(_tile(layout).func, OPENCL)
    (index,) = _shared_store_indices(lowered)
    assert ("//" in index or "%" in index) == (layout is not None and len(layout[1]) > 1)
    x = RNG.standard_normal((64, 128)).astype("float32")
    out = np.full_like(x, np.nan)
    gpu_build({"f": lowered}, OPENCL)["f"](x, out)
    np.testing.assert_array_equal(out, x + 1.0)


@pytest.mark.parametrize("layout,why", [
    ((-2, (2, 2), (1, 0)), "do not make its axis"),
    ((-2, (2, 4), (0, 0)), "not a permutation"),
    ((2, (8,), (0,)), "has no axis 2"),
    (((-1, -2), (8, 32), (1, 0)), "not consecutive"),
    (((0, 1), (8, 4, 4), (1, 0, 2)), "do not make its axis"),
])
def test_bad_layouts_are_refused(layout, why):
    with pytest.raises(LoweringError, match=why):
        lower(_tile(layout).func, OPENCL)


def test_intimm_radices_are_accepted():
    """Annotations may hold IR integers (what a printed and parsed schedule gives back)."""
    layout = (IntImm("int64", -2), (IntImm("int64", 2), 4), (1, 0))
    lowered = lower(_tile(layout).func, OPENCL)
    x = RNG.standard_normal((64, 128)).astype("float32")
    out = np.full_like(x, np.nan)
    gpu_build({"f": lowered}, OPENCL)["f"](x, out)
    np.testing.assert_array_equal(out, x + 1.0)

