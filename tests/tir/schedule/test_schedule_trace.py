"""Handles (BlockRV/LoopRV), queries, the trace: printing, replay, and state safety."""

import pytest
from tir_schedule_builders import (
    buf,
    chain,
    ew_block,
    f32,
    loops,
    matmul,
    matmul_relu,
    prim_func,
    realize,
    vars_,
)

from kiln import te, tir
from kiln.ir import ScheduleError, assert_structural_equal, structural_equal
from kiln.tir import BlockRV, LoopRV, Schedule, Trace


def _te_matmul_relu(n=32):
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((n, n), lambda i, j: tir.max(C[i, j], tir.const("float32", 0.0)), name="D")
    return te.create_prim_func([A, B, D])


def _full_schedule(sch: Schedule) -> None:
    """Every kind of primitive, in an order a CPU schedule would use."""
    c, d = sch.get_block("C"), sch.get_block("D")
    i, j = sch.get_loops(d)
    i0, i1 = sch.split(i, factors=[None, 8])
    j0, j1 = sch.split(j, factors=[None, 8])
    sch.reorder(i0, j0, i1, j1)
    sch.compute_at(c, j0)
    sch.cache_write(c, 0, "local")
    _, _, ci, cj, ck = sch.get_loops(c)
    sch.reorder(ck, ci, cj)
    sch.decompose_reduction(c, ck)
    cr = sch.cache_read(c, 2, "local")
    sch.compute_at(cr, ck)
    f = sch.fuse(i0, j0)
    sch.parallel(f)
    sch.vectorize(j1)
    sch.unroll(sch.get_loops(c)[-1])
    sch.annotate(c, "note", "tiled")


def test_trace_prints_python():
    f, _ = matmul()
    sch = Schedule(f)
    b = sch.get_block("C")
    i, j, k = sch.get_loops(b)
    i0, i1 = sch.split(i, factors=[None, 4])
    sch.reorder(i0, j, i1)
    fused = sch.fuse(i0, j)
    sch.parallel(fused)
    cw = sch.cache_write(b, 0, "local")
    sch.reverse_compute_at(cw, fused, preserve_unit_loops=True)
    (loop,) = sch.get_loops(sch.get_block("C_local"))[:1]
    sch.annotate(b, "key", "value")
    sch.decompose_reduction(b, i1)
    assert str(sch.trace) == "\n".join([
        'b0 = sch.get_block(name="C")',
        "l1, l2, l3 = sch.get_loops(block=b0)",
        "l4, l5 = sch.split(loop=l1, factors=[None, 4])",
        "sch.reorder(l4, l2, l5)",
        "l6 = sch.fuse(l4, l2)",
        "sch.parallel(loop=l6)",
        'b7 = sch.cache_write(block=b0, write_buffer_index=0, storage_scope="local")',
        "sch.reverse_compute_at(block=b7, loop=l6, preserve_unit_loops=True)",
        'b8 = sch.get_block(name="C_local")',
        "l9, l10, l11 = sch.get_loops(block=b8)",
        'sch.annotate(block_or_loop=b0, key="key", value="value")',
        "b12 = sch.decompose_reduction(block=b0, loop=l5)",
    ])
    del loop


def test_instruction_fields():
    f, _ = matmul()
    sch = Schedule(f)
    b = sch.get_block("C")
    i, j, k = sch.get_loops(b)
    outs = sch.split(i, factors=[2, None])
    inst = sch.trace.insts[-1]
    assert inst.kind == "split"
    assert inst.inputs == (i,)
    assert inst.attrs == {"factors": [2, None]}
    assert list(inst.outputs) == outs
    assert all(isinstance(x, LoopRV) for x in inst.outputs)


def test_replay_gives_equal_function():
    sch = Schedule(_te_matmul_relu())
    _full_schedule(sch)
    fresh = _te_matmul_relu()  # a new, structurally equal function
    assert not structural_equal(sch.func, fresh)
    replayed = sch.trace.apply_to_schedule(Schedule(fresh))
    assert_structural_equal(replayed.func, sch.func)
    assert str(replayed.trace) == str(sch.trace)


def test_replay_of_a_replayed_trace_and_copy():
    f, _ = matmul_relu()
    sch = Schedule(f)
    _full_schedule(sch)
    again = Trace(list(sch.trace)).apply_to_schedule(Schedule(matmul_relu()[0]))
    assert_structural_equal(again.func, sch.func)


def test_replay_on_a_different_function_fails_clearly():
    f, _ = matmul_relu()
    sch = Schedule(f)
    _full_schedule(sch)
    other, _ = chain()
    with pytest.raises(ScheduleError, match="trace replay failed at instruction 1 .*get_block.*"
                                             "no block named 'D'"):
        sch.trace.apply_to_schedule(Schedule(other))


def test_handles_stay_valid_across_transformations():
    f, _ = matmul_relu()
    sch = Schedule(f)
    c, d = sch.get_block("C"), sch.get_block("D")
    i, j = sch.get_loops(d)
    ci, cj, ck = sch.get_loops(c)
    i0, i1 = sch.split(i, factors=[None, 4])
    sch.reorder(j, i1)  # i0, j, i1
    assert sch.get(j).extent.value == 16  # j was moved, not replaced
    sch.compute_at(c, j)
    # the block handles survive; C's old loops were replaced by new ones
    assert sch.get(c).name_hint == "C" and sch.get(d).name_hint == "D"
    for old in (ci, cj, ck):
        with pytest.raises(ScheduleError, match="no longer exists"):
            sch.get(old)
    with pytest.raises(ScheduleError, match="loop 'd0', which no longer exists"):
        sch.split(i, factors=[2, 8])
    cw = sch.cache_write(c, 0, "local")
    init = sch.decompose_reduction(c, sch.get_loops(c)[-1])
    fused = sch.fuse(i0, j)
    for rv, name in ((c, "C"), (d, "D"), (cw, "C_local"), (init, "C_init")):
        assert sch.get(rv).name_hint == name
    assert sch.get(i1).extent.value == 4
    assert sch.get(fused).extent.value == 64
    assert sch.get_loops(d)[0] is not fused and sch.get(sch.get_loops(d)[0]) is sch.get(fused)


def test_inlined_block_handle_becomes_invalid():
    f, _ = chain()
    sch = Schedule(f)
    b = sch.get_block("B")
    sch.compute_inline(b)
    with pytest.raises(ScheduleError, match="block 'B', which no longer exists"):
        sch.get(b)
    with pytest.raises(ScheduleError, match="no block named 'B'"):
        sch.get_block("B")


def test_failed_primitive_leaves_schedule_unchanged():
    f, _ = matmul_relu()
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    before, n = sch.func, len(sch.trace)
    with pytest.raises(ScheduleError):
        sch.compute_at(c, i)
    with pytest.raises(ScheduleError):
        sch.parallel(k)
    assert sch.func is before and len(sch.trace) == n


def test_handles_of_another_schedule_are_rejected():
    f, _ = matmul()
    a, b = Schedule(f), Schedule(f)
    blk = a.get_block("C")
    with pytest.raises(ScheduleError, match="does not belong to this schedule"):
        b.get_loops(blk)
    with pytest.raises(ScheduleError, match="expected a BlockRV"):
        b.get_loops("C")


def test_copy_is_independent():
    f, _ = matmul()
    sch = Schedule(f)
    b = sch.get_block("C")
    i, j, k = sch.get_loops(b)
    other = sch.copy()
    other.split(i, factors=[None, 4])
    assert sch.get(i).extent.value == 16  # the original is untouched
    with pytest.raises(ScheduleError, match="no longer exists"):
        other.get(i)
    assert len(other.trace) == len(sch.trace) + 1


def test_queries():
    f, _ = matmul_relu()
    sch = Schedule(f)
    root = sch.get_block("root")
    blocks = sch.get_child_blocks(root)
    assert [sch.get(b).name_hint for b in blocks] == ["C", "D"]
    assert all(isinstance(b, BlockRV) for b in blocks)
    c, d = blocks
    assert [sch.get(b).name_hint for b in sch.get_consumers(c)] == ["D"]
    assert [sch.get(b).name_hint for b in sch.get_producers(d)] == ["C"]
    assert sch.get_producers(c) == [] and sch.get_consumers(d) == []
    i, j = sch.get_loops(d)
    sch.compute_at(c, j)
    assert [sch.get(b).name_hint for b in sch.get_child_blocks(i)] == ["C", "D"]
    assert [sch.get(lp).loop_var.name for lp in sch.get_loops(c)][:2] == ["d0", "d1"]
    with pytest.raises(ScheduleError, match="no block named 'E'; blocks: 'root', 'C', 'D'"):
        sch.get_block("E")


def test_duplicate_names_and_loop_vars_are_made_unique():
    A, B, C = buf("A", (4,)), buf("B", (4,)), buf("C", (4,))
    (x,) = vars_("x")
    f = prim_func([A], [C], [
        loops([(x, 4)], realize([x], ew_block("S", A, B, (4,), lambda e: e + f32(1.0)))),
        loops([(x, 4)], realize([x], ew_block("S", B, C, (4,), lambda e: e * f32(2.0)))),
    ], allocs=[B])
    sch = Schedule(f)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))]
    assert names == ["S", "S_1"]
    (l1,) = sch.get_loops(sch.get_block("S"))
    (l2,) = sch.get_loops(sch.get_block("S_1"))
    assert sch.get(l1).loop_var is not sch.get(l2).loop_var
    sch.compute_inline(sch.get_block("S"))
    assert len(sch.get_child_blocks(sch.get_block("root"))) == 1


def test_schedule_needs_block_form():
    f, _ = matmul()
    with pytest.raises(ScheduleError, match="not in block form"):
        Schedule(f.with_body(f.body.block.body))
    with pytest.raises(ScheduleError, match="needs a tir.PrimFunc"):
        Schedule("main")


def test_te_function_schedules():
    sch = Schedule(_te_matmul_relu(16))
    _full_schedule(sch)
    kinds = {inst.kind for inst in sch.trace}
    assert {"split", "reorder", "compute_at", "cache_write", "decompose_reduction",
            "cache_read", "fuse", "parallel", "vectorize", "unroll", "annotate"} <= kinds
