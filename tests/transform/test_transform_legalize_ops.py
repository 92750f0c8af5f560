"""LegalizeOps on compound symbolic dimensions (``b*s``): kernels keep the dims they can
bind, make fresh variables of the others, and reshapes across merged dims build and run."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.transform import LegalizeOps, PassContext

b, s = tir.Var("b", "int64"), tir.Var("s", "int64")


def _module(body) -> tuple[kiln.IRModule, g.Var]:
    x = g.Var("x", g.TensorStructInfo((b, s, 4), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get(), x


def _merged_then_split(bb, x):
    """(b, s, 4) -> (b*s, 4) -> relu -> (b, s, 4): the relu's kernel has no plain dim, the
    second reshape's input is b*s and its output (b, s, 4)."""
    y = bb.emit(op.nn.relu(op.reshape(x, (b * s, 4))))
    return op.reshape(y, (b, s, 4))


def _commuted(bb, x):
    """(b*s, 4) reshaped to (s*b, 4) (the same size written the other way round) and then
    to (b, 2*s, 2): no side of the last reshape sizes ``s`` plainly."""
    y = bb.emit(op.nn.relu(op.reshape(x, (b * s, 4))))
    z = bb.emit(op.sigmoid(op.reshape(y, (s * b, 4))))
    return op.reshape(z, (b, 2 * s, 2))


def _reference(name: str, a: np.ndarray) -> np.ndarray:
    r = np.maximum(a, 0)
    if name == "merged_then_split":
        return r
    return (1 / (1 + np.exp(-r))).reshape(a.shape[0], 2 * a.shape[1], 2)


CASES = {"merged_then_split": _merged_then_split, "commuted": _commuted}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("opt_level", [0, 2])
def test_reshapes_across_compound_dims_build_and_run(name: str, opt_level: int) -> None:
    mod, _ = _module(CASES[name])
    with PassContext(opt_level=opt_level):
        exe = kiln.build(mod)
    rng = np.random.default_rng(0)
    for shape in ((2, 3, 4), (5, 1, 4)):
        a = rng.standard_normal(shape).astype("float32")
        np.testing.assert_allclose(exe(a), _reference(name, a), rtol=1e-6, atol=1e-6)


def test_kernel_keeps_a_compound_dim_it_can_bind() -> None:
    """The reshape (b*s, 4) -> (b, s, 4): b and s size its output, so its input keeps the
    dim b*s (checked by the kernel) instead of a fresh variable; the relu before it, with no
    plain dim, gets one."""
    mod, _ = _module(_merged_then_split)
    with PassContext(opt_level=0):
        legal = LegalizeOps()(mod)
    funcs = {f.attrs["op_name"]: f for f in legal.functions.values()
             if isinstance(f, tir.PrimFunc)}
    split = [f for f in legal.functions.values() if isinstance(f, tir.PrimFunc)
             and f.attrs["op_name"] == "reshape" and len(f.buffers[-1].shape) == 3]
    assert len(split) == 1
    in_dim = split[0].buffers[0].shape[0]
    assert not isinstance(in_dim, tir.Var) and set(tir.collect_vars(in_dim)) == {b, s}
    relu_dim = funcs["relu"].buffers[0].shape[0]
    assert isinstance(relu_dim, tir.Var) and relu_dim not in (b, s)
