"""Row max/sum of softmax, log_softmax and layer_norm: vector partial results (rfactor) when
the row length is a multiple of the vector width, the scalar loop otherwise; both vs numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as codegen_c
from kiln.op.registry import get_op_def
from kiln.schedule import lookup_schedule
from kiln.target import Target
from kiln.testing.op_testing import check, run_cases
from kiln.tir.schedule import Schedule

RNG = np.random.default_rng(5)
TARGET = Target("c")
LANES = TARGET.vector_lanes("float32")


def _rand(shape, scale=1.0, offset=0.0):
    return (RNG.standard_normal(shape) * scale + offset).astype("float32")


def _softmax_ref(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm_ref(x, gamma, beta, eps=1e-5):
    x = x.astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _scheduled(name, shapes, **attrs):
    opdef = get_op_def(name)
    phs = [te.placeholder(s, "float32", name=f"in{i}") for i, s in enumerate(shapes)]
    out = opdef.compute(*phs, attrs=opdef.make_attrs(**attrs))
    sch = Schedule(te.create_prim_func([*phs, out]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    return sch.func


def _rf_blocks(func) -> list[str]:
    names: list[str] = []
    tir.post_order_visit(func.body, lambda n: names.append(n.name_hint)
                         if isinstance(n, tir.Block) and n.name_hint.endswith("_rf") else None)
    return names


@pytest.mark.parametrize("n", [LANES * 2, LANES * 16, 100, 13, LANES])
def test_which_rows_get_vector_partials(n):
    rf = _rf_blocks(_scheduled("nn.softmax", [(6, n)]))
    # a full or half register of partials, when the row holds at least two of them
    width = next((w for w in (LANES, LANES // 2) if w >= 4 and n % w == 0), None)
    expect = width is not None and n >= 2 * width
    assert bool(rf) == expect, (n, rf)
    if expect:
        assert rf == ["softmax_max_rf", "softmax_sum_rf"]
    ln = _rf_blocks(_scheduled("nn.layer_norm", [(3, n), (n,), (n,)]))
    assert bool(ln) == expect


@pytest.mark.parametrize("n, partials", [(LANES * 16, 2 * LANES), (LANES * 6, 2 * LANES),
                                         (LANES * 3, LANES)])
def test_row_partials_run_in_independent_chains(n, partials):
    """Rows of an even number of vectors accumulate in ROW_REDUCTION_CHAINS (2) vectors of
    partials, so consecutive steps do not wait on each other; an odd count keeps one."""
    widths = []
    tir.post_order_visit(
        _scheduled("nn.softmax", [(6, n)]).body,
        lambda b: widths.append(b.writes[0].buffer.shape[-1].value)
        if isinstance(b, tir.Block) and b.name_hint.endswith("_rf") else None)
    assert widths == [partials, partials]


def test_row_ops_match_numpy_at_several_lengths():
    cases, refs = [], []
    for shape in [(4, 64), (3, 5, 128), (2, 13), (7, 100), (2, 768), (3, 24), (5, 8), (3, 1)]:
        x = _rand(shape, scale=20.0)  # large logits: the row max matters
        cases.append(("nn.softmax", [x], {}))
        refs.append(_softmax_ref(x))
        cases.append(("nn.log_softmax", [x], {}))
        refs.append(np.log(_softmax_ref(x)))
        xl, gm, bt = _rand(shape, 3.0, 5.0), _rand(shape[-1:]), _rand(shape[-1:])
        cases.append(("nn.layer_norm", [xl, gm, bt], dict(epsilon=1e-5)))
        refs.append(_layer_norm_ref(xl, gm, bt))
    for out, ref in zip(run_cases(cases), refs):
        check(out, ref, rtol=2e-5)


def test_max_propagates_nan_and_inf_rows():
    x = _rand((3, 4 * LANES))
    x[0, 5] = np.nan
    x[1, :] = -np.inf
    x[1, 3] = 0.0
    (out,) = run_cases([("nn.softmax", [x], {})])
    assert np.isnan(out[0]).all()
    np.testing.assert_allclose(out[1], np.eye(4 * LANES)[3], atol=0)
    check(out[2], _softmax_ref(x[2]))


def test_symbolic_rows_keep_the_scalar_path():
    n = te.size_var("n")
    funcs = {
        "sm": _scheduled("nn.softmax", [(4, n)]),
        "ln": _scheduled("nn.layer_norm", [(3, n), (n,), (n,)]),
        "sm_batch": _scheduled("nn.softmax", [(n, 64)]),
    }
    assert not _rf_blocks(funcs["sm"]) and not _rf_blocks(funcs["ln"])
    assert _rf_blocks(funcs["sm_batch"])  # a symbolic row count does not matter
    mod = codegen_c.build(funcs, TARGET)
    for length in (5, 64):
        x = _rand((4, length), 10.0)
        out = np.full_like(x, np.nan)
        mod["sm"](x, out)
        check(out, _softmax_ref(x))
        x, gm, bt = _rand((3, length), 2.0, 3.0), _rand((length,)), _rand((length,))
        out = np.full_like(x, np.nan)
        mod["ln"](x, gm, bt, out)
        check(out, _layer_norm_ref(x, gm, bt), rtol=2e-5)
    x = _rand((3, 64), 10.0)
    out = np.full_like(x, np.nan)
    mod["sm_batch"](x, out)
    check(out, _softmax_ref(x))


@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "prod"])
def test_reductions_over_the_contiguous_axis(name):
    """Innermost axes of 64+ elements that kiln.op.reduce's interleaved partials do not take
    (not multiples of 8) get vector partial results from the default reduction schedule;
    shorter ones stay scalar. Results match numpy either way."""
    ref = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod}[name]
    configs = [((64, 100), (1,)), ((3, 4, 76), (1, 2)), ((9, 68), (-1,)), ((5, 40), (1,)),
               ((6, 7), (1,))]
    cases = [(name, [_rand(shape, 0.3, 1.0 if name == "prod" else 0.0)], dict(axis=axes))
             for shape, axes in configs]
    for (_, (x,), attrs), out in zip(cases, run_cases(cases)):
        check(out, ref(x.astype(np.float64), axis=attrs["axis"]), rtol=2e-5)
    opdef = get_op_def(name)
    for length, expect in ((100, True), (40, False)):
        x = te.placeholder((64, length), "float32", name="x")
        sch = Schedule(te.create_prim_func(
            [x, opdef.compute(x, attrs=opdef.make_attrs(axis=(1,)))]))
        lookup_schedule(opdef.name, "c")(sch, TARGET)
        assert bool(_rf_blocks(sch.func)) == expect


def test_layer_norm_over_two_axes_and_float16_rows():
    """Two reduced axes (partials over the inner one) and float16 data (float32 partials)."""
    x, gm, bt = _rand((3, 5, 4 * LANES), 2.0, 4.0), _rand((5, 4 * LANES)), _rand((5, 4 * LANES))
    assert _rf_blocks(_scheduled("nn.layer_norm", [x.shape, gm.shape, bt.shape], axes=(1, 2)))
    xh = _rand((5, 8 * LANES), 3.0).astype("float16")
    gh, bh = _rand((8 * LANES,)).astype("float16"), _rand((8 * LANES,)).astype("float16")
    ln2, sm16, ln16 = run_cases([
        ("nn.layer_norm", [x, gm, bt], dict(axes=(1, 2), epsilon=1e-5)),
        ("nn.softmax", [xh], {}),
        ("nn.layer_norm", [xh, gh, bh], dict(epsilon=1e-5)),
    ])
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=(1, 2), keepdims=True)
    var = ((x64 - mu) ** 2).mean(axis=(1, 2), keepdims=True)
    check(ln2, (x64 - mu) / np.sqrt(var + 1e-5) * gm + bt, rtol=2e-5)
    assert sm16.dtype == np.float16 and ln16.dtype == np.float16
    check(sm16.astype(np.float64), _softmax_ref(xh), rtol=2e-3)
    check(ln16.astype(np.float64), _layer_norm_ref(xh, gh.astype(np.float64), bh), rtol=4e-3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_softmax_in_dtype_rounds_every_step(dtype):
    """``in_dtype=True``: x - max, exp and the quotient rounded to the 16-bit dtype, the row sum
    accumulated in bfloat16 (every add rounded, in index order on short rows) or, for float16,
    in float32 and rounded once: numpy's arithmetic on these dtypes, bit for bit. The default
    stays float32 with one rounding; float32 inputs ignore the flag (the same kernel)."""
    x = (RNG.standard_normal((7, 29)) * 3).astype(dtype)
    x32 = _rand((4, 2 * LANES))
    got, default, f32, f32_flag = run_cases([
        ("nn.softmax", [x], dict(in_dtype=True)), ("nn.softmax", [x], {}),
        ("nn.softmax", [x32], {}), ("nn.softmax", [x32], dict(in_dtype=True))])
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    check(default.astype(np.float64), _softmax_ref(x), rtol=2 ** -8)
    np.testing.assert_array_equal(f32, f32_flag)
    opdef = get_op_def("nn.softmax")
    ph = te.placeholder((4, 64), "float32", name="x")
    plain, flagged = (opdef.compute(ph, attrs=opdef.make_attrs(in_dtype=f)) for f in (False, True))
    assert str(te.create_prim_func([ph, plain])) == str(te.create_prim_func([ph, flagged]))
