"""The compile cache: entries, least-recently-used eviction under KILN_CACHE_MAX_SIZE, clear."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir.errors import KilnError
from kiln.runtime import cache


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.delenv("KILN_CACHE_MAX_SIZE", raising=False)
    return root


def _model(n: int) -> kiln.Executable:
    """A tiny model whose source differs with ``n`` (a distinct cache entry)."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op.add(x, x)))
    return kiln.build(bb.get())


def _age(entry: cache.Entry, seconds: float) -> None:
    then = time.time() - seconds
    for p in entry.files:
        os.utime(p, (then, then))


def test_parse_size():
    assert cache.parse_size("2G") == 2 * 1024**3 and cache.parse_size("500m") == 500 * 1024**2
    assert cache.parse_size("1048576") == 1048576 and cache.parse_size("1.5KiB") == 1536
    with pytest.raises(KilnError, match="KILN_CACHE_MAX_SIZE='lots' is not a size"):
        cache.parse_size("lots")


def test_entries_info_and_clear(fresh_cache, tmp_path):
    exe = _model(1)
    exe.save(str(tmp_path / "m.kiln"))
    kiln.load(str(tmp_path / "m.kiln"))  # adds the exe-<hash>.so entry
    es = cache.entries()
    kinds = sorted(e.key.split("/")[0].split("-")[0] for e in es)
    assert kinds == ["c", "exe"]
    compiled = next(e for e in es if e.key.startswith("c/"))
    assert sorted(p.suffix for p in compiled.files) == [".c", ".so"]
    info = cache.info()
    assert info["entries"] == 2 and info["libraries"] == 2
    assert info["bytes"] == sum(e.nbytes for e in es) > 0
    files, freed = cache.clear()
    assert files == 3 and freed == info["bytes"] and cache.entries() == []


def test_least_recently_used_entries_are_evicted(fresh_cache, monkeypatch):
    _model(1)
    (first,) = cache.entries()
    _age(first, 300)
    _model(2)
    second = next(e for e in cache.entries() if e.key != first.key)
    _age(second, 200)
    # using the first again makes it the most recently used (a cache hit touches it)
    _model(1)
    assert cache.entries()[-1].key == first.key
    # room for about two entries: adding a third evicts the least recently used (the second)
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", str(first.nbytes + second.nbytes + 100))
    _model(3)
    keys = [e.key for e in cache.entries()]
    assert first.key in keys and second.key not in keys and len(keys) == 2
    # the entry just added is never evicted, even when it alone exceeds the cap
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "1")
    exe = _model(4)
    (only,) = cache.entries()
    assert only.key == "c/" + os.path.basename(exe.module.lib_path)[:-3]
    np.testing.assert_array_equal(exe(np.ones(4, "float32")), np.full(4, 2.0, "float32"))


def test_no_cap(fresh_cache, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "0")
    _model(1)
    _model(2)
    assert len(cache.entries()) == 2 and cache.max_bytes() == 0
