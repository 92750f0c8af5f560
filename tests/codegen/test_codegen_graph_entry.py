"""The whole-model native entry: symbols, one native call per run, checks, threads, files."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te
from kiln.codegen import graph_entry
from kiln.codegen.c import generate_source
from kiln.ir import ArgumentError, KilnError, ModelFormatError, RuntimeCheckError


@pytest.fixture(scope="module")
def exe():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((3, 5), "float32"))
    c = np.arange(5, dtype="float32")
    with bb.function("main", [x]):
        y = bb.emit(op.add(x, g.const(c)))
        z = bb.emit(op.multiply(y, y))
        s = bb.emit(op.sum(z, axis=1))
        bb.emit_func_output(g.Tuple((bb.emit(op.exp(s)), z, x)))
    return kiln.build(bb.get())


def _reference(xv):
    z = (xv + np.arange(5, dtype="float32")) ** 2
    return np.exp(z.sum(axis=1)), z, xv


def test_predicted_symbols_match_the_c_backend():
    names = ["exp", "kiln_x", "a.b", "a_b", "f", "f_unchecked", "1x"]
    def add_one():
        A = te.placeholder((4,), name="A")
        B = te.compute((4,), lambda i: A[i] + 1.0, name="B")
        return te.create_prim_func([A, B])

    funcs = {name: add_one() for name in names}
    _, infos = generate_source(funcs)
    predicted = graph_entry.predict_unchecked_symbols(funcs)
    assert predicted == {n: infos[n].unchecked_symbol for n in names}


def test_static_function_runs_through_one_native_call(exe):
    plan = exe.plans["main"]
    assert plan.entry == "kiln_entry_main"
    assert f"int32_t {plan.entry}(" in exe.module.source
    xv = np.random.default_rng(0).standard_normal((3, 5)).astype("float32")
    outs = exe(xv)
    # no kernel went through the checked (per-kernel) entry
    assert exe.module._cache == {}
    for got, want in zip(outs, _reference(xv)):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert outs[2] is not xv and not np.shares_memory(outs[2], xv)


def test_entry_calls_kernels_in_plan_order(exe):
    plan = exe.plans["main"]
    src = exe.module.source
    body = src[src.index(f"int32_t {plan.entry}("):]
    positions = [body.index(exe.module.functions[c.func].unchecked_symbol + "(a, NULL)")
                 for c in plan.calls]
    assert positions == sorted(positions)


def test_profile_times_every_call_through_the_native_twin(exe):
    plan = exe.plans["main"]
    src = exe.module.source
    assert plan.profile_entry == plan.entry + "_profile"
    body = src[src.index(f"int32_t {plan.profile_entry}("):]
    for i, c in enumerate(plan.calls):  # every call, in plan order, timed into its own slot
        call = f"if ({exe.module.functions[c.func].unchecked_symbol}(a, NULL)) return {i + 1};"
        assert f"{call} }} seconds[{i}] += kiln_wall_seconds() - t0;" in body
    ex = exe._executor("main")
    xv = np.ones((3, 5), "float32")
    kernels, samples = ex.call_samples(xv, repeat=3)
    assert kernels == [c.func for c in plan.calls] and samples.shape == (3, len(kernels))
    assert (samples > 0).all()
    assert exe.module._cache == {}  # no checked (per-kernel) entry was used
    table = str(exe.profile(xv, repeat=2))
    assert all(k in table for k in kernels)
    times = exe.call_times(x=xv, repeat=2)
    assert [k for k, _ in times] == kernels and all(t > 0 for _, t in times)


def test_profile_without_the_native_twin_calls_kernels_one_by_one(exe):
    ex = kiln.runtime.executor.Executor(exe.plans["main"], exe.module)
    ex._profile_entry = None  # as with a library saved before the twin existed
    kernels, samples = ex.call_samples(np.ones((3, 5), "float32"), repeat=2)
    assert samples.shape == (2, len(kernels)) and (samples > 0).all()
    with pytest.raises(KilnError, match="repeat"):
        ex.call_samples(np.ones((3, 5), "float32"), repeat=0)


def test_entry_and_profile_symbols_never_collide():
    taken: set[str] = set()
    first = graph_entry.entry_symbol("main", taken)
    second = graph_entry.entry_symbol("main_profile", {"kiln_entry_main_profile"} | taken)
    assert first == "kiln_entry_main" and second != "kiln_entry_main_profile"
    assert graph_entry.entry_symbol("main", taken) == "kiln_entry_main_1"


def test_inputs_are_still_checked_with_names(exe):
    with pytest.raises(ArgumentError, match=r"'x'.*\(3, 5\).*\(3, 4\)"):
        exe(np.zeros((3, 4), "float32"))
    with pytest.raises(ArgumentError, match="'x'.*float32.*float64"):
        exe(np.zeros((3, 5), "float64"))


def test_set_num_threads(exe):
    try:
        exe.set_num_threads(2)
        assert exe.get_max_threads() == 2 and exe.num_threads == 2
        xv = np.ones((3, 5), "float32")
        np.testing.assert_allclose(exe(xv)[1], _reference(xv)[1])
    finally:
        exe.set_num_threads(None)
    with pytest.raises(KilnError, match="positive"):
        exe.set_num_threads(0)


def test_save_load_keeps_entry_and_workspace(exe, tmp_path):
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    loaded = kiln.load(str(path))
    plan, lp = exe.plans["main"], loaded.plans["main"]
    assert lp.entry == plan.entry
    assert lp.workspace_offsets == plan.workspace_offsets
    assert loaded.workspace_bytes == exe.workspace_bytes
    xv = np.random.default_rng(3).standard_normal((3, 5)).astype("float32")
    for got, want in zip(loaded(xv), exe(xv)):
        np.testing.assert_array_equal(got, want)


def test_old_format_version_is_rejected(tmp_path):
    """A version 1 file (magic, version, dtype count, then length-prefixed blobs)."""
    old = tmp_path / "old.kiln"
    old.write_bytes(b"KILNEXE\0" + (1).to_bytes(4, "little") + (0).to_bytes(4, "little")
                    + (2).to_bytes(8, "little") + b"{}")
    with pytest.raises(ModelFormatError, match="older kiln .*version 1"):
        kiln.load(str(old))


def test_constant_dim_expressions_keep_the_native_entry():
    """A kernel whose buffer shape holds an unfolded constant (``1 * 512``, as ONNX Flatten's
    reshape writes it) is still static: the model keeps its native entry."""
    import onnx
    from onnx import TensorProto, helper

    from kiln.frontend.onnx import from_onnx

    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(onnx.load_from_string(model.SerializeToString()))
    built = kiln.build(mod, params=params)
    assert built.memory_report()["main"]["native_entry"]
    xv = np.random.default_rng(0).standard_normal((1, 512, 1, 1)).astype("float32")
    np.testing.assert_array_equal(built(xv), xv.reshape(1, 512))


# ---- symbolic shapes (a dynamic batch) ---------------------------------------------------
@pytest.fixture(scope="module")
def dyn_exe():
    """Two inputs sharing the symbolic batch ``n``, a temp of shape (n, 6), a constant and a
    tuple output: the kernels read ``n`` from different arguments."""
    n = kiln.tir.Var("n", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, 4), "float32"))
    b = g.Var("b", g.TensorStructInfo((n, 6), "float32"))
    w = np.random.default_rng(1).standard_normal((4, 6)).astype("float32")
    with bb.function("main", [x, b]):
        h = bb.emit(op.matmul(x, g.const(w)))
        r = bb.emit(op.nn.relu(op.add(h, b)))
        s = bb.emit(op.sum(r, axis=1))
        bb.emit_func_output(g.Tuple((bb.emit(op.exp(r)), s)))
    return kiln.build(bb.get()), w


def _dyn_reference(xv, bv, w):
    r = np.maximum(xv @ w + bv, 0)
    return np.exp(r), r.sum(axis=1)


def test_symbolic_function_runs_through_its_native_entry(dyn_exe):
    exe, w = dyn_exe
    plan = exe.plans["main"]
    assert plan.entry == "kiln_entry_main" and plan.entry_sym_dims is not None
    assert len(plan.entry_sym_dims) == len(plan.calls)
    src = exe.module.source
    assert (f"int32_t {plan.entry}(void** inputs, void** outputs, void** temps, void** consts, "
            "const int64_t* sym)") in src
    body = src[src.index(f"int32_t {plan.entry}("):src.index(f"int32_t {plan.profile_entry}(")]
    # every kernel reads its batch from its own slice of sym
    assert body.count("(a, sym + ") == sum(bool(d) for d in plan.entry_sym_dims)
    rng = np.random.default_rng(0)
    for batch in (3, 1, 7, 3):
        xv = rng.standard_normal((batch, 4)).astype("float32")
        bv = rng.standard_normal((batch, 6)).astype("float32")
        outs = exe(xv, bv)
        assert [o.shape for o in outs] == [(batch, 6), (batch,)]
        for got, want in zip(outs, _dyn_reference(xv, bv, w)):
            np.testing.assert_allclose(got, want, rtol=1e-5)
    assert exe.module._cache == {}  # no kernel went through its checked entry


def test_symbolic_entry_checks_inputs_first(dyn_exe):
    exe, _ = dyn_exe
    with pytest.raises(ArgumentError, match="'b'"):
        exe(np.zeros((3, 4), "float32"), np.zeros((2, 6), "float32"))


def test_symbolic_entry_profile_and_save_load(dyn_exe, tmp_path):
    exe, w = dyn_exe
    xv = np.random.default_rng(5).standard_normal((4, 4)).astype("float32")
    bv = np.random.default_rng(6).standard_normal((4, 6)).astype("float32")
    times = exe.call_times(xv, bv, repeat=2)
    assert [k for k, _ in times] == [c.func for c in exe.plans["main"].calls]
    assert all(t > 0 for _, t in times)
    path = tmp_path / "dyn.kiln"
    exe.save(str(path))
    loaded = kiln.load(str(path))
    assert loaded.plans["main"].entry_sym_dims == exe.plans["main"].entry_sym_dims
    for got, want in zip(loaded(xv, bv), _dyn_reference(xv, bv, w)):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_kernel_sym_dims():
    n = kiln.tir.Var("n", "int64")
    A = te.placeholder((4, n), name="A")
    B = te.compute((4, n), lambda i, j: A[i, j] * 2.0, name="B")
    func = te.create_prim_func([A, B])
    assert graph_entry.kernel_sym_dims(func, 2) == [(0, 1)]
    assert graph_entry.kernel_sym_dims(func, 3) is None  # not the call's tensors
    S = te.placeholder((4, 4), name="S")
    T = te.compute((4, 4), lambda i, j: S[i, j] + 1.0, name="T")
    assert graph_entry.kernel_sym_dims(te.create_prim_func([S, T]), 2) == []


# ---- plans with host steps: segment entries ----------------------------------------------
@pytest.fixture(scope="module")
def seg_exe():
    """A run-time Reshape (a host shape function and a match step) cuts the plan: kernels
    before it (x * 2) and after it (Gather with run-time indices, Add, ReduceSum)."""
    import onnx
    from onnx import TensorProto, helper

    from kiln.frontend.onnx import from_onnx

    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"]),
             helper.make_node("Reshape", ["x2", "s"], ["y"]),
             helper.make_node("Gather", ["y", "idx"], ["gy"], axis=1, name="gather"),
             helper.make_node("Add", ["gy", "gy"], ["a"]),
             helper.make_node("ReduceSum", ["a"], ["r"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(onnx.load_from_string(model.SerializeToString()))
    return kiln.build(mod, params=params)


def _seg_reference(xv, s, idx):
    a = 2 * np.take((2 * xv).reshape(s), idx, axis=1)
    return a.sum(), a


def test_host_step_plans_run_kernels_through_segment_entries(seg_exe):
    plan = seg_exe.plans["main"]
    assert plan.entry is None and plan.has_host_steps and plan.segments
    runs = graph_entry.kernel_runs(plan)
    assert [(seg["start"], seg["stop"]) for seg in plan.segments] == runs
    assert sum(stop - start for start, stop in runs) == plan.num_kernels
    for seg in plan.segments:
        assert f"int32_t {seg['symbol']}(void** slots, const int64_t* sym)" in \
            seg_exe.module.source
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((2, 6)).astype("float32")
    for shape, idx in (((3, 4), [0, 3, 1]), ((2, 6), [5, 5, 0]), ((12, 1), [0, 0, 0])):
        s, idx = np.array(shape), np.array(idx)
        got = seg_exe(xv, s, idx)
        for g_, want in zip(got, _seg_reference(xv, s, idx)):
            np.testing.assert_allclose(g_, want, rtol=1e-5, atol=1e-6)
    assert seg_exe.module._cache == {}  # no kernel went through its checked entry
    # the per-kernel path (what profiling runs) agrees
    times = seg_exe.call_times(xv, np.array([3, 4]), np.array([0, 3, 1]), repeat=1)
    assert len(times) == plan.num_kernels


def test_segment_entry_check_failures_name_the_node(seg_exe):
    xv = np.zeros((2, 6), np.float32)
    with pytest.raises(RuntimeCheckError, match="gather"):
        seg_exe(xv, np.array([3, 4]), np.array([0, 4, 1]))  # index 4 of an axis of 4


def test_segment_entries_survive_save_and_load(seg_exe, tmp_path):
    path = str(tmp_path / "seg.kiln")
    seg_exe.save(path)
    loaded = kiln.load(path)
    assert loaded.plans["main"].segments == seg_exe.plans["main"].segments
    xv = np.random.default_rng(4).standard_normal((2, 6)).astype("float32")
    s, idx = np.array([4, 3]), np.array([2, 0, 1])
    for got, want in zip(loaded(xv, s, idx), _seg_reference(xv, s, idx)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
