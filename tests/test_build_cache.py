"""The executable cache (kiln.build_cache): a rebuild of an unchanged model loads the stored
executable; anything that changes the compiled result changes the key; a damaged entry is
rebuilt, never used."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import build_cache, op
from kiln import graph as g
from kiln.runtime import cache
from kiln.target import Target
from kiln.transform import PassContext

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 8)).astype("float32")
X = RNG.standard_normal((4, 8)).astype("float32")


def _model(w: np.ndarray = W, name: str = "x") -> kiln.IRModule:
    """relu(x @ w.T + 1) with a constant weight."""
    bb = g.BlockBuilder()
    x = g.Var(name, g.TensorStructInfo((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.dense(x, g.const(w)))
            y = bb.emit(op.add(y, g.const(np.float32(1.0))))
            out = bb.emit_output(op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _expected(w: np.ndarray = W) -> np.ndarray:
    return np.maximum(X @ w.T + 1, 0)


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """A fresh cache directory, the executable cache on, no pass instruments (with them the
    passes must run, so builds are not cached: the test-wide well-formedness instrument)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.delenv("KILN_CACHE_MAX_SIZE", raising=False)
    monkeypatch.delenv(build_cache.ENV, raising=False)
    with PassContext(instruments=()):
        yield root


def _stored(root) -> list:
    return sorted((root / cache.EXECUTABLES).glob("*" + cache.EXECUTABLE_SUFFIX))


def _no_rebuild(monkeypatch):
    """Make a build that does not come from the cache fail."""
    def fail(*args, **kwargs):
        raise AssertionError("built again instead of loading the cached executable")
    monkeypatch.setattr(importlib.import_module("kiln.build"), "build_executable", fail)


def test_a_rebuild_loads_the_cached_executable(cached, monkeypatch):
    exe = kiln.build(_model())
    np.testing.assert_allclose(exe(X), _expected(), rtol=1e-5, atol=1e-5)
    (entry,) = _stored(cached)
    _no_rebuild(monkeypatch)
    again = kiln.build(_model())  # a new, structurally equal module
    np.testing.assert_allclose(again(X), _expected(), rtol=1e-5, atol=1e-5)
    assert again.inputs[0].name == "x" and again.num_kernels == exe.num_kernels
    assert _stored(cached) == [entry]
    info = cache.info()
    assert info["executables"] == 1
    assert any(e.key == f"{cache.EXECUTABLES}/{entry.stem}" for e in cache.entries())


def test_params_are_part_of_the_key(cached, monkeypatch):
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 8), "float32"))
    w = g.Var("w", g.TensorStructInfo((16, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(op.dense(x, w))
        bb.emit_func_output(out)
    mod = bb.get()
    np.testing.assert_allclose(kiln.build(mod, params={"w": W})(X), X @ W.T, rtol=1e-5,
                               atol=1e-5)
    w2 = W.copy()
    w2[3, 5] += 1
    np.testing.assert_allclose(kiln.build(mod, params={"w": w2})(X), X @ w2.T, rtol=1e-5,
                               atol=1e-5)
    assert len(_stored(cached)) == 2


def test_params_that_are_not_arrays_get_the_builds_own_error(cached):
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 8), "float32"))
    w = g.Var("w", g.TensorStructInfo((16, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(op.dense(x, w))
        bb.emit_func_output(out)
    with pytest.raises(kiln.KilnError):
        kiln.build(bb.get(), params={"w": object()})
    assert _stored(cached) == []


def test_the_key_changes_with_what_changes_the_result(monkeypatch):
    tgt = Target("c")
    with PassContext(opt_level=2, instruments=()) as ctx:
        base = build_cache.build_key(_model(), tgt, ctx=ctx)
        assert build_cache.build_key(_model(), tgt, ctx=ctx) == base
        w2 = W.copy()
        w2[0, 0] = np.nextafter(w2[0, 0], np.float32(np.inf))  # one weight, one ulp
        assert build_cache.build_key(_model(w2), tgt, ctx=ctx) != base
        assert build_cache.build_key(_model(name="y"), tgt, ctx=ctx) != base  # input name
        assert build_cache.build_key(_model(), Target("c", mcpu="x86-64-v3"), ctx=ctx) != base
        assert build_cache.build_key(_model(), Target("c", num_threads=1), ctx=ctx) != base
        monkeypatch.setenv("KILN_VECTOR_BITS", "128")
        assert build_cache.build_key(_model(), tgt, ctx=ctx) != base
        monkeypatch.delenv("KILN_VECTOR_BITS")
        monkeypatch.setattr(build_cache, "__version__", "999.0")
        assert build_cache.build_key(_model(), tgt, ctx=ctx) != base
        monkeypatch.undo()
        assert build_cache.build_key(_model(), tgt, ctx=ctx) == base
    for other in (PassContext(opt_level=1), PassContext(disabled_pass=["FuseOps"])):
        with other as ctx:
            assert build_cache.build_key(_model(), tgt, ctx=ctx) != base


def test_a_changed_weight_opt_level_or_version_misses(cached, monkeypatch):
    kiln.build(_model())
    w2 = W.copy()
    w2[1, 2] = -w2[1, 2]
    np.testing.assert_allclose(kiln.build(_model(w2))(X), _expected(w2), rtol=1e-5, atol=1e-5)
    with PassContext(opt_level=1, instruments=()):
        np.testing.assert_allclose(kiln.build(_model())(X), _expected(), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(build_cache, "__version__", "999.0")
    kiln.build(_model())
    assert len(_stored(cached)) == 4


def test_the_key_is_the_same_in_another_process(cached):
    code = ("import numpy as np, kiln.build_cache as bc, tests.test_build_cache as t\n"
            "from kiln.target import Target\n"
            "print(bc.build_key(t._model(), Target('c')))\n")
    keys = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True, cwd=os.path.dirname(os.path.dirname(
                                 os.path.abspath(__file__))))
        keys.add(out.stdout.strip())
    # (not compared with this process's key: other test modules register ops and schedule
    # hooks from outside kiln, which are part of the key by design)
    assert len(keys) == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_entry_is_rebuilt(cached, caplog, damage):
    kiln.build(_model())
    (entry,) = _stored(cached)
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40  # inside a section (the library or the constants)
    elif damage == "truncate":
        data = data[: len(data) // 3]
    else:
        data = bytearray(b"not an executable")
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="kiln"):
        exe = kiln.build(_model())
    assert "cannot be used and is rebuilt" in caplog.text
    np.testing.assert_allclose(exe(X), _expected(), rtol=1e-5, atol=1e-5)
    # stored again, whole: the next build loads it
    kiln.load(str(entry))
    np.testing.assert_allclose(kiln.build(_model())(X), _expected(), rtol=1e-5, atol=1e-5)


def test_opt_out(cached, monkeypatch):
    kiln.build(_model(), cache=False)
    assert _stored(cached) == []
    monkeypatch.setenv(build_cache.ENV, "0")
    kiln.build(_model())
    assert _stored(cached) == []
    kiln.build(_model(), cache=True)  # the option wins over the environment
    assert len(_stored(cached)) == 1


def test_not_cached_with_instruments_or_a_custom_pipeline(cached):
    with PassContext(instruments=[kiln.transform.WellFormedInstrument()]):
        kiln.build(_model())
    kiln.build(_model(), pipeline=kiln.transform.Sequential([kiln.transform.LegalizeOps()]))
    assert _stored(cached) == []


def test_clear_and_eviction_cover_executables(cached, monkeypatch):
    kiln.build(_model())
    (entry,) = _stored(cached)
    # a cap smaller than two executables: storing another evicts the older one
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", str(entry.stat().st_size + 100))
    w2 = W + 1
    kiln.build(_model(w2))
    assert entry not in _stored(cached) and len(_stored(cached)) == 1
    monkeypatch.delenv("KILN_CACHE_MAX_SIZE")
    cache.clear()
    assert _stored(cached) == []
