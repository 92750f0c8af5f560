"""kiln.runtime: zero-copy DLTensor views and loading/calling compiled modules."""

from __future__ import annotations

import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as cg
from kiln.ir import ArgumentError, KilnError
from kiln.runtime import Module, as_dltensor, from_dl_dtype


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def mod() -> Module:
    n = tir.Var("n", "int64")
    A = te.placeholder((n, 4), "float32", name="A")
    alpha = tir.Var("alpha", "float32")
    B = te.compute((n, 4), lambda i, j: A[i, j] * alpha + tir.cast("float32", i), name="B")
    C = te.placeholder((3,), "int32", name="C")
    D = te.compute((3,), lambda i: C[i] * 2, name="D")
    return cg.build({"axpi": te.create_prim_func([A, alpha, B]),
                     "twice": te.create_prim_func([C, D])})


# ---- DLTensor views -------------------------------------------------------------------------
def test_dltensor_is_a_zero_copy_view():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    h = as_dltensor(a)
    t = h.tensor
    assert t.data == a.ctypes.data
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [3, 4]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 32, 1)
    assert not t.strides and t.byte_offset == 0 and t.device.device_type == 1
    assert h.original is None


@pytest.mark.parametrize("dtype, fields", [
    (np.bool_, (6, 8, 1)), (ml_dtypes.bfloat16, (4, 16, 1)), (np.uint16, (1, 16, 1)),
    (np.float16, (2, 16, 1)), (np.int64, (0, 64, 1)),
])
def test_dltensor_dtypes(dtype, fields):
    t = as_dltensor(np.zeros(3, dtype)).tensor
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == fields
    assert from_dl_dtype(t.dtype).to_numpy() == np.dtype(dtype)


def test_non_contiguous_input_is_copied():
    a = np.arange(16, dtype=np.float32).reshape(4, 4).T
    h = as_dltensor(a)
    assert h.original is a and h.array.flags.c_contiguous
    assert h.tensor.data != a.ctypes.data
    np.testing.assert_array_equal(h.array, a)


class _DLPackOnly:
    """An object that only speaks DLPack (like a torch CPU tensor)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_dlpack_objects_are_viewed_without_copy():
    a = np.arange(6, dtype=np.float64)
    h = as_dltensor(_DLPackOnly(a))
    assert h.tensor.data == a.ctypes.data


def test_unsupported_argument_types():
    with pytest.raises(ArgumentError, match="expected a numpy array or an object with __dlpack__"):
        as_dltensor([1.0, 2.0], "f: argument 0 (A)")


# ---- Module ---------------------------------------------------------------------------------
def test_module_metadata(mod):
    assert mod.function_names == ["axpi", "twice"]
    assert "axpi_unchecked" in mod.source and mod.lib_path.endswith(".so")
    info = mod.info("axpi")
    assert [p.name for p in info.params] == ["A", "alpha", "B"]
    assert info.params[0].shape == ("n", 4) and info.params[0].dtype == "float32"
    assert info.params[1].is_scalar and info.params[1].dtype == "float32"
    assert info.sym_vars == ("n",) and info.num_outputs == 1
    assert mod.info("twice").sym_vars == ()
    with pytest.raises(KilnError, match="no function 'nope'"):
        mod["nope"]


def test_call_with_scalar_parameter(mod):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = np.empty_like(a)
    mod["axpi"](a, 0.5, out)
    np.testing.assert_allclose(out, a * 0.5 + np.arange(2, dtype=np.float32)[:, None])
    with pytest.raises(ArgumentError, match=r"axpi: argument 1 \(alpha\): expected dtype float32 "
                                            r"but got float64"):
        mod["axpi"](a, np.array(0.5, np.float64), out)


def test_non_contiguous_output_is_written_back(mod):
    c = np.arange(6, dtype=np.int32)[::2]
    out = np.zeros(6, np.int32)[::2]
    mod["twice"](c, out)
    np.testing.assert_array_equal(out, c * 2)


def test_unchecked_entry_pointer(mod):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    alpha = np.array(2.0, np.float32)
    out = np.zeros_like(a)
    fn = mod.unchecked_function("axpi")
    data = (ctypes.c_void_p * 3)(a.ctypes.data, alpha.ctypes.data, out.ctypes.data)
    sym = (ctypes.c_int64 * 1)(3)
    fn(data, sym)
    np.testing.assert_allclose(out, a * 2 + np.arange(3, dtype=np.float32)[:, None])
    assert mod.unchecked_address("axpi") == ctypes.cast(fn, ctypes.c_void_p).value
    assert mod.checked_address("axpi") != mod.unchecked_address("axpi")


def test_function_keeps_module_alive():
    C = te.placeholder((3,), "int32", name="C")
    D = te.compute((3,), lambda i: C[i] + 7, name="D")
    f = cg.build({"plus7": te.create_prim_func([C, D])})["plus7"]
    gc.collect()
    out = np.zeros(3, np.int32)
    f(np.arange(3, dtype=np.int32), out)
    np.testing.assert_array_equal(out, np.arange(3) + 7)


def test_error_messages_are_per_thread(mod):
    """kiln_last_error is thread-local: eight threads passing differently wrong arrays at once
    each read back the message about their own array."""
    import threading

    start = threading.Barrier(8)
    wrong = []

    def caller(k: int) -> None:
        c = np.zeros(4 + k, np.int32)  # expected (3,)
        start.wait()
        for _ in range(200):
            try:
                mod["twice"](c, np.zeros(3, np.int32))
            except ArgumentError as err:
                if f"got ({4 + k},)" not in str(err):
                    wrong.append((k, str(err)))
            else:
                wrong.append((k, "no error"))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:3]
