"""cumsum / cumprod: inference, the scan TIR and its schedule, numerics against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import OpPattern, get_op_def
from kiln.op.scan import ScanAttrs, scan_prim_func
from kiln.schedule import lookup_schedule
from kiln.schedule.cpu.scan import schedule_scan
from kiln.target import Target
from kiln.testing.op_testing import dims, infer, tvar
from kiln.tir.schedule import Schedule

RNG = np.random.default_rng(7)


def np_scan(kind, x, axis=None, dtype=None, exclusive=False, reverse=False):
    """numpy reference with ONNX CumSum's exclusive/reverse semantics."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    out_dtype = np.dtype(dtype) if dtype else (np.int64 if x.dtype == bool else x.dtype)
    x = x.astype(out_dtype)
    if reverse:
        x = np.flip(x, axis)
    fn, ident = (np.cumsum, 0) if kind == "cumsum" else (np.cumprod, 1)
    y = fn(x, axis=axis, dtype=out_dtype)
    if exclusive:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (1, 0)
        y = np.pad(y, pad, constant_values=ident)
        y = np.take(y, np.arange(x.shape[axis]), axis=axis)
    if reverse:
        y = np.flip(y, axis)
    return np.ascontiguousarray(y)


# ---------------------------------------------------------------------------------------------
# declaration and inference
# ---------------------------------------------------------------------------------------------
def test_declarations():
    for name in ("cumsum", "cumprod"):
        d = get_op_def(name)
        assert d.pattern == OpPattern.OPAQUE and d.attrs is ScanAttrs
        assert d.legalize is not None and callable(d.gradient)
        assert lookup_schedule(d.name, "c") is not None


@pytest.mark.parametrize("fn", [op.cumsum, op.cumprod])
def test_inference(fn):
    x = tvar("x", (2, 3, 4))
    assert dims(infer(fn(x, axis=1))) == (2, 3, 4)
    assert dims(infer(fn(x, -1, exclusive=True))) == (2, 3, 4)
    s = infer(fn(x))  # axis=None: flattened
    assert dims(s) == (24,) and s.dtype == "float32"
    assert infer(fn(x, axis=0, dtype="float64")).dtype == "float64"
    assert infer(fn(tvar("b", (5,), "bool"), axis=0)).dtype == "int64"
    assert infer(fn(tvar("i", (5,), "int32"), axis=0)).dtype == "int32"
    n = tir.Var("n", "int64")
    s = infer(fn(tvar("x", (n, 3)), axis=0))
    assert s.shape[0] is n
    flat = infer(fn(tvar("x", (n, 3))))
    assert len(flat.shape) == 1


def test_inference_errors():
    x = tvar("x", (2, 3))
    with pytest.raises(StructInfoError, match="cumsum.*axis"):
        infer(op.cumsum(x, axis=2))
    with pytest.raises(KilnError, match="axis must be an int"):
        op.cumsum(x, axis=(0, 1))
    with pytest.raises(KilnError, match="exclusive must be a bool"):
        op.cumprod(x, axis=0, exclusive=1)
    with pytest.raises(KilnError, match="dtype"):
        op.cumsum(x, axis=0, dtype="bool")
    with pytest.raises(KilnError, match="unknown attribute"):
        op.cumsum(x, axes=0)


# ---------------------------------------------------------------------------------------------
# TIR and schedule
# ---------------------------------------------------------------------------------------------
def test_scan_tir_is_linear_per_line():
    func = scan_prim_func((8, 16), "float32", ScanAttrs(axis=1), lambda a, b: a + b, 0,
                          "cumsum")
    blocks, loops = [], []
    tir.post_order_visit(func.body, lambda n: isinstance(n, tir.Block) and blocks.append(n))
    tir.post_order_visit(func.body, lambda n: isinstance(n, tir.For) and loops.append(n))
    scan = next(b for b in blocks if b.name_hint == "cumsum")
    assert len(scan.iter_vars) == 1  # one block instance per scan line (the other axis)
    assert [b.scope for b in scan.alloc_buffers] == ["local"]
    # two loops in all: over lines (outside the block) and along the axis (inside): O(n)
    assert sorted(int(lp.extent.value) for lp in loops) == [8, 16]


def test_schedule_parallelizes_lines():
    func = scan_prim_func((64, 512), "float32", ScanAttrs(axis=0), lambda a, b: a * b, 1,
                          "cumprod").with_attr("op_name", "cumprod")
    sch = Schedule(func)
    schedule_scan(sch, Target("c"))
    kinds = []
    tir.post_order_visit(sch.func.body, lambda n: isinstance(n, tir.For) and kinds.append(n.kind))
    assert tir.ForKind.PARALLEL in kinds
    small = Schedule(scan_prim_func((2, 3), "float32", ScanAttrs(axis=0), lambda a, b: a + b,
                                    0, "cumsum"))
    schedule_scan(small, Target("c"))
    kinds = []
    tir.post_order_visit(small.func.body,
                         lambda n: isinstance(n, tir.For) and kinds.append(n.kind))
    assert tir.ForKind.PARALLEL not in kinds  # too little work for threads


# ---------------------------------------------------------------------------------------------
# numerics: every variant in one module (one compile)
# ---------------------------------------------------------------------------------------------
CASES = [
    # (input shape, input dtype, attrs)
    ((3, 4, 5), "float32", dict(axis=0)),
    ((3, 4, 5), "float32", dict(axis=1)),
    ((3, 4, 5), "float32", dict(axis=-1)),
    ((3, 4, 5), "float32", dict(axis=None)),
    ((3, 4, 5), "float32", dict(axis=1, exclusive=True)),
    ((3, 4, 5), "float32", dict(axis=2, reverse=True)),
    ((3, 4, 5), "float32", dict(axis=0, exclusive=True, reverse=True)),
    ((3, 4, 5), "float32", dict(axis=None, exclusive=True)),
    ((6, 5), "int32", dict(axis=1)),
    ((6, 5), "int32", dict(axis=0, dtype="int64")),
    ((6, 5), "int32", dict(axis=None, dtype="float64")),
    ((4, 7), "bool", dict(axis=1)),
    ((4, 7), "float16", dict(axis=1, dtype="float32")),
    ((2, 0, 3), "float32", dict(axis=1)),
    ((40, 700), "float32", dict(axis=1)),  # big enough for the parallel schedule
    ((300, 64), "float64", dict(axis=0)),
]


def _sample(shape, dtype, kind):
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype.startswith("int"):
        return RNG.integers(-3, 4, shape).astype(dtype)
    if kind == "cumprod":  # keep long products near 1
        return RNG.uniform(0.97, 1.03, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


@pytest.fixture(scope="module")
def scan_results():
    bb = BlockBuilder()
    params, arrays, refs = [], [], []
    for i, (shape, dtype, attrs) in enumerate(CASES):
        for kind in ("cumsum", "cumprod"):
            params.append(tvar(f"x{len(params)}", shape, dtype))
            a = _sample(shape, dtype, kind)
            arrays.append(a)
            refs.append((kind, i, np_scan(kind, a, **attrs)))
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for p, (kind, i, _) in zip(params, refs):
                fn = op.cumsum if kind == "cumsum" else op.cumprod
                outs.append(bb.emit_output(fn(p, **CASES[i][2])))
        bb.emit_func_output(g.Tuple(tuple(outs)))
    exe = kiln.build(bb.get())
    return list(zip(refs, exe(*arrays)))


@pytest.mark.parametrize("index", range(len(CASES)))
def test_numerics_match_numpy(scan_results, index):
    for (kind, i, ref), out in scan_results:
        if i != index:
            continue
        assert out.dtype == ref.dtype and out.shape == ref.shape, (kind, CASES[i])
        if ref.dtype.kind == "f":
            tol = 1e-3 if CASES[i][1] == "float16" else 1e-5
            np.testing.assert_allclose(out, ref, rtol=tol, atol=tol, err_msg=str((kind, i)))
        else:
            np.testing.assert_array_equal(out, ref, err_msg=str((kind, i)))


def test_symbolic_length():
    n = tir.Var("n", "int64")
    x = tvar("x", (n, 3))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_output(op.cumsum(x, axis=0, exclusive=True))
            b = bb.emit_output(op.cumprod(x))
        bb.emit_func_output(g.Tuple((a, b)))
    exe = kiln.build(bb.get())
    for rows in (1, 5):
        v = RNG.standard_normal((rows, 3)).astype("float32")
        ya, yb = exe(v)
        np.testing.assert_allclose(ya, np_scan("cumsum", v, 0, exclusive=True), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(yb, np_scan("cumprod", v), rtol=1e-5, atol=1e-6)


def test_gradient_rules_skip_integer_inputs():
    for name in ("cumsum", "cumprod"):
        x = tvar("x", (2, 3), "int32")
        bb = BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                call = bb.normalize(get_op_def(name)(x, axis=1))
                grad = g.Var("g", call.struct_info)
                assert get_op_def(name).gradient(call, grad, bb) == [None]
                bb.emit_output(call)
            bb.emit_func_output(x)


def test_gradient_through_the_pass():
    """float32 input, float64 result: the adjoint comes back in the input's dtype."""
    from kiln.transform import Gradient

    x = tvar("x", (2, 3))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.cumprod(x, axis=0, dtype="float64"))
            loss = bb.emit_output(op.sum(y))
        bb.emit_func_output(loss)
    exe = kiln.build(Gradient("main")(bb.get()))
    a = np.array([[2.0, 0.0, -1.0], [3.0, 5.0, 0.5]], "float32")
    value, (dx,) = exe["main_adjoint"](a)
    assert dx.dtype == np.float32
    np.testing.assert_allclose(float(value), a.sum(0).sum() - a[1].sum() + (a[0] * a[1]).sum(),
                               rtol=1e-6)
    np.testing.assert_allclose(dx, [[1 + a[1, 0], 1 + a[1, 1], 1 + a[1, 2]], a[0]], rtol=1e-6)
