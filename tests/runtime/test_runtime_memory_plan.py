"""Static memory planning: liveness-correct placement, real savings, unchanged numerics."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.runtime import memory_plan
from kiln.runtime.executor import Executor
from kiln.runtime.memory_plan import ALIGN, Interval, place
from kiln.testing import models


def _assert_valid(intervals, offsets, peak):
    for iv in intervals:
        assert offsets[iv.key] % ALIGN == 0
        assert offsets[iv.key] + iv.size <= peak
    for i, a in enumerate(intervals):
        for b in intervals[i + 1:]:
            if a.overlaps(b):
                a0, b0 = offsets[a.key], offsets[b.key]
                assert a0 + max(a.size, 1) <= b0 or b0 + max(b.size, 1) <= a0, (a, b, a0, b0)


def test_random_intervals_never_share_bytes_while_live():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 25))
        ivs = []
        for k in range(n):
            start = int(rng.integers(0, 30))
            ivs.append(Interval(k, int(rng.integers(0, 5000)), start,
                                start + int(rng.integers(0, 8))))
        offsets, peak = place(ivs)
        _assert_valid(ivs, offsets, peak)
        # the peak never exceeds what the temps take unshared
        assert peak <= sum(-(-max(iv.size, 1) // ALIGN) * ALIGN for iv in ivs)


def test_a_chain_reuses_dead_buffers():
    # a -> b -> c -> d: a is dead when c is written, so c can take a's bytes
    ivs = [Interval(k, 1000, k, k + 1) for k in range(4)]
    offsets, peak = place(ivs)
    assert peak == 2 * 1024
    assert offsets[0] == offsets[2] and offsets[1] == offsets[3]


def test_touching_ranges_conflict():
    # read at call 3 and written at call 3: must not share (the kernel reads while writing)
    a, b = Interval(0, 64, 0, 3), Interval(1, 64, 3, 5)
    offsets, _ = place([a, b])
    assert offsets[0] != offsets[1]


def test_best_fit_picks_the_smallest_gap():
    # Long-lived temps 1 and 3 sit above short-lived 0 and 2; when those are dead, temp 4
    # sees a 4096-byte hole (where 0 was) and a 1024-byte one (where 2 was): best fit is 2's.
    ivs = [Interval(0, 4096, 0, 1), Interval(1, 2048, 0, 9), Interval(2, 1024, 0, 1),
           Interval(3, 1024, 0, 9), Interval(4, 1000, 2, 3)]
    offsets, peak = place(ivs)
    _assert_valid(ivs, offsets, peak)
    assert offsets[4] == offsets[2]  # the 1024-byte hole, not the 4096-byte one


@pytest.fixture(scope="module", params=["mlp", "small_cnn"])
def built(request):
    model = models.mlp(batch=2) if request.param == "mlp" else models.small_cnn()
    return model, kiln.build(model.mod)


def test_model_plans_are_liveness_correct_and_save_memory(built):
    model, exe = built
    plan = exe.plans["main"]
    ivs = memory_plan.live_intervals(plan)
    assert len(ivs) >= 2
    _assert_valid(ivs, plan.workspace_offsets, plan.workspace_bytes)
    report = exe.memory_report()["main"]
    assert report["workspace_bytes"] == exe.workspace_bytes == plan.workspace_bytes
    assert exe.workspace_bytes < report["unshared_bytes"]
    assert all(plan.slots[s].kind == "temp" for s in plan.workspace_offsets)


def test_numerics_match_reference_and_unplanned_run(built):
    model, exe = built
    out = exe(*model.inputs)
    np.testing.assert_allclose(out, model.reference(*model.inputs), rtol=1e-4, atol=1e-5)
    # The same plan run kernel by kernel with separately allocated temps gives the same bits.
    plan = exe.plans["main"]
    unplanned = type(plan)(**{**plan.__dict__, "workspace_offsets": {}, "workspace_bytes": 0,
                              "entry": None})
    ref = Executor(unplanned, exe.module).run(*model.inputs)
    np.testing.assert_array_equal(out, ref)
    # repeated runs reuse the workspace and stay correct; outputs are fresh arrays
    again = exe(*model.inputs)
    np.testing.assert_array_equal(again, out)
    assert again is not out and not np.shares_memory(again, out)


def _symbolic_batch_exe():
    n = kiln.tir.Var("n", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, 8), "float32"))
    w = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    with bb.function("main", [x]):
        h = bb.emit(op.matmul(x, g.const(w)))
        h = bb.emit(op.nn.relu(h))
        bb.emit_func_output(bb.emit(op.exp(h)))
    return kiln.build(bb.get()), w


def test_symbolic_temps_are_planned_per_binding():
    exe, w = _symbolic_batch_exe()
    plan = exe.plans["main"]
    # nothing to plan at build time; the native entry takes the temps per call
    assert plan.workspace_offsets == {} and exe.workspace_bytes == 0
    assert plan.entry is not None and plan.entry_sym_dims is not None
    ex = exe._executor("main")
    sizes = []
    for batch in (1, 5, 3, 5, 1):
        xv = np.random.default_rng(batch).standard_normal((batch, 8)).astype("float32")
        np.testing.assert_allclose(exe(xv), np.exp(np.maximum(xv @ w, 0)), rtol=1e-5)
        (state,) = ex._pool  # one thread: the same call state every time
        frame = state.frame(plan, {"n": batch})
        live = [s for s, spec in enumerate(plan.slots) if spec.kind == "temp"]
        assert set(frame.offsets) == set(live)
        sizes.append(state.dyn_workspace.nbytes)
    # the workspace grows to the largest binding and stays; frames are reused per binding
    assert sizes[0] <= sizes[1] == sizes[2] == sizes[3] == sizes[4]
    assert sorted(state.frames) == [(("n", 1),), (("n", 3),), (("n", 5),)]


def test_symbolic_plan_memory_shares_bytes_by_liveness():
    exe, _ = _symbolic_batch_exe()
    plan = exe.plans["main"]
    shapes = [(7, 8) if spec.kind != "const" else tuple(spec.shape) for spec in plan.slots]
    offsets, peak = memory_plan.plan_memory(plan, shapes)
    temps = [s for s, spec in enumerate(plan.slots) if spec.kind == "temp"]
    assert set(offsets) == set(temps)
    one = -(-7 * 8 * 4 // ALIGN) * ALIGN
    # a chain of temps: no more than two live at once
    assert peak <= 2 * one and all(off % ALIGN == 0 for off in offsets.values())


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("shape,dtype", [((3, 5), "float32"), ((), "float64"), ((4, 0), "int8"),
                                         ((7,), "uint8")])
def test_aligned_empty_has_the_shape_dtype_and_alignment(shape, dtype):
    for _ in range(8):  # numpy's own placement varies from one allocation to the next
        a = memory_plan.aligned_empty(shape, dtype)
        assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous
        if a.size:  # (an empty array's address means nothing)
            assert _address(a) % ALIGN == 0


def test_aligned_copy_copies_only_misaligned_arrays():
    raw = memory_plan.aligned_empty((40,), "float32")
    aligned, shifted = raw[:32].reshape(4, 8), raw[4:36].reshape(4, 8)  # 16 bytes off
    raw[:] = np.arange(40)
    assert memory_plan.aligned_copy(aligned) is aligned
    copy = memory_plan.aligned_copy(shifted)
    assert copy is not shifted and _address(copy) % ALIGN == 0
    np.testing.assert_array_equal(copy, shifted)
    strided = memory_plan.aligned_copy(raw[::2])
    assert strided.flags.c_contiguous and _address(strided) % ALIGN == 0
    np.testing.assert_array_equal(strided, raw[::2])


def test_constants_and_unplanned_temps_are_aligned(built, tmp_path):
    """Kernels load weights with full-width vector loads: numpy's 16-byte alignment would make
    half of them straddle cache lines. Constants are aligned when the plan is made (no copy
    per executor), again when a saved executable is loaded, and temps kept outside the
    workspace are too."""
    model, exe = built
    plan = exe.plans["main"]
    assert plan.constants
    assert all(_address(c) % ALIGN == 0 for c in plan.constants.values())
    ex = Executor(plan, exe.module)
    assert all(_address(ex._consts_by_slot[s]) == _address(plan.constants[s])
               for s in plan.constants)
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    loaded = kiln.load(str(path))
    lplan = loaded.plans["main"]
    assert all(_address(c) % ALIGN == 0 for c in lplan.constants.values())
    unplanned = type(plan)(**{**plan.__dict__, "workspace_offsets": {}, "workspace_bytes": 0,
                              "entry": None})
    temps = [a for s, a in Executor(unplanned, exe.module).acquire().temps.items()
             if plan.slots[s].kind == "temp"]
    assert temps and all(_address(a) % ALIGN == 0 for a in temps)
    np.testing.assert_array_equal(loaded(*model.inputs), exe(*model.inputs))


def test_misaligned_constants_given_to_an_executor_are_realigned(built):
    model, exe = built
    plan = exe.plans["main"]
    shifted = {}
    for slot, c in plan.constants.items():
        raw = memory_plan.aligned_empty((c.nbytes + ALIGN,), "uint8")
        a = raw[16:16 + c.nbytes].view(c.dtype).reshape(c.shape)
        a[...] = c
        shifted[slot] = a
    odd = type(plan)(**{**plan.__dict__, "constants": shifted})
    ex = Executor(odd, exe.module)
    assert all(_address(ex._consts_by_slot[s]) % ALIGN == 0 for s in shifted)
    np.testing.assert_array_equal(ex.run(*model.inputs), exe(*model.inputs))


# ---- the memory limit ---------------------------------------------------------------------
def _chain(shape):
    """x -> matmul -> relu -> exp: two temps the size of x's rows by 8 (not fused: a temp)."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo(shape, "float32"))
    w = np.eye(8, dtype="float32")
    with bb.function("main", [x]):
        with bb.span(kiln.ir.span.Span.of("mm", "MatMul")):
            h = bb.emit(op.matmul(x, g.const(w)))
        h = bb.emit(op.transpose(op.nn.relu(h)))
        bb.emit_func_output(bb.emit(op.exp(h)))
    return bb.get()


@pytest.mark.parametrize("rows,size", [(2**31 - 1, r"64\.0 GiB"), (2**32 + 1, r"128\.0 GiB")])
def test_a_plan_over_the_memory_limit_is_refused_at_build_with_its_size(rows, size):
    """A model declaring 2^31 - 1 (or 2^32 + 1) rows: the build -- whose transpose schedule
    once looped over every row -- refuses it, naming the largest tensor and its node, instead
    of the first call allocating the workspace."""
    with pytest.raises(kiln.ir.MemoryLimitError,
                       match=rf"one run of main \(largest tensor {size}, made by MatMul node "
                             r"'mm'\) needs .* more than the memory limit of"):
        kiln.build(_chain((rows, 8)))


def test_the_limit_is_set_by_the_environment(monkeypatch):
    monkeypatch.setenv(memory_plan.MEMORY_LIMIT_ENV, "1K")
    with pytest.raises(kiln.ir.MemoryLimitError, match=r"memory limit of 1\.0 KiB"):
        kiln.build(_chain((64, 8)))
    monkeypatch.setenv(memory_plan.MEMORY_LIMIT_ENV, "lots")
    with pytest.raises(kiln.ir.MemoryLimitError, match="is not a size"):
        memory_plan.memory_limit()
    monkeypatch.setenv(memory_plan.MEMORY_LIMIT_ENV, "2M")
    assert memory_plan.memory_limit() == 2 << 20


def test_symbolic_sizes_are_checked_against_the_limit_before_allocating(monkeypatch):
    """With a dynamic batch the limit applies to each binding: a batch that fits runs, one
    that does not fails before anything is allocated; a huge non-contiguous input (a
    broadcast view, no memory of its own) is refused before kiln copies it."""
    small = np.ones((4, 8), "float32")
    with pytest.raises(kiln.ir.ArgumentError, match="expected shape"):
        kiln.build(_chain((2**22, 8)))(small)  # inputs are checked before the workspace
    exe = kiln.build(_chain((kiln.tir.Var("n", "int64"), 8)))
    monkeypatch.setenv(memory_plan.MEMORY_LIMIT_ENV, "1M")
    np.testing.assert_allclose(exe(small), np.exp(small.T), rtol=1e-6)
    with pytest.raises(kiln.ir.MemoryLimitError, match=r"largest tensor .* MatMul node 'mm'"):
        exe(np.ones((100000, 8), "float32"))
    huge = np.broadcast_to(np.float32(1), (2**40, 8))
    with pytest.raises(kiln.ir.MemoryLimitError, match=r"input 'x' \(not contiguous"):
        exe(huge.T.T[::1])
