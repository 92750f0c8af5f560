"""matmul_packed: inference, numerics of its register-blocked CPU schedule, and the
alter_layout hooks that turn matmul/dense into it."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te, tir
from kiln.ir.errors import StructInfoError
from kiln.op.layout import transform_array
from kiln.op.registry import get_op_def
from kiln.schedule import lookup_schedule
from kiln.schedule.cpu import matmul_packed as cpu_matmul_packed
from kiln.schedule.cpu.matmul_packed import GEMM_K_UNROLL, GEMM_TILES, gemm_tile, narrow_panel
from kiln.target import Target
from kiln.testing.op_testing import check, dims, infer, make_rand, run_cases, tvar
from kiln.tir.schedule import Schedule
from kiln.transform import AlterOpLayout, FoldConstant

TARGET = Target("c")
GEMM_MR, GEMM_NR = gemm_tile(TARGET)
#: Targets with each register tile, whatever this machine has (the code runs on any x86-64
#: with AVX2: GCC splits wider vector types).
TILE_TARGETS = [Target("c", features=frozenset({"avx2", "fma"})),
                Target("c", features=frozenset({"avx2", "fma", "avx512f"}))]
RNG = np.random.default_rng(7)
rand = make_rand(RNG)
check = functools.partial(check, check_shape=True)


def pack(b: np.ndarray, nb: int = 16) -> np.ndarray:
    """``b [..., K, N]`` -> ``[..., N/nb, K, nb]`` (what the layout rewrite produces)."""
    *batch, k, n = b.shape
    return np.ascontiguousarray(
        b.reshape(*batch, k, n // nb, nb).swapaxes(-3, -2))


def test_pack_is_the_layout_transform():
    b = rand((5, 32))
    np.testing.assert_array_equal(pack(b), transform_array(b, "KN", "NK16n"))
    np.testing.assert_array_equal(pack(b), transform_array(np.ascontiguousarray(b.T), "NK",
                                                           "NK16n"))


def test_inference_and_errors():
    assert dims(infer(op.matmul_packed(tvar("a", (7, 12)), tvar("b", (3, 12, 16))))) == (7, 48)
    out = infer(op.matmul_packed(tvar("a", (2, 1, 7, 12)), tvar("b", (4, 3, 12, 16))))
    assert dims(out) == (2, 4, 7, 48)
    with pytest.raises(StructInfoError, match="columns"):
        infer(op.matmul_packed(tvar("a", (7, 11)), tvar("b", (3, 12, 16))))
    with pytest.raises(StructInfoError, match="at least"):
        infer(op.matmul_packed(tvar("a", (7,)), tvar("b", (3, 12, 16))))


# rows around the register tile's height, tails in rows, batch broadcasting both ways
CASES = [
    ((1, 8), (8, 16)),
    ((GEMM_MR, 20), (20, 32)),
    ((GEMM_MR + 1, 33), (33, 48)),
    ((4 * GEMM_MR - 1, 64), (64, 64)),
    ((128, 96), (96, 128)),
    ((3, 9, 16), (16, 32)),
    ((2, 5, 16), (2, 16, 16)),
    ((1, 7, 8), (3, 8, 32)),
]


def test_matches_numpy():
    cases = [("matmul_packed", [rand(a), pack(rand(b))], {}) for a, b in CASES]
    cases += [("matmul_packed", [rand(a), pack(rand(b), 32)], {}) for a, b in CASES
              if b[-1] % 32 == 0]
    outs = run_cases(cases)
    for (_, (a, b), _), out in zip(cases, outs):
        k, n = b.shape[-2], b.shape[-3] * b.shape[-1]
        unpacked = b.swapaxes(-3, -2).reshape(*b.shape[:-3], k, n)
        check(out, np.matmul(a, unpacked))


def test_schedule_keeps_the_tile_in_a_small_local_buffer():
    from kiln.codegen import c as codegen_c

    a = te.placeholder((64, 32), "float32", name="a")
    bp = te.placeholder((4, 32, GEMM_NR), "float32", name="bp")
    out = get_op_def("matmul_packed").compute(a, bp, attrs=get_op_def("matmul_packed").make_attrs())
    sch = Schedule(te.create_prim_func([a, bp, out]))
    lookup_schedule("matmul_packed", "c")(sch, TARGET)
    mod = codegen_c.build({"mmp": sch.func}, TARGET)
    assert f"matmul_packed_local[{GEMM_MR * GEMM_NR}]" in mod.source
    # the tile's reduction loop is left to GCC to unroll a few steps at a time
    assert f"#pragma GCC unroll {GEMM_K_UNROLL}\n    for (int64_t k = 0; k < 32; ++k)" in mod.source
    x, y = rand((64, 32)), rand((32, 4 * GEMM_NR))
    res = np.zeros((64, 4 * GEMM_NR), "float32")
    mod["mmp"](x, pack(y, GEMM_NR), res)
    check(res, x @ y)


def test_symbolic_rows():
    from kiln.codegen import c as codegen_c

    n = te.size_var("n")
    a = te.placeholder((n, 24), "float32", name="a")
    bp = te.placeholder((2, 24, GEMM_NR), "float32", name="bp")
    out = get_op_def("matmul_packed").compute(a, bp, attrs=get_op_def("matmul_packed").make_attrs())
    sch = Schedule(te.create_prim_func([a, bp, out]))
    lookup_schedule("matmul_packed", "c")(sch, TARGET)
    mod = codegen_c.build({"mmp": sch.func}, TARGET)
    for rows in (1, 5, 13):
        x, y = rand((rows, 24)), rand((24, 2 * GEMM_NR))
        res = np.zeros((rows, 2 * GEMM_NR), "float32")
        mod["mmp"](x, pack(y, GEMM_NR), res)
        check(res, x @ y)


@pytest.mark.parametrize("batch, rows", [((64,), 1), ((5, 3), 3), (("n",), 2), ((2,), "m")])
def test_batch_sharing_one_packed_operand_is_more_rows(batch, rows):
    """``a [..., rows, K]`` against a packed operand without batch dims (an RNN's input
    projection: every time step times one weight) is one GEMM of ``prod(batch) * rows`` rows,
    not one tiny product per batch entry: the batch and row loops are fused, the fused loop is
    tiled like any row loop (tiles cross batch entries), and a fused consumer reading another
    batched tensor still lines up; symbolic batches too. A symbolic row count keeps its batch
    loops (a row's batch index would not be affine in the fused loop)."""
    from kiln.codegen import c as codegen_c

    k, panels = 24, 3
    shape = tuple(te.size_var(d) if isinstance(d, str) else d for d in (*batch, rows)) + (k,)
    a = te.placeholder(shape, "float32", name="a")
    bp = te.placeholder((panels, k, GEMM_NR), "float32", name="bp")
    add = te.placeholder(shape[:-1] + (panels * GEMM_NR,), "float32", name="add")
    opdef = get_op_def("matmul_packed")
    prod = opdef.compute(a, bp, attrs=opdef.make_attrs())
    out = te.compute(prod.shape, lambda *i: prod(*i) + add(*i), name="plus")
    sch = Schedule(te.create_prim_func([a, bp, add, out]))
    lookup_schedule(opdef.name, "c")(sch, Target("c", num_threads=2))
    names = [sch.get(lp).loop_var.name for lp in sch.get_loops(sch.get_block("matmul_packed"))]
    fused = not any(n.startswith(("i0", "i1")) and "fused" not in n for n in names)
    assert fused == (rows != "m"), names
    mod = codegen_c.build({"mmp": sch.func}, TARGET)
    for n in (1, 7) if "n" in batch or rows == "m" else (None,):
        dims_ = tuple(n if isinstance(d, str) else d for d in (*batch, rows))
        x, y = rand(dims_ + (k,)), rand((k, panels * GEMM_NR))
        z = rand(dims_ + (panels * GEMM_NR,))
        res = np.zeros_like(z)
        mod["mmp"](x, pack(y, GEMM_NR), z, res)
        check(res, x @ y + z)


@pytest.mark.parametrize("rows, per_panel", [(64, True), (2048, False)])
def test_fused_consumers_run_per_panel_when_it_fits(rows, per_panel):
    """A bias + ReLU fused after the product runs once per column panel from a panel-sized
    buffer (up to GEMM_PANEL_EPILOGUE_BYTES), else per register tile; both compute it."""
    from kiln.codegen import c as codegen_c

    k = 24
    a = te.placeholder((rows, k), "float32", name="a")
    bp = te.placeholder((2, k, GEMM_NR), "float32", name="bp")
    bias = te.placeholder((2 * GEMM_NR,), "float32", name="bias")
    opdef = get_op_def("matmul_packed")
    prod = opdef.compute(a, bp, attrs=opdef.make_attrs())
    out = te.compute(prod.shape, lambda i, j: tir.max(prod[i, j] + bias[j],
                                                      tir.const("float32", 0.0)), name="relu")
    sch = Schedule(te.create_prim_func([a, bp, bias, out]))
    lookup_schedule(opdef.name, "c")(sch, Target("c", num_threads=2))
    relu_loops = sch.get_loops(sch.get_block("relu"))
    gemm_loops = sch.get_loops(sch.get_block("matmul_packed"))
    # the consumer shares only the panel loop with the product, or also its row-block loop
    shared = sum(1 for x, y in zip(relu_loops, gemm_loops) if sch.get(x) is sch.get(y))
    assert shared == (1 if per_panel else 2)
    mod = codegen_c.build({"mmp": sch.func}, TARGET)
    x, y, b = rand((rows, k)), rand((k, 2 * GEMM_NR)), rand((2 * GEMM_NR,))
    res = np.zeros((rows, 2 * GEMM_NR), "float32")
    mod["mmp"](x, pack(y, GEMM_NR), b, res)
    check(res, np.maximum(x @ y + b, 0))


def test_row_blocks_divide_the_tiles_and_fit_the_budget():
    # 2048 rows of 2048 float32 in tiles of 8 rows: 1 MiB holds 16 tiles; 256 / 16 blocks
    assert cpu_matmul_packed.row_block_tiles(2048, 8, 2048, 4) == 16
    # 342 tiles of 6 rows: 21 fit, 19 divides 342
    assert cpu_matmul_packed.row_block_tiles(2048, 6, 2048, 4) == 19
    # everything fits: one block; unknown sizes: one block
    assert cpu_matmul_packed.row_block_tiles(128, 8, 768, 4) is None
    assert cpu_matmul_packed.row_block_tiles(None, 8, 2048, 4) is None
    # 2 * 127 tiles: no divisor near the 64 that fit, no blocks rather than tiny ones
    assert cpu_matmul_packed.row_block_tiles(8 * 254, 8, 512, 4) is None


@pytest.mark.parametrize("target", TILE_TARGETS, ids=["avx2", "avx512"])
@pytest.mark.parametrize("rows", [240, 235])
def test_row_blocks_with_fused_consumers_match_numpy(rows, target, monkeypatch):
    """With the rows cut into blocks (a small block budget here), every panel passes under
    each block; a fused bias + ReLU still sees every row once, tails included."""
    from kiln.codegen import c as codegen_c

    monkeypatch.setattr(cpu_matmul_packed, "GEMM_ROW_BLOCK_BYTES", 16 * 1024)
    mr, nr = gemm_tile(target)
    k = 64
    assert cpu_matmul_packed.row_block_tiles(rows, mr, k, 4) is not None
    a = te.placeholder((rows, k), "float32", name="a")
    bp = te.placeholder((3, k, nr), "float32", name="bp")
    bias = te.placeholder((3 * nr,), "float32", name="bias")
    opdef = get_op_def("matmul_packed")
    prod = opdef.compute(a, bp, attrs=opdef.make_attrs())
    out = te.compute(prod.shape, lambda i, j: tir.max(prod[i, j] + bias[j],
                                                      tir.const("float32", 0.0)), name="relu")
    sch = Schedule(te.create_prim_func([a, bp, bias, out]))
    lookup_schedule(opdef.name, "c")(sch, target)
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_block("matmul_packed"))]
    assert loops[0].kind == tir.ForKind.PARALLEL  # the row blocks (and panels), in parallel
    mod = codegen_c.build({"mmp": sch.func}, TARGET)
    x, y, b = rand((rows, k)), rand((k, 3 * nr)), rand((3 * nr,))
    res = np.zeros((rows, 3 * nr), "float32")
    mod["mmp"](x, pack(y, nr), b, res)
    check(res, np.maximum(x @ y + b, 0))


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_few_rows_run_several_panels_at_once(rows):
    """A tile of all of 1-3 rows has 2-6 accumulators per panel, too few for the FMA pipes:
    the panels run jammed a few at a time (each its own accumulators, one reduction loop),
    with the fused bias + ReLU; the result is numpy's."""

    from kiln.codegen import c as codegen_c
    from kiln.tir.transform.lower import lower

    mp = cpu_matmul_packed
    assert [mp._panels_at_once(m, m, 2, 8) for m in (1, 2, 3, 4)] == [4, 2, 2, None]
    assert mp._panels_at_once(1, 1, 2, 6) == 3 and mp._panels_at_once(1, 1, 2, 1) is None
    assert mp._panels_at_once(None, 6, 2, 8) is None and mp._panels_at_once(64, 6, 2, 8) is None
    k, panels = 40, 8
    a = te.placeholder((rows, k), "float32", name="a")
    bp = te.placeholder((panels, k, GEMM_NR), "float32", name="bp")
    bias = te.placeholder((panels * GEMM_NR,), "float32", name="bias")
    opdef = get_op_def("matmul_packed")
    prod = opdef.compute(a, bp, attrs=opdef.make_attrs())
    out = te.compute(prod.shape, lambda i, j: tir.max(prod[i, j] + bias[j],
                                                      tir.const("float32", 0.0)), name="relu")
    sch = Schedule(te.create_prim_func([a, bp, bias, out]))
    target = Target("c", num_threads=2)
    lookup_schedule(opdef.name, "c")(sch, target)
    allocs = []
    tir.post_order_visit(lower(sch.func).body, lambda n: allocs.append(n.buffer.name)
                         if isinstance(n, tir.Allocate) else None)
    assert "matmul_packed_local_j1" in allocs
    mod = codegen_c.build({"mmp": sch.func}, target)
    x, y, b = rand((rows, k)), rand((k, panels * GEMM_NR)), rand((panels * GEMM_NR,))
    res = np.zeros((rows, panels * GEMM_NR), "float32")
    mod["mmp"](x, pack(y, GEMM_NR), b, res)
    check(res, np.maximum(x @ y + b, 0))


# ---------------------------------------------------------------------------------------------
# alter_layout: matmul / dense -> matmul_packed
# ---------------------------------------------------------------------------------------------
def _ops(func):
    return [b.value.op.name for blk in func.body.blocks for b in blk.bindings
            if isinstance(b.value, g.Call)]


def _module(x_shape, make):
    x = g.Var("x", g.TensorStructInfo(x_shape, "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make(x))
        bb.emit_func_output(out)
    return bb.get()


def _altered(mod, target=TARGET):
    from kiln.transform import FoldConstant

    return FoldConstant()(AlterOpLayout(target)(mod))


def test_tile_follows_the_vector_length(monkeypatch):
    monkeypatch.delenv("KILN_VECTOR_BITS", raising=False)  # the override would win
    assert [gemm_tile(t) for t in TILE_TARGETS] == [GEMM_TILES[8], GEMM_TILES[16]]


@pytest.mark.parametrize("target", TILE_TARGETS, ids=["avx2", "avx512"])
def test_each_tile_packs_and_matches_numpy(target, monkeypatch):
    """Both register tiles, whatever this machine has: the panel width and row count follow
    the target's vector length; row counts around the tile's height, with a fused epilogue."""
    monkeypatch.delenv("KILN_VECTOR_BITS", raising=False)  # the override would win
    rows, cols = gemm_tile(target)
    w, bias = rand((40, 4 * cols)), rand((4 * cols,))
    for m in (1, rows - 1, rows + 3, 3 * rows):
        mod = _module((m, 40), lambda x: op.nn.relu(op.add(op.matmul(x, g.const(w)),
                                                           g.const(bias))))
        after = FoldConstant()(AlterOpLayout(target)(mod))
        packed = [c for blk in after["main"].body.blocks for c in blk.bindings
                  if isinstance(c.value, g.Call) and c.value.op.name == "matmul_packed"]
        assert packed and packed[0].value.args[1].struct_info.shape[-1].value == cols
        x = rand((m, 40))
        check(np.asarray(kiln.build(mod, target=target)(x)), np.maximum(x @ w + bias, 0))


def test_constant_weight_is_packed_at_compile_time():
    w = rand((32, 64))
    bias = rand((64,))
    mod = _module((16, 32), lambda x: op.nn.relu(op.add(op.matmul(x, g.const(w)),
                                                         g.const(bias))))
    after = _altered(mod)
    assert _ops(after["main"]) == ["matmul_packed", "add", "relu"]
    x = rand((16, 32))
    out = kiln.build(mod)(x)
    check(np.asarray(out), np.maximum(x @ w + bias, 0))


def test_computed_weight_gets_a_runtime_layout_transform():
    w = rand((64, 32))
    x_shape = (24, 32)  # two register tiles of rows: packing a computed weight pays
    xw = g.Var("w", g.TensorStructInfo((64, 32), "float32"))
    x = g.Var("x", g.TensorStructInfo(x_shape, "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x, xw]):
        with bb.dataflow():
            out = bb.emit_output(op.dense(x, xw))
        bb.emit_func_output(out)
    mod = bb.get()
    assert _ops(_altered(mod)["main"]) == ["layout_transform", "matmul_packed"]
    xv = rand(x_shape)
    check(np.asarray(kiln.build(mod)(xv, w)), xv @ w.T)


def test_declined_shapes_stay_matmul():
    # columns not a multiple of the panel width
    w = rand((32, 40))
    mod = _module((16, 32), lambda x: op.matmul(x, g.const(w)))
    assert _ops(_altered(mod)["main"]) == ["matmul"]
    # a computed right operand with few rows: packing it at run time does not pay
    x = g.Var("x", g.TensorStructInfo((4, 32), "float32"))
    wv = g.Var("w", g.TensorStructInfo((32, 64), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x, wv]):
        with bb.dataflow():
            out = bb.emit_output(op.matmul(x, wv))
        bb.emit_func_output(out)
    assert _ops(_altered(bb.get())["main"]) == ["matmul"]


def test_matrix_vector_product_with_constant_weight_is_packed():
    w = rand((64, 64))
    mod = _module((1, 64), lambda x: op.matmul(x, g.const(w)))
    assert _ops(_altered(mod)["main"]) == ["matmul_packed"]
    x = rand((1, 64))
    check(np.asarray(kiln.build(mod)(x)), x @ w)


@pytest.mark.parametrize("target", TILE_TARGETS, ids=["avx2", "avx512"])
def test_few_rows_with_a_constant_weight_pack_narrow_panels(target, monkeypatch):
    """Columns the tile's width does not divide (a 1280 -> 1000 classifier): under fewer rows
    than a tile a constant weight is still packed, in the widest panel of whole (half)
    vectors that divides them; with no such panel, or a full tile of rows, it stays matmul."""
    monkeypatch.delenv("KILN_VECTOR_BITS", raising=False)  # the override would win
    rows, cols = gemm_tile(target)
    n = 1000  # a multiple of 8, not of the tile's columns nor of 16
    assert narrow_panel(n, target) == 8
    assert narrow_panel(10, target) is None
    w, bias = rand((48, n)), rand((n,))
    for m in (1, rows - 1):
        mod = _module((m, 48), lambda x: op.add(op.matmul(x, g.const(w)), g.const(bias)))
        after = FoldConstant()(AlterOpLayout(target)(mod))
        packed = [c for blk in after["main"].body.blocks for c in blk.bindings
                  if isinstance(c.value, g.Call) and c.value.op.name == "matmul_packed"]
        assert packed and packed[0].value.args[1].struct_info.shape[-1].value == 8
        x = rand((m, 48))
        check(np.asarray(kiln.build(mod, target=target)(x)), x @ w + bias)
    for m, width in ((rows, n), (1, 10)):
        mod = _module((m, 48), lambda x, width=width: op.matmul(x, g.const(w[:, :width])))
        assert _ops(FoldConstant()(AlterOpLayout(target)(mod))["main"]) == ["matmul"]


def test_weight_bound_to_a_variable_is_packed_once_for_all_its_users():
    """FoldConstant leaves a folded weight as a variable bound to a Constant (an ONNX RNN's
    recurrent weight, sliced per direction, read by every time step): the layout hook sees the
    Constant, so even one-row products are packed at compile time, and all of them read one
    packed copy."""
    w = rand((2 * GEMM_NR, 64))  # dense's [units, in]
    x = g.Var("x", g.TensorStructInfo((1, 64), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            wv = bb.emit(g.const(w))
            h = x
            for _ in range(3):
                y = bb.emit(op.dense(h, wv))
                h = bb.emit(op.tanh(op.strided_slice(y, (0,), (64,), axes=(1,))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    mod = bb.get()
    after = _altered(mod)["main"]
    assert [n for n in _ops(after) if n != "tanh" and n != "strided_slice"] == ["matmul_packed"] * 3
    packed = {id(b.value.args[1]) if isinstance(b.value.args[1], g.Constant) else None
              for blk in after.body.blocks for b in blk.bindings
              if isinstance(b.value, g.Call) and b.value.op.name == "matmul_packed"}
    assert len(packed) == 1 and None not in packed
    xs = rand((1, 64))
    ref = xs
    for _ in range(3):
        ref = np.tanh((ref @ w.T)[:, :64])
    check(np.asarray(kiln.build(mod)(xs)), ref)


def test_symbolic_rows_are_packed_and_run_at_any_batch():
    n = tir.Var("n", "int64")
    w = rand((32, 64))
    mod = _module((n, 32), lambda x: op.matmul(x, g.const(w)))
    assert _ops(_altered(mod)["main"]) == ["matmul_packed"]
    exe = kiln.build(mod)
    for rows in (1, 7, 30):
        x = rand((rows, 32))
        check(np.asarray(exe(x)), x @ w)


def test_batched_attention_style_product():
    """A computed right operand with batch dims (q @ k^T in attention) is packed per batch."""
    q = g.Var("q", g.TensorStructInfo((2, 3, 24, 8), "float32"))
    k = g.Var("k", g.TensorStructInfo((2, 3, 8, 32), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [q, k]):
        with bb.dataflow():
            out = bb.emit_output(op.matmul(q, k))
        bb.emit_func_output(out)
    mod = bb.get()
    assert _ops(_altered(mod)["main"]) == ["layout_transform", "matmul_packed"]
    qv, kv = rand((2, 3, 24, 8)), rand((2, 3, 8, 32))
    check(np.asarray(kiln.build(mod)(qv, kv)), qv @ kv)


# ---------------------------------------------------------------------------------------------
# matmul_vnni: bfloat16 / int8 products on AMX targets
# ---------------------------------------------------------------------------------------------
AMX_TARGET = Target("c", features=frozenset({"amx_tile", "amx_bf16", "amx_int8", "avx2"}))


def _bf16(shape):
    import ml_dtypes

    return RNG.standard_normal(shape).astype(ml_dtypes.bfloat16)


def _bf16_dense_module(x_shape, w, out_dtype="float32"):
    return _module_typed(x_shape, "bfloat16",
                         lambda x: op.dense(x, g.const(w), out_dtype=out_dtype))


def _module_typed(x_shape, dtype, make):
    x = g.Var("x", g.TensorStructInfo(x_shape, dtype))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make(x))
        bb.emit_func_output(out)
    return bb.get()


def test_amx_target_packs_bf16_weights_in_vnni_layout():
    from kiln.transform import FoldConstant

    w = _bf16((32, 64))  # dense weight [N, K]
    mod = _bf16_dense_module((2, 16, 64), w)
    after = FoldConstant()(AlterOpLayout(AMX_TARGET)(mod))
    assert _ops(after["main"]) == ["reshape", "matmul_vnni", "reshape"]
    # no AMX (named: the machine running the tests may have it): the float32 path's hook
    # declines bfloat16, the op stays
    assert "matmul_vnni" not in _ops(_altered(mod, TILE_TARGETS[0])["main"])
    # the rewritten graph runs on this CPU (generic schedule) and matches numpy
    x = _bf16((2, 16, 64))
    out = np.asarray(kiln.build(after, target=TARGET)(x))
    ref = x.astype(np.float32) @ w.astype(np.float32).T
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("x_shape, n, out_dtype", [
    ((8, 64), 32, "float32"),     # rows not a whole tile
    ((16, 64), 24, "float32"),    # columns not a whole tile
    ((16, 64), 32, None),         # bfloat16 result: not the float32-accumulating form
])
def test_amx_declines_partial_tiles(x_shape, n, out_dtype):
    mod = _bf16_dense_module(x_shape, _bf16((n, 64)), out_dtype=out_dtype)
    assert "matmul_vnni" not in _ops(AlterOpLayout(AMX_TARGET)(mod)["main"])


def test_amx_schedule_emits_tile_instructions():
    from kiln.codegen import c as codegen_c

    a = te.placeholder((32, 64), "bfloat16", name="a")
    bp = te.placeholder((32, 32, 2), "bfloat16", name="bp")
    d = get_op_def("matmul_vnni")
    out = d.compute(a, bp, attrs=d.make_attrs(out_dtype="float32"))
    sch = Schedule(te.create_prim_func([a, bp, out]))
    lookup_schedule(d.name, "c")(sch, AMX_TARGET)
    source, _ = codegen_c.generate_source({"mmv": sch.func}, AMX_TARGET)
    assert "_tile_dpbf16ps" in source and "_tile_loadconfig" in source


def test_vnni_inference_errors():
    with pytest.raises(StructInfoError, match="packs"):
        infer(op.matmul_vnni(tvar("a", (16, 30), "bfloat16"),
                             tvar("b", (16, 16, 2), "bfloat16"), out_dtype="float32"))
    assert dims(infer(op.matmul_vnni(tvar("a", (16, 32), "bfloat16"),
                                     tvar("b", (16, 48, 2), "bfloat16"),
                                     out_dtype="float32"))) == (16, 48)
