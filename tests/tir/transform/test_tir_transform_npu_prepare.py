"""npu_prepare: te-made nests come out in the canonical form the NPU's selector matches --
loops from 0, no branches, one store per innermost nest, contiguous loops merged -- and compute
the same."""

from __future__ import annotations

import numpy as np

from kiln import tir
from kiln.codegen import c as codegen_c
from kiln.testing.tir_testing import check_matmul, loop_func, matmul_func, run_c
from kiln.tir import stmt as S
from kiln.tir.printer import script
from kiln.tir.transform.convert_blocks_to_loops import convert_blocks_to_loops
from kiln.tir.transform.npu_prepare import npu_prepare

RNG = np.random.default_rng(23)


def _stmts(func, cls):
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, cls) else None,
                         exprs=False)
    return out


def _canonical(func):
    for loop in _stmts(func, S.For):
        assert int(loop.min.value) == 0, script(func)
        # a loop body is one store or one loop: one store per nest
        assert isinstance(loop.body, (S.For, S.BufferStore)), script(func)
    assert not _stmts(func, S.IfThenElse), script(func)


def test_matmul_init_is_peeled_into_its_own_nests():
    """The reduction's ``if r == 0: C = 0`` guard: partitioned (the first step peeled), then
    the init and first step fissioned off the rest, the contiguous init merged."""
    func = convert_blocks_to_loops(matmul_func(5, 6, 4))
    got = npu_prepare(func)
    _canonical(got)
    assert "for i_j in range(30)" in script(got), script(got)
    check_matmul(codegen_c.build({"mm": got}), "mm", 5, 6, 4, RNG)


def test_two_outputs_split_and_merge():
    """``for i in [1, 5): for j: Y[i - 1, j] = X[i - 1, j] + 1; Z[i - 1, j] = X[i - 1, j] * 2``
    (two outputs of a fused kernel, an offset loop): shifted, split and each merged."""
    x, y, z = (tir.decl_buffer((4, 6), "float32", n) for n in "XYZ")
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    one, four, six = (tir.IntImm("int64", v) for v in (1, 4, 6))
    body = S.seq(S.BufferStore(y, x[i - 1, j] + 1.0, (i - 1, j)),
                 S.BufferStore(z, x[i - 1, j] * 2.0, (i - 1, j)))
    func = loop_func([x, y, z], S.For(i, one, four, S.ForKind.SERIAL,
                                      S.For(j, tir.IntImm("int64", 0), six, S.ForKind.SERIAL,
                                            body)))
    got = npu_prepare(func)
    _canonical(got)
    assert [int(lp.extent.value) for lp in _stmts(got, S.For)] == [24, 24]
    xv = RNG.standard_normal((4, 6)).astype(np.float32)
    zeros = np.zeros((4, 6), np.float32)
    before, after = run_c(func, [xv, zeros, zeros]), run_c(got, [xv, zeros, zeros])
    np.testing.assert_allclose(before[1], xv + 1, rtol=1e-6)
    np.testing.assert_allclose(before[2], xv * 2, rtol=1e-6)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
