"""Random operators (kiln.op.random): the Philox-4x32-10 generator against its published
known-answer vectors and an independent numpy implementation, statistical checks of every
distribution (moments, Kolmogorov-Smirnov, chi-square, frequencies), and reproducibility: a seed
gives the same tensor on every build and run, a fresh seed (``random_seed``) differs per run."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te, tir
from kiln.codegen import c as cg
from kiln.ir import KilnError, StructInfoError
from kiln.op.random import LetChain, philox4x32

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = np.uint64(0xFFFFFFFF)


def philox_ref(c: list[np.ndarray], k: list[np.ndarray]) -> list[np.ndarray]:
    """Philox-4x32-10 in numpy (uint64 arrays holding 32-bit words)."""
    c = [np.asarray(x, np.uint64) for x in c]
    k0, k1 = (np.asarray(x, np.uint64) for x in k)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(W0)) & MASK, (k1 + np.uint64(W1)) & MASK
        p0, p1 = c[0] * np.uint64(M0), c[2] * np.uint64(M1)
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & MASK, (p0 >> np.uint64(32)) ^ c[3] ^ k1,
             p0 & MASK]
    return c


def _seed(value: int) -> g.Constant:
    return g.const(np.array(value, "uint64"))


def _run(build_outputs, inputs=()):
    bb = g.BlockBuilder()
    params = [g.Var(f"x{k}", g.TensorStructInfo(a.shape, str(a.dtype)))
              for k, a in enumerate(inputs)]
    with bb.function("main"):
        with bb.dataflow():
            outs = [bb.emit_output(o) for o in build_outputs(*params)]
        bb.emit_func_output(g.Tuple(outs), params=params)
    ex = kiln.build(bb.get())
    return ex, ex(*inputs)


def _ks_uniform(u: np.ndarray, low: float, high: float) -> float:
    x = np.sort((u.astype(np.float64).ravel() - low) / (high - low))
    n = x.size
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - x), np.max(x - (i - 1) / n)))


def _ks_normal(z: np.ndarray) -> float:
    x = np.sort(z.astype(np.float64).ravel())
    n = x.size
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n)))


# ---------------------------------------------------------------------------------------------
# the generator
# ---------------------------------------------------------------------------------------------
def test_philox_known_answers():
    """Random123's known-answer vectors for philox4x32_10, computed by a TIR kernel."""
    kat = [([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
           ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
           ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1])]
    n = len(kat)
    C = te.placeholder((n, 4), "uint32", name="C")
    K = te.placeholder((n, 2), "uint32", name="K")

    def f(i, j):
        chain = LetChain()
        w = philox4x32(tuple(C[i, q] for q in range(4)), (K[i, 0], K[i, 1]), chain)
        pick = w[3]
        for q in (2, 1, 0):
            pick = tir.select(tir.eq(j, q), w[q], pick)
        return chain.wrap(pick)

    out = te.compute((n, 4), f, name="philox")
    mod = cg.build({"philox": te.create_prim_func([C, K, out])})
    c = np.array([x[0] for x in kat], np.uint32)
    k = np.array([x[1] for x in kat], np.uint32)
    got = np.zeros((n, 4), np.uint32)
    mod["philox"](c, k, got)
    np.testing.assert_array_equal(got, np.array([x[2] for x in kat], np.uint32))
    ref = philox_ref([c[:, q] for q in range(4)], [k[:, 0], k[:, 1]])
    np.testing.assert_array_equal(got, np.stack(ref, axis=1).astype(np.uint32))


def test_uniform_is_philox_of_seed_and_element_index():
    """float32 uniforms are ``(word0 >> 8) * 2**-24`` of Philox(counter=(index, 0, stream, 0),
    key=seed): exact equality with the numpy implementation, so every element, thread and
    vector lane computes its own number."""
    seed, shape = 0x0123456789ABCDEF, (300, 701)  # parallel loop
    _, (u,) = _run(lambda: [op.random_uniform(_seed(seed), shape=shape, stream=5)])
    idx = np.arange(u.size, dtype=np.uint64)
    zero = np.zeros_like(idx)
    w = philox_ref([idx & MASK, idx >> np.uint64(32), zero + np.uint64(5), zero],
                   [np.uint64(seed) & MASK, np.uint64(seed) >> np.uint64(32)])
    want = (w[0] >> np.uint64(8)).astype(np.float64) * 2.0**-24
    np.testing.assert_array_equal(u.ravel(), want.astype(np.float32))


# ---------------------------------------------------------------------------------------------
# distributions
# ---------------------------------------------------------------------------------------------
def test_uniform_statistics():
    n = 1 << 18
    _, (u, d) = _run(lambda: [op.random_uniform(_seed(1), shape=(n,), low=-2.0, high=3.0),
                              op.random_uniform(_seed(1), shape=(n,), dtype="float64")])
    assert u.dtype == np.float32 and d.dtype == np.float64
    assert u.min() >= -2.0 and u.max() < 3.0 and d.min() >= 0.0 and d.max() < 1.0
    sd_mean = 5 / math.sqrt(12 * n)  # standard deviation of the mean
    assert abs(u.mean() - 0.5) < 6 * sd_mean
    assert abs(u.var() / (25 / 12) - 1) < 0.02
    assert _ks_uniform(u, -2.0, 3.0) < 1.63 / math.sqrt(n)  # the 1% critical value
    assert _ks_uniform(d, 0.0, 1.0) < 1.63 / math.sqrt(n)
    counts = np.bincount(np.floor((u + 2.0) / 5.0 * 64).astype(int), minlength=64)
    chi2 = float(((counts - n / 64) ** 2 / (n / 64)).sum())
    assert chi2 < 110  # 63 degrees of freedom: p(chi2 > 110) < 2e-4
    lag = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(lag) < 5 / math.sqrt(n)
    # float64 uses 53 random bits: not just float32 values widened
    assert np.mean(d.astype(np.float32).astype(np.float64) != d) > 0.99


def test_normal_statistics_and_half_types():
    n = 1 << 17
    _, (z, w, h) = _run(lambda: [
        op.random_normal(_seed(7), shape=(n,), mean=1.5, scale=2.0),
        op.random_normal(_seed(8), shape=(n,), dtype="float64"),
        op.random_normal(_seed(9), shape=(256, 64), dtype="float16", mean=-3.0, scale=0.5)])
    assert z.dtype == np.float32 and w.dtype == np.float64 and h.dtype == np.float16
    assert np.isfinite(z).all() and np.isfinite(w).all() and np.isfinite(h).all()
    assert abs(z.mean() - 1.5) < 6 * 2.0 / math.sqrt(n)
    assert abs(z.std() / 2.0 - 1) < 0.02
    assert _ks_normal((z - 1.5) / 2.0) < 1.63 / math.sqrt(n)
    assert _ks_normal(w) < 1.63 / math.sqrt(n)
    skew = float(np.mean(w**3)) / float(np.mean(w**2)) ** 1.5
    kurt = float(np.mean(w**4)) / float(np.mean(w**2)) ** 2
    assert abs(skew) < 0.05 and abs(kurt - 3) < 0.1
    hf = h.astype(np.float64)
    assert abs(hf.mean() + 3.0) < 0.02 and abs(hf.std() - 0.5) < 0.02


def test_bernoulli_frequencies_and_dtypes():
    probs = np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32)
    reps = 40000
    p = np.tile(probs, reps).reshape(reps, 5)
    _, (b, fb, i8) = _run(lambda x: [op.bernoulli(x, _seed(3), dtype="bool"),
                                     op.bernoulli(x, _seed(4)),
                                     op.bernoulli(op.cast(x, "float64"), _seed(5), dtype="int8")],
                          [p])
    assert b.dtype == np.bool_ and fb.dtype == np.float32 and i8.dtype == np.int8
    assert set(np.unique(fb)) <= {0.0, 1.0} and set(np.unique(i8)) <= {0, 1}
    for out in (b, fb, i8):
        freq = out.astype(np.float64).mean(axis=0)
        assert freq[0] == 0.0 and freq[4] == 1.0
        sd = np.sqrt(probs * (1 - probs) / reps)
        assert np.all(np.abs(freq[1:4] - probs[1:4]) < 5 * sd[1:4]), freq


def test_categorical_sample_counts():
    probs = np.array([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]], np.float64)
    cdf = np.cumsum(probs * 7.0, axis=1)  # unnormalized cumulative weights
    s = 50000
    _, (idx,) = _run(lambda c: [op.categorical_sample(
        c, op.random_uniform(_seed(11), shape=(2, s), dtype="float64"), dtype="int64")], [cdf])
    assert idx.shape == (2, s) and idx.dtype == np.int64
    assert idx.min() >= 0 and idx.max() <= 3
    for row in range(2):
        counts = np.bincount(idx[row], minlength=4)
        p = probs[row]
        assert counts[p == 0].sum() == 0  # a class of weight 0 is never drawn
        sd = np.sqrt(s * p * (1 - p))
        assert np.all(np.abs(counts - s * p) <= 5 * sd + 1e-9), counts


# ---------------------------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------------------------
def test_seeded_results_are_reproducible_and_seeds_differ():
    def outs():
        return [op.random_uniform(_seed(42), shape=(64, 33)),
                op.random_uniform(_seed(43), shape=(64, 33)),
                op.random_normal(_seed(42), shape=(64, 33), stream=1)]

    ex1, a = _run(outs)
    _, b = _run(outs)  # a second build
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(ex1()[0], a[0])  # a second run
    assert np.mean(a[0] == a[1]) < 0.01


def test_unseeded_ops_draw_a_fresh_seed_per_run():
    def outs():
        return [op.random_uniform(op.random_seed(), shape=(1000,)),
                op.random_uniform(op.random_seed(), shape=(1000,))]

    ex, (u1, u2) = _run(outs)
    (v1, v2) = ex()
    assert np.mean(u1 == u2) < 0.01  # two ops, two seeds
    assert np.mean(u1 == v1) < 0.01  # two runs, two seeds
    assert abs(u1.mean() - 0.5) < 0.06


def test_errors():
    bb = g.BlockBuilder()
    bad_seed = g.Var("s", g.TensorStructInfo((), "int64"))
    with pytest.raises(StructInfoError, match="random_uniform: seed must be a 0-d uint64"):
        bb.normalize(op.random_uniform(bad_seed, shape=(3,)))
    with pytest.raises(KilnError, match="random_normal: dtype must be"):
        op.random_normal(_seed(1), shape=(3,), dtype="int32")
    ints = g.Var("p", g.TensorStructInfo((3,), "int32"))
    with pytest.raises(StructInfoError, match="bernoulli: p must be a float"):
        bb.normalize(op.bernoulli(ints, _seed(1)))
