"""Argument checking in generated entries, compile errors, missing compiler, the build cache."""

from __future__ import annotations

import ctypes
import os
import subprocess

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as cg
from kiln.codegen.c import compiler as cc
from kiln.ir import ArgumentError, CompileError, CompilerNotFoundError, RuntimeCheckError
from kiln.ir.abi import CHECK_FAILED, DLTensor
from kiln.runtime import as_dltensor
from kiln.tir.function import ASSUME_ATTR


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


def _add_func():
    n = tir.Var("n", "int64")
    A = te.placeholder((n, 8), "float32", name="A")
    B = te.placeholder((n, 8), "float32", name="B")
    C = te.compute((n, 8), lambda i, j: A[i, j] + B[i, j], name="C")
    return te.create_prim_func([A, B, C])


def _fixed_func():
    A = te.placeholder((4, 8), "float32", name="A")
    B = te.compute((4, 8), lambda i, j: A[i, j] * 2.0, name="B")
    return te.create_prim_func([A, B])


@pytest.fixture(scope="module")
def mod():
    return cg.build({"add": _add_func(), "scale": _fixed_func()})


def f32(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize(
    "args, message",
    [
        ((f32(4, 8), f32(4, 9)), "scale: argument 1 (B): expected shape (4, 8) but got (4, 9)"),
        ((f32(4, 8), f32(4, 8, 1)), "scale: argument 1 (B): expected ndim 2 but got 3"),
        ((np.zeros((4, 8), np.float64), f32(4, 8)),
         "scale: argument 0 (A): expected dtype float32 but got float64"),
        ((np.zeros((4, 8), np.int8), f32(4, 8)),
         "scale: argument 0 (A): expected dtype float32 but got int8"),
        ((f32(4, 8),), "scale: expected 2 arguments but got 1"),
    ],
)
def test_argument_errors_name_argument_and_both_values(mod, args, message):
    with pytest.raises(ArgumentError) as info:
        mod["scale"](*args)
    assert str(info.value) == message


def test_symbolic_dim_bound_by_first_argument(mod):
    with pytest.raises(ArgumentError, match=r"add: argument 2 \(C\): expected shape \(n=3, 8\) "
                                            r"but got \(5, 8\)"):
        mod["add"](f32(3, 8), f32(3, 8), f32(5, 8))
    with pytest.raises(ArgumentError, match=r"argument 1 \(B\): expected shape \(n=2, 8\)"):
        mod["add"](f32(2, 8), f32(3, 8), f32(2, 8))


def _raw_call(mod, name, tensors):
    fn = getattr(mod.lib, mod.info(name).symbol)
    fn.restype = ctypes.c_int32
    arr = (ctypes.POINTER(DLTensor) * max(len(tensors), 1))(*[ctypes.pointer(t) for t in tensors])
    return fn(arr, len(tensors))


def test_checked_entry_from_c_abi(mod):
    """The C entry itself rejects bad input (count, device, strides, NULL data)."""
    a, b = as_dltensor(f32(4, 8)), as_dltensor(f32(4, 8))
    assert _raw_call(mod, "scale", [a.tensor, b.tensor]) == 0
    assert _raw_call(mod, "scale", [a.tensor]) != 0
    assert mod.last_error() == "scale: expected 2 arguments but got 1"

    gpu = as_dltensor(f32(4, 8))
    gpu.tensor.device.device_type = 2
    assert _raw_call(mod, "scale", [gpu.tensor, b.tensor]) != 0
    assert mod.last_error() == "scale: argument 0 (A): expected a CPU array but got device type 2"

    strided = as_dltensor(f32(4, 8))
    strides = (ctypes.c_int64 * 2)(16, 1)
    strided.tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    assert _raw_call(mod, "scale", [a.tensor, strided.tensor]) != 0
    assert mod.last_error() == ("scale: argument 1 (B): expected compact row-major strides "
                                "(8, 1) but got (16, 1)")
    strides[0] = 8  # compact strides spelled out are fine
    assert _raw_call(mod, "scale", [a.tensor, strided.tensor]) == 0

    null = as_dltensor(f32(4, 8))
    null.tensor.data = None
    assert _raw_call(mod, "scale", [null.tensor, b.tensor]) != 0
    assert mod.last_error() == "scale: argument 0 (A): data pointer is NULL"


def test_failed_assumption_returns_before_computing_with_the_dims():
    n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
    a = te.placeholder((n,), "float32", name="A")
    b = te.placeholder((m,), "float32", name="B")
    c = te.compute((n,), lambda i: a[i] + b[i], name="C",
                   attrs={ASSUME_ATTR: ((tir.eq(n, m), "A and B must have one length"),)})
    func = te.create_prim_func([a, b, c])
    assert func.attrs[ASSUME_ATTR][0][1] == "A and B must have one length"
    mod = cg.build({"f": func})
    out = np.full(3, -1.0, "float32")
    with pytest.raises(RuntimeCheckError, match=r"A and B must have one length \(n = 3, m = 2\)"):
        mod["f"](np.ones(3, "float32"), np.ones(2, "float32"), out)
    assert (out == -1.0).all()  # nothing was computed
    mod["f"](np.ones(3, "float32"), np.ones(3, "float32"), out)
    assert (out == 2.0).all()
    fn = mod.unchecked_function("f")
    data = (ctypes.c_void_p * 3)(*[x.ctypes.data for x in (np.ones(3, "float32"),
                                                           np.ones(2, "float32"), out)])
    assert fn(data, (ctypes.c_int64 * 2)(3, 2)) == CHECK_FAILED


def test_failed_assertion_fails_the_call_instead_of_aborting():
    n = tir.Var("n", "int64")
    buf = tir.decl_buffer((n,), "float32", "X")
    i = tir.Var("i", "int64")
    body = tir.For(i, tir.const("int64", 0), n, tir.ForKind.PARALLEL, tir.AssertStmt(
        buf.load((i,)) >= tir.const("float32", 0), "X must not be negative",
        tir.BufferStore(buf, buf.load((i,)) * tir.const("float32", 2), (i,))))
    p = tir.Var("X", "handle")
    mod = cg.build({"g": tir.PrimFunc((p,), {p: buf}, body)})
    x = np.array([1, 2, -3, 4], "float32")
    with pytest.raises(RuntimeCheckError, match="g: X must not be negative"):
        mod["g"](x)
    assert x.tolist() == [2, 4, -3, 8]  # the failed assertion skipped what it guards
    x = np.array([1, 2], "float32")
    mod["g"](x)
    assert x.tolist() == [2, 4]


def test_compile_error_keeps_source_and_diagnostics():
    with pytest.raises(CompileError) as info:
        cc.compile_source("int broken(void) { return undefined_name; }\n")
    err = info.value
    assert err.source_path and os.path.exists(err.source_path)
    assert err.source_path in str(err)
    assert "undefined_name" in err.diagnostics


def test_missing_compiler(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/bin/kiln-no-such-cc")
    with pytest.raises(CompilerNotFoundError, match="kiln-no-such-cc"):
        cg.build({"scale": _fixed_func()})


def test_cache_hit_does_not_recompile(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    first = cg.build({"scale": _fixed_func()})
    assert not first.from_cache
    assert first.lib_path.startswith(str(tmp_path))

    real_run = subprocess.run

    def no_compile(cmd, *args, **kwargs):
        if "-shared" in cmd:
            raise AssertionError("the second build must not invoke the compiler")
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(cc.subprocess, "run", no_compile)
    second = cg.build({"scale": _fixed_func()})
    assert second.from_cache and second.lib_path == first.lib_path
    a, out = np.ones((4, 8), np.float32), f32(4, 8)
    second["scale"](a, out)
    np.testing.assert_array_equal(out, 2 * a)
    # no temporary files are left behind
    assert not [p for p in os.listdir(tmp_path / "c") if p.endswith(".tmp")]


def test_cache_dir_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.cache_dir() == tmp_path / "kiln"
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "x"))
    assert cc.cache_dir() == tmp_path / "x"


def test_large_file_compiles_in_parallel_pieces(tmp_path, monkeypatch):
    """A file split into translation units (forced here: no size threshold, 2 jobs) is one
    library: every function runs, and an argument error in either piece reaches
    ``kiln_last_error`` (the error buffer is shared, not one per piece)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_COMPILE_JOBS", "2")
    monkeypatch.setattr(cc, "PARALLEL_MIN_CHARS", 0)
    commands = []
    real_popen = subprocess.Popen

    def popen(cmd, *args, **kwargs):
        commands.append(cmd)
        return real_popen(cmd, *args, **kwargs)

    monkeypatch.setattr(cc.subprocess, "Popen", popen)
    split = cg.build({"add": _add_func(), "scale": _fixed_func()})
    # subprocess.run goes through Popen too: the link (and any probe) are counted apart
    assert len([cmd for cmd in commands if "-c" in cmd]) == 2
    a, out = np.ones((4, 8), np.float32), f32(4, 8)
    split["scale"](a, out)
    np.testing.assert_array_equal(out, 2 * a)
    split["add"](a, 3 * a, out)
    np.testing.assert_array_equal(out, 4 * a)
    with pytest.raises(ArgumentError, match=r"^scale: argument 1 \(B\): expected shape"):
        split["scale"](f32(4, 8), f32(4, 9))
    with pytest.raises(ArgumentError, match=r"^add: argument 2 \(C\): expected shape"):
        split["add"](f32(3, 8), f32(3, 8), f32(5, 8))
    assert not [p for p in os.listdir(tmp_path / "c") if not p.endswith((".c", ".so"))]


def test_failing_piece_keeps_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_COMPILE_JOBS", "2")
    monkeypatch.setattr(cc, "PARALLEL_MIN_CHARS", 0)
    mark = f"\n{cc.UNIT_MARK}\n"
    source = ("#include <stdint.h>\n" + mark + "int32_t good(void) { return 1; }\n"
              + mark + "int32_t bad(void) { return undefined_name; }\n")
    with pytest.raises(CompileError) as info:
        cc.compile_source(source)
    err = info.value
    assert err.source_path and os.path.exists(err.source_path)
    assert "undefined_name" in open(err.source_path).read()
    assert "undefined_name" in err.diagnostics


def test_compile_jobs_setting(monkeypatch):
    monkeypatch.setenv("KILN_COMPILE_JOBS", "3")
    assert cc.compile_jobs() == 3
    monkeypatch.setenv("KILN_COMPILE_JOBS", "many")
    with pytest.raises(CompileError, match="KILN_COMPILE_JOBS"):
        cc.compile_jobs()
