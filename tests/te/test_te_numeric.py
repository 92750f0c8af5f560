"""Numeric meaning of create_prim_func output, checked with a tiny block-TIR interpreter.

The interpreter runs the block form directly (loops, block bindings, init at the first reduction
iteration, stores), so these tests pin the semantics of the generated TIR against numpy without
needing codegen.
"""

import math

import numpy as np

from kiln import te, tir
from kiln.tir import expr as E
from kiln.tir.stmt import Block, BlockRealize, BufferStore, For, SeqStmt

_BIN = {
    E.Add: lambda a, b: a + b, E.Sub: lambda a, b: a - b, E.Mul: lambda a, b: a * b,
    E.Div: lambda a, b: a / b, E.FloorDiv: lambda a, b: a // b, E.FloorMod: lambda a, b: a % b,
    E.Min: min, E.Max: max, E.EQ: lambda a, b: a == b, E.NE: lambda a, b: a != b,
    E.LT: lambda a, b: a < b, E.LE: lambda a, b: a <= b, E.GT: lambda a, b: a > b,
    E.GE: lambda a, b: a >= b, E.And: lambda a, b: a and b, E.Or: lambda a, b: a or b,
}
_CALL = {"exp": math.exp, "log": math.log, "sqrt": math.sqrt, "tanh": math.tanh}


class Interp:
    def __init__(self, arrays):
        self.arrays = arrays  # id(buffer) -> np.ndarray
        self.env = {}

    def ev(self, e):
        t = type(e)
        if isinstance(e, E.Var):
            return self.env[id(e)]
        if t in (E.IntImm, E.FloatImm):
            return e.value
        if t in _BIN:
            return _BIN[t](self.ev(e.a), self.ev(e.b))
        if t is E.Not:
            return not self.ev(e.a)
        if t is E.Select:
            return self.ev(e.true_value) if self.ev(e.condition) else self.ev(e.false_value)
        if t is E.Cast:
            v = self.ev(e.value)
            return float(v) if e.dtype.is_float else int(v)
        if t is E.Call:
            return _CALL[e.op](*[self.ev(a) for a in e.args])
        if t is E.BufferLoad:
            return self.arrays[id(e.buffer)][tuple(int(self.ev(i)) for i in e.indices)].item()
        raise NotImplementedError(t.__name__)

    def run(self, s):
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self.run(x)
        elif isinstance(s, For):
            lo, ext = self.ev(s.min), self.ev(s.extent)
            for v in range(lo, lo + ext):
                self.env[id(s.loop_var)] = v
                self.run(s.body)
        elif isinstance(s, BlockRealize):
            if not self.ev(s.predicate):
                return
            blk: Block = s.block
            for iv, val in zip(blk.iter_vars, s.iter_values):
                self.env[id(iv.var)] = self.ev(val)
            for buf in blk.alloc_buffers:
                shape = tuple(int(self.ev(d)) for d in buf.shape)
                self.arrays[id(buf)] = np.zeros(shape, buf.dtype.to_numpy())
            first = all(
                self.env[id(iv.var)] == self.ev(iv.dom.min)
                for iv in blk.iter_vars if iv.iter_type == E.IterType.COMM_REDUCE
            )
            if blk.init is not None and first:
                self.run(blk.init)
            self.run(blk.body)
        elif isinstance(s, BufferStore):
            idx = tuple(int(self.ev(i)) for i in s.indices)
            self.arrays[id(s.buffer)][idx] = self.ev(s.value)
        else:
            raise NotImplementedError(type(s).__name__)


def run_func(f, *arrays):
    bufs = f.buffers
    arrs = {id(b): a for b, a in zip(bufs, arrays)}
    it = Interp(arrs)
    for b, a in zip(bufs, arrays):  # bind symbolic dims from the arrays' shapes
        for d, n in zip(b.shape, a.shape):
            if isinstance(d, E.Var):
                it.env[id(d)] = n
    it.run(f.body)


def test_matmul():
    A = te.placeholder((4, 6), name="A")
    B = te.placeholder((6, 5), name="B")
    k = te.reduce_axis((0, 6), name="k")
    C = te.compute((4, 5), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    f = te.create_prim_func([A, B, C])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 5))
    c = np.full((4, 5), 123.0)  # garbage: init must overwrite it
    run_func(f, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-12)


def test_softmax_multi_stage_symbolic_rows():
    n = te.var("n")
    X = te.placeholder((n, 7), "float64", name="X")
    k1 = te.reduce_axis((0, 7), name="k1")
    mx = te.compute((n,), lambda i: te.max(X[i, k1], axis=k1), name="mx")
    e = te.compute((n, 7), lambda i, j: tir.exp(X[i, j] - mx[i]), name="e")
    k2 = te.reduce_axis((0, 7), name="k2")
    s = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    Y = te.compute((n, 7), lambda i, j: e[i, j] / s[i], name="Y")
    f = te.create_prim_func([X, Y])
    assert [b.name for b in f.body.block.alloc_buffers] == ["mx", "e", "s"]
    x = np.random.default_rng(1).standard_normal((3, 7))
    y = np.zeros_like(x)
    run_func(f, x, y)
    ref = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, ref / ref.sum(axis=1, keepdims=True), rtol=1e-12)


def test_masked_offset_reduction_and_padding():
    A = te.placeholder((3, 10), "float64", name="A")
    k = te.reduce_axis((2, 9), name="k")
    S = te.compute((3,), lambda i: te.sum(A[i, k], axis=k, where=tir.eq(k % 2, 0)), name="S")
    P = te.compute(
        (3, 12),
        lambda i, j: te.if_then_else(tir.logical_and(j >= 1, j < 11), A[i, j - 1], 0.0),
        name="P",
    )
    f = te.create_prim_func([A, S, P])
    a = np.random.default_rng(2).standard_normal((3, 10))
    s, p = np.zeros(3), np.ones((3, 12))
    run_func(f, a, s, p)
    np.testing.assert_allclose(s, a[:, 2:9:2].sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(p, np.pad(a, ((0, 0), (1, 1))))


def test_max_reduction_with_init_and_two_axes():
    A = te.placeholder((2, 3, 4), "float64", name="A")
    r1 = te.reduce_axis((0, 3), name="r1")
    r2 = te.reduce_axis((0, 4), name="r2")
    M = te.compute((2,), lambda b: te.max(A[b, r1, r2], axis=[r1, r2], init=0.5), name="M")
    f = te.create_prim_func([A, M])
    a = np.random.default_rng(3).standard_normal((2, 3, 4)) - 1.0
    m = np.zeros(2)
    run_func(f, a, m)
    np.testing.assert_allclose(m, np.maximum(a.max(axis=(1, 2)), 0.5))
