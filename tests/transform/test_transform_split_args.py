"""SplitArgs: concats of more tensors than a GPU kernel may take become concats of concats
(exact, order kept); the build applies it and FuseOps' cap for GPU targets, so a model with a
300-way concat and a 150-tensor element-wise chain builds for OpenCL (1 KiB of kernel
parameters) and matches numpy."""

from __future__ import annotations

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.target import Target
from kiln.transform import SplitArgs
from kiln.transform.split_args import max_kernel_args

RNG = np.random.default_rng(2)


def _concat_module(n):
    xs = [g.Var(f"x{i}", g.TensorStructInfo((2, i % 3 + 1), "float32")) for i in range(n)]
    bb = g.BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(op.concat(xs, axis=1))
        bb.emit_func_output(out)
    return xs, bb.get()


def _concats(expr_module):
    return [b.value for b in expr_module["main"].body.blocks[0].bindings
            if isinstance(b.value.op, g.Op) and b.value.op.name == "concat"]


def test_big_concats_become_concats_of_concats():
    xs, mod = _concat_module(25)
    after = SplitArgs(max_args=6)(mod)
    concats = _concats(after)
    assert all(len(c.args[0].fields) <= 5 for c in concats)
    assert len(concats) == 6  # 25 -> 5 concats of 5 -> 1 of their 5 results
    assert after["main"].ret_struct_info.shape == mod["main"].ret_struct_info.shape
    arrays = [RNG.standard_normal((2, i % 3 + 1)).astype("float32") for i in range(25)]
    np.testing.assert_array_equal(kiln.build(after, "c")(*arrays), np.concatenate(arrays, 1))
    assert SplitArgs(max_args=30)(mod)["main"] is mod["main"]  # small enough: untouched
    assert SplitArgs()(mod)["main"] is mod["main"]  # no limit (the CPU)


def test_the_limits_of_the_targets():
    assert max_kernel_args("c") is None
    assert max_kernel_args(Target("opencl")) == Target("opencl").gpu.max_kernel_param_bytes // 8 - 8
    assert max_kernel_args(Target("cuda", arch="sm_90")) == 4096 // 8 - 8


def test_a_model_beyond_the_parameter_space_builds_for_opencl():
    n = 300
    xs = [g.Var(f"x{i}", g.TensorStructInfo((2, 3), "float32")) for i in range(n)]
    bb = g.BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            c = bb.emit(op.concat(xs, axis=1))
            s = xs[0]
            for v in xs[1:150]:
                s = bb.emit(op.add(s, v))
            out = bb.emit_output(op.multiply(c, op.concat([s] * n, axis=1)))
        bb.emit_func_output(out)
    arrays = [RNG.standard_normal((2, 3)).astype("float32") for _ in range(n)]
    want = np.concatenate(arrays, 1) * np.concatenate([sum(arrays[:150])] * n, 1)
    np.testing.assert_allclose(kiln.build(bb.get(), "opencl")(*arrays), want, rtol=1e-5,
                               atol=1e-5)
