"""Control-flow plan steps (``kiln.runtime.control_flow``): the step functions on numpy with a
stand-in runner, and graph modules built with the BlockBuilder whose ``main`` runs a loop body
and branch functions at run time (shapes changing per iteration, saved and loaded)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir.errors import ArgumentError, WellFormedError
from kiln.runtime import control_flow as cf

F32 = "float32"


def test_run_if_calls_only_the_taken_branch():
    calls = []

    def runner(name, args):
        calls.append(name)
        return [args[0] + (1 if name == "t" else -1)]

    x = np.zeros(2, np.float32)
    assert cf.run_if(runner, ["t", "e"], [np.array([True]), x])[0].tolist() == [1, 1]
    assert cf.run_if(runner, ["t", "e"], [np.array(False), x])[0].tolist() == [-1, -1]
    assert calls == ["t", "e"]
    with pytest.raises(ValueError, match="one element"):
        cf.run_if(runner, ["t", "e"], [np.array([True, False]), x])


def test_run_loop_stops_on_trip_count_or_condition_and_stacks_scan_outputs():
    def body(name, args):  # carried grows by one entry; stops once it has 4 entries
        i, _, seq = args
        out = np.concatenate([seq, [float(i)]]).astype(np.float32)
        return [np.array(len(out) < 4), out, np.array([i * 10], np.int64)]

    attrs = cf.LoopAttrs(num_carried=1, scan_output_shapes=((1,),),
                         scan_output_dtypes=("int64",))
    seq0 = np.zeros(1, np.float32)
    seq, scans = cf.run_loop(body, "b", [np.array(2), np.array(True), seq0], attrs)
    assert seq.tolist() == [0, 0, 1] and scans.tolist() == [[0], [10]]
    seq, scans = cf.run_loop(body, "b", [np.array(9), np.array(True), seq0], attrs)
    assert seq.tolist() == [0, 0, 1, 2] and scans.shape == (3, 1)
    # zero iterations: the carried value as given, an empty scan output of the known shape
    seq, scans = cf.run_loop(body, "b", [np.array(0), np.array(True), seq0], attrs)
    assert seq.tolist() == [0] and scans.shape == (0, 1) and scans.dtype == np.int64


def test_run_scan_slices_reverses_and_stacks():
    def body(name, args):
        s, x = args
        return [s + x, (s + x) * 2]

    attrs = cf.LoopAttrs(num_carried=1, num_scan_inputs=1, scan_input_axes=(1,),
                         scan_input_directions=(1,), scan_output_axes=(1,),
                         scan_output_shapes=((2,),), scan_output_dtypes=("float32",))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s, ys = cf.run_scan(body, "b", [np.zeros(2, np.float32), x], attrs)
    ref_s, ref_ys = np.zeros(2, np.float32), []
    for t in (2, 1, 0):
        ref_s = ref_s + x[:, t]
        ref_ys.append(ref_s * 2)
    np.testing.assert_array_equal(s, ref_s)
    np.testing.assert_array_equal(ys, np.stack(ref_ys, axis=1))


def _loop_module():
    """main(x: (n,), k: ()) doubles x (concat with itself) k times via a run-time loop whose
    body adds the iteration number; an If picks negate or identity by the sum's sign."""
    bb = g.BlockBuilder()
    m = tir.Var("m", "int64")
    i_, c_ = g.Var("i", g.TensorStructInfo((), "int64")), g.Var("c", g.TensorStructInfo((), "bool"))
    v = g.Var("v", g.TensorStructInfo((m,), F32))
    with bb.function("body", [i_, c_, v]):
        with bb.dataflow():
            grown = bb.emit(op.concat([v, v], axis=0))
            shifted = bb.emit(op.add(grown, op.cast(i_, F32)))
            outs = [bb.emit_output(c_), bb.emit_output(shifted)]
        bb.emit_func_output(outs)
    for name, fn in (("neg", op.negative), ("same", None)):
        y = g.Var("y", g.TensorStructInfo((m,), F32))
        with bb.function(name, [y]):
            with bb.dataflow():
                out = bb.emit_output(fn(y) if fn else op.add(y, g.const(np.float32(0))))
            bb.emit_func_output([out])
    mod = bb.get()
    n = tir.Var("n", "int64")
    x = g.Var("x", g.TensorStructInfo((n,), F32))
    k = g.Var("k", g.TensorStructInfo((), "int64"))
    bb = g.BlockBuilder(mod)
    with bb.function("main", [x, k]):
        with bb.dataflow():
            attrs = cf.LoopAttrs(num_carried=1, has_cond=False)
            loop = bb.emit(g.Call(g.ExternFunc(cf.PREFIX + "loop"),
                                  [g.GlobalVar("body"), k, x], attrs=attrs,
                                  sinfo_args=[g.TupleStructInfo(
                                      (g.TensorStructInfo(None, F32, ndim=1),))]))
            r = tir.Var("r", "int64")
            grown = bb.match_cast(g.TupleGetItem(loop, 0), g.TensorStructInfo((r,), F32))
            pos = bb.emit(op.greater(op.sum(grown), g.const(np.float32(0))))
            branch = bb.emit(g.Call(g.ExternFunc(cf.PREFIX + "if"),
                                    [g.GlobalVar("neg"), g.GlobalVar("same"), pos, grown],
                                    sinfo_args=[g.TupleStructInfo(
                                        (g.TensorStructInfo(None, F32, ndim=1),))]))
            out = bb.emit_output(bb.match_cast(g.TupleGetItem(branch, 0),
                                               g.TensorStructInfo((r,), F32)))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, k):
    for i in range(k):
        x = np.concatenate([x, x]) + np.float32(i)
    return -x if x.sum() > 0 else x


def test_graph_loop_and_if_run_at_run_time_and_save(tmp_path):
    mod = _loop_module()
    g.well_formed(mod)
    exe = kiln.build(mod)
    rng = np.random.default_rng(0)
    for n, k in [(3, 0), (1, 4), (5, 2)]:
        x = (rng.standard_normal(n) - 3).astype(np.float32)
        np.testing.assert_allclose(exe(x, np.array(k, np.int64)), _reference(x, k), rtol=1e-6)
    path = os.path.join(tmp_path, "cf.kiln")
    exe.save(path)
    x = np.ones(2, np.float32)
    np.testing.assert_allclose(kiln.load(path)(x, np.array(3, np.int64)), _reference(x, 3))


def test_a_wrong_trip_count_shape_is_an_argument_error():
    exe = kiln.build(_loop_module())
    with pytest.raises(ArgumentError, match="k"):
        exe(np.ones(2, np.float32), np.array([1, 2], np.int64))


def test_well_formed_rejects_control_calls_of_unknown_functions():
    with pytest.raises(WellFormedError, match="same.*not a graph function"):
        g.well_formed(_loop_module().without("same"))
