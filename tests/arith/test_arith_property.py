"""Property tests: simplification never changes the value of an expression.

Random integer expressions over bounded variables are evaluated before and after
``Analyzer.simplify`` by a tiny reference evaluator (floor semantics for ``//``/``%``, C
truncation for truncdiv/truncmod) at random points of the variables' ranges.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln import tir
from kiln.arith import Analyzer
from kiln.ir import structural_equal


def _truncdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _wrap(dt, v: int) -> int:
    if dt.is_bool:
        return 1 if v else 0
    if dt.is_float:
        return v
    bits = dt.bits
    v &= (1 << bits) - 1
    if dt.is_int and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


_BIN = {
    tir.Add: lambda a, b: a + b,
    tir.Sub: lambda a, b: a - b,
    tir.Mul: lambda a, b: a * b,
    tir.FloorDiv: lambda a, b: a // b,
    tir.FloorMod: lambda a, b: a % b,
    tir.Div: _truncdiv,
    tir.Mod: lambda a, b: a - b * _truncdiv(a, b),
    tir.Min: min,
    tir.Max: max,
    tir.EQ: lambda a, b: int(a == b),
    tir.NE: lambda a, b: int(a != b),
    tir.LT: lambda a, b: int(a < b),
    tir.LE: lambda a, b: int(a <= b),
    tir.GT: lambda a, b: int(a > b),
    tir.GE: lambda a, b: int(a >= b),
    tir.And: lambda a, b: int(bool(a) and bool(b)),
    tir.Or: lambda a, b: int(bool(a) or bool(b)),
}


def evaluate(e, env: dict):
    """Value of ``e`` with variables looked up in ``env`` (a dict Var -> int)."""
    t = type(e)
    if t is tir.IntImm or t is tir.FloatImm:
        return e.value
    if isinstance(e, tir.Var):
        return env[e]
    if t in _BIN:
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        f = _BIN[t]
        if isinstance(a, list) or isinstance(b, list):
            n = e.dtype.lanes
            a = a if isinstance(a, list) else [a] * n
            b = b if isinstance(b, list) else [b] * n
            return [f(x, y) for x, y in zip(a, b)]
        return f(a, b)
    if t is tir.Not:
        a = evaluate(e.a, env)
        return [int(not x) for x in a] if isinstance(a, list) else int(not a)
    if t is tir.Select:
        c = evaluate(e.condition, env)
        tv, fv = evaluate(e.true_value, env), evaluate(e.false_value, env)
        if isinstance(c, list):
            return [x if ci else y for ci, x, y in zip(c, tv, fv)]
        return tv if c else fv
    if t is tir.Cast:
        v = evaluate(e.value, env)
        if isinstance(v, list):
            return [_wrap(e.dtype, x) for x in v]
        return _wrap(e.dtype, v)
    if t is tir.Ramp:
        base, stride = evaluate(e.base, env), evaluate(e.stride, env)
        return [base + k * stride for k in range(e.lanes)]
    if t is tir.Broadcast:
        return [evaluate(e.value, env)] * e.lanes
    raise NotImplementedError(t.__name__)


# ---- random expressions ---------------------------------------------------------------------
I = tir.Var("i")  # [0, 16)
J = tir.Var("j")  # [0, 8)
X = tir.Var("x")  # [-40, 40]
K = tir.Var("k", "int64")  # [0, 100)
RANGES = {I: (0, 16), J: (0, 8), X: (-40, 41), K: (0, 100)}
VARS32 = [I, J, X]


def _analyzer() -> Analyzer:
    ana = Analyzer()
    for v, (lo, hi) in RANGES.items():
        ana.bind(v, tir.Range.from_bounds(tir.const(v.dtype, lo), tir.const(v.dtype, hi)))
    return ana


_small = st.integers(-20, 20)
_divisor = st.sampled_from([1, 2, 3, 4, 8, 16, -1, -3, -4])
_posdiv = st.sampled_from([1, 2, 3, 4, 8, 16, 32])


def _leaf():
    return st.one_of(st.sampled_from(VARS32), _small.map(lambda v: tir.const("int32", v)))


def _extend(children):
    bin_ops = st.sampled_from(["+", "-", "*", "min", "max"])
    return st.one_of(
        st.tuples(bin_ops, children, children).map(_make_bin),
        st.tuples(st.sampled_from(["//", "%"]), children, _posdiv).map(_make_div),
        st.tuples(st.sampled_from(["//", "%", "tdiv", "tmod"]), children, _divisor).map(
            _make_div),
        st.tuples(children, _small).map(lambda t: t[0] * t[1]),
        st.tuples(st.sampled_from(["<", "<=", "==", "!="]), children, children, children,
                  children).map(_make_select),
        st.tuples(st.sampled_from(["//", "%"]), children, children).map(_make_var_div),
        children.map(lambda a: tir.cast("int32", tir.cast("int64", a) * 2 + K)),
        st.tuples(children, children, children, children).map(_make_logic_select),
    )


def _make_var_div(t):
    """Division by a provably positive non-constant divisor."""
    op, a, d = t
    d = tir.max(d, 0) % 7 + 1 + J
    return a // d if op == "//" else a % d


def _make_logic_select(t):
    a, b, x, y = t
    cond = ((a < b) & ~(x >= y)) | (tir.eq(a % 2, 0) & (b <= 3))
    return tir.select(cond, a + x, b - y)


def _make_bin(t):
    op, a, b = t
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return tir.min(a, b) if op == "min" else tir.max(a, b)


def _make_div(t):
    op, a, c = t
    if op == "//":
        return a // c
    if op == "%":
        return a % c
    if op == "tdiv":
        return tir.truncdiv(a, c)
    return tir.truncmod(a, c)


def _make_select(t):
    op, a, b, x, y = t
    cond = {"<": a < b, "<=": a <= b, "==": tir.eq(a, b), "!=": tir.ne(a, b)}[op]
    return tir.select(cond, x, y)


int_exprs = st.recursive(_leaf(), _extend, max_leaves=12)


def _envs():
    return st.fixed_dictionaries({v: st.integers(lo, hi - 1) for v, (lo, hi) in RANGES.items()})


_EXAMPLES = int(os.environ.get("ARITH_EXAMPLES", "200"))
_SETTINGS = settings(max_examples=_EXAMPLES, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(int_exprs, st.lists(_envs(), min_size=3, max_size=3))
def test_simplify_preserves_value(e, envs):
    s = _analyzer().simplify(e)
    for env in envs:
        assert evaluate(e, env) == evaluate(s, env), f"{e}  ->  {s}  at {env}"


@_SETTINGS
@given(int_exprs, _envs())
def test_simplify_preserves_value_int64_mix(e, env):
    mixed = e.astype("int64") * 3 + K - (K // 4) * 4
    s = _analyzer().simplify(mixed)
    assert s.dtype == "int64"
    _assert_consistent_dtypes(s)
    assert evaluate(mixed, env) == evaluate(s, env), f"{mixed}  ->  {s}"


@_SETTINGS
@given(int_exprs, _envs())
def test_const_int_bound_contains_value(e, env):
    ana = _analyzer()
    b = ana.const_int_bound(e)
    v = evaluate(e, env)
    assert b.min_value <= v <= b.max_value, f"{e}: {v} not in {b}"


@_SETTINGS
@given(int_exprs, int_exprs, _envs())
def test_can_prove_is_sound(a, b, env):
    ana = _analyzer()
    va, vb = evaluate(a, env), evaluate(b, env)
    if ana.can_prove(a <= b):
        assert va <= vb, f"proved {a} <= {b} but {va} > {vb}"
    if ana.can_prove(a < b):
        assert va < vb
    if ana.can_prove_equal(a, b):
        assert va == vb


@_SETTINGS
@given(int_exprs)
def test_simplify_is_idempotent(e):
    ana = _analyzer()
    s = ana.simplify(e)
    assert structural_equal(ana.simplify(s), s), f"{e} -> {s} -> {ana.simplify(s)}"


@settings(_SETTINGS, max_examples=max(_EXAMPLES // 3, 20))
@given(int_exprs, st.sampled_from([2, 4, 8]), _envs())
def test_vector_forms_preserve_lanes(e, lanes, env):
    base = e * lanes
    ramp = tir.Ramp(base, tir.const("int32", 1), lanes)
    for c in (2, 4, 8, 16):
        bc = tir.Broadcast(tir.const("int32", c), lanes)
        for v in (ramp // bc, ramp % bc, ramp * bc + bc, ramp - tir.Broadcast(e, lanes)):
            s = _analyzer().simplify(v)
            assert s.dtype == v.dtype
            assert evaluate(v, env) == evaluate(s, env), f"{v} -> {s}"


@_SETTINGS
@given(int_exprs, int_exprs, _envs())
def test_constraint_scope_is_sound(cond_a, cond_b, env):
    ana = _analyzer()
    holds = evaluate(cond_a, env) < evaluate(cond_b, env)
    with ana.constraint_scope(cond_a < cond_b):
        b = ana.const_int_bound(X)
        if holds:  # the assumption is true at env: every conclusion must be too
            assert b.min_value <= env[X] <= b.max_value
            assert ana.can_prove(cond_a < cond_b)
            s = ana.simplify(cond_a - cond_b + X)
            assert evaluate(s, env) == evaluate(cond_a - cond_b + X, env)
    assert ana.const_int_bound(X) == (-40, 40)


def _assert_consistent_dtypes(e) -> None:
    def check(n):
        if isinstance(n, tir.BinaryOp):
            assert n.a.dtype == n.b.dtype, f"mixed operands in {n}"
            if not isinstance(n, (tir.CmpOp, tir.And, tir.Or)):
                assert n.dtype == n.a.dtype, f"result dtype differs in {n}"

    tir.post_order_visit(e, check)


# ---- symbolic extents -----------------------------------------------------------------------
NV = tir.Var("n", "int64")
KV = tir.Var("kv", "int64")  # [0, n)
_sym_leaf = st.one_of(st.sampled_from([NV, KV]), st.integers(-9, 9).map(lambda v: tir.const(
    "int64", v)))


def _sym_extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*", "min", "max"]), children, children).map(
            _make_bin),
        st.tuples(st.sampled_from(["//", "%"]), children, _posdiv).map(_make_div),
    )


sym_exprs = st.recursive(_sym_leaf, _sym_extend, max_leaves=8)


@_SETTINGS
@given(sym_exprs, sym_exprs, st.integers(1, 60), st.data())
def test_symbolic_range_facts_are_sound(a, b, n_val, data):
    ana = Analyzer()
    ana.bind(KV, tir.Range(tir.const("int64", 0), NV))
    env = {NV: n_val, KV: data.draw(st.integers(0, n_val - 1))}
    va, vb = evaluate(a, env), evaluate(b, env)
    assert evaluate(ana.simplify(a), env) == va
    if ana.can_prove(a < b):
        assert va < vb, f"proved {a} < {b}"
    if ana.can_prove(a >= b):
        assert va >= vb, f"proved {a} >= {b}"
    with ana.constraint_scope(a <= b):
        if va <= vb:
            assert evaluate(ana.simplify(tir.min(a, b) + tir.max(a - b, 0)), env) == va
