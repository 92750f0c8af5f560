"""The executor from many threads at once: every call gets its own workspace, results stay right.

Before calls took their state from a pool, two threads calling one executable shared its
workspace and most results were silently wrong. Each test here hammers one executable from 8
threads that start together and checks every single result against numpy.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.runtime import threads
from kiln.runtime.executor import POOL_SIZE, Executor
from kiln.testing import models

THREADS = 8
CALLS = 25


def _hammer(call, make_input, reference) -> list[str]:
    """Run ``call`` from THREADS threads, CALLS times each on fresh inputs; the mismatches."""
    start = threading.Barrier(THREADS)
    failures: list[str] = []

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        start.wait()
        for i in range(CALLS):
            x = make_input(rng, i)
            try:
                out = call(x)
                np.testing.assert_allclose(out, reference(x), rtol=1e-4, atol=1e-5)
            except Exception as err:  # noqa: BLE001 - collected and reported below
                failures.append(f"thread {k} call {i}: {type(err).__name__}: {err}"[:300])

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return failures


@pytest.fixture(scope="module")
def cnn():
    model = models.small_cnn(batch=2, channels=8, size=16)
    return model, kiln.build(model.mod)


def test_static_model_from_8_threads(cnn):
    """The native entry's fast path: temps in the workspace, outputs fresh."""
    model, exe = cnn
    assert exe.workspace_bytes > 0  # the shared state the threads would fight over
    shape = model.inputs[0].shape
    failures = _hammer(exe, lambda rng, i: rng.standard_normal(shape).astype("float32"),
                       model.reference)
    assert not failures, "\n".join(failures[:5])


def test_kernel_by_kernel_plan_from_8_threads(cnn):
    """A plan without a native entry calls each kernel with temps from the call's state."""
    model, exe = cnn
    plan = exe.plans["main"]
    stepwise = Executor(type(plan)(**{**plan.__dict__, "entry": None}), exe.module)
    shape = model.inputs[0].shape
    failures = _hammer(stepwise.run, lambda rng, i: rng.standard_normal(shape).astype("float32"),
                       model.reference)
    assert not failures, "\n".join(failures[:5])


def test_symbolic_batch_from_8_threads():
    """Each call's state keeps its own frames per batch size and its own grown workspace."""
    n = tir.Var("n", "int64")
    w = np.random.default_rng(0).standard_normal((16, 32)).astype("float32")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, 16), "float32"))
    with bb.function("main", [x]):
        h = bb.emit(op.nn.relu(op.matmul(x, g.const(w))))
        bb.emit_func_output(bb.emit(op.exp(op.negative(h))))
    exe = kiln.build(bb.get())
    assert exe.plans["main"].entry_sym_dims is not None
    failures = _hammer(
        exe, lambda rng, i: rng.standard_normal((1 + (i * 7) % 13, 16)).astype("float32"),
        lambda xv: np.exp(-np.maximum(xv.astype("float64") @ w, 0)))
    assert not failures, "\n".join(failures[:5])


def test_states_are_pooled_and_reused(cnn):
    model, exe = cnn
    ex = Executor(exe.plans["main"], exe.module)
    ex.run(*model.inputs)
    ex.run(*model.inputs)
    assert len(ex._pool) == 1  # one thread: one state, reused
    first = ex.acquire()
    second = ex.acquire()  # the pool is empty now: a new state, never the same one
    assert first is not second and first.workspace.ctypes.data != second.workspace.ctypes.data
    for _ in range(POOL_SIZE + 3):
        ex.release(ex.acquire() if ex._pool else type(first)(ex.plan, 1))
    assert len(ex._pool) <= POOL_SIZE


def test_thread_count_belongs_to_the_executable(cnn):
    """set_num_threads applies to calls from any thread and does not leak into other
    executables run by the same thread."""
    model, exe = cnn
    other = kiln.build(model.mod)
    default = other.get_max_threads()
    exe.set_num_threads(1)
    try:
        native = threads.setter(exe.module).get  # the library's count for the calling thread
        seen = []

        def in_another_thread() -> None:
            out = exe(*model.inputs)
            seen.append((exe.get_max_threads(), native(), out))

        t = threading.Thread(target=in_another_thread)
        t.start()
        t.join()
        assert [s[:2] for s in seen] == [(1, 1)]
        np.testing.assert_allclose(seen[0][2], model.reference(*model.inputs), rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(exe(*model.inputs), model.reference(*model.inputs),
                                   rtol=1e-4, atol=1e-5)
        # the other executable, run next in this thread, still gets OpenMP's default (its
        # library is exe's when both were compiled in this process, a copy of it when the
        # executable cache loaded one: read the count from other's own)
        exe(*model.inputs)
        assert native() == 1
        np.testing.assert_allclose(other(*model.inputs), model.reference(*model.inputs),
                                   rtol=1e-4, atol=1e-5)
        assert other.get_max_threads() == default == threads.setter(other.module).get()
    finally:
        exe.set_num_threads(None)
    assert exe.get_max_threads() == default
