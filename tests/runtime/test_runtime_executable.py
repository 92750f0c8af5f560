"""Executable files: round trip, dtype table derived from the layout, malformed files."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import DataType, ModelFormatError, abi


@pytest.fixture(scope="module")
def exe():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((3, 5), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(op.add(x, g.const(np.arange(5, dtype="float32"))))
        bb.emit_func_output(bb.emit(op.multiply(y, y)))
    return kiln.build(bb.get())


def test_round_trip(exe, tmp_path):
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    x = np.random.default_rng(0).standard_normal((3, 5)).astype("float32")
    loaded = kiln.load(str(path))
    np.testing.assert_array_equal(loaded(x), exe(x))
    assert "main" in loaded.summary()


def test_file_stores_dtypes_with_the_layout_struct(exe, tmp_path):
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    data = path.read_bytes()
    (count,) = np.frombuffer(data[12:16], dtype="<u4")
    first = abi.unpack_dtype(data, 16)
    assert count >= 1 and first == DataType("float32")


def test_long_vector_dtype_survives_the_file_format():
    dt = DataType("float32x65536")
    assert abi.unpack_dtype(abi.pack_dtype(dt)) == dt


@pytest.mark.parametrize("cut", [4, 20, 200])
def test_truncated_file_is_a_clear_error(exe, tmp_path, cut):
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(ModelFormatError):
        kiln.load(str(path))


def test_not_an_executable(tmp_path):
    path = tmp_path / "x.kiln"
    path.write_bytes(b"hello world, not a kiln file")
    with pytest.raises(ModelFormatError, match="bad magic"):
        kiln.load(str(path))
    with pytest.raises(ModelFormatError):
        kiln.load(str(tmp_path / "missing.kiln"))


def test_long_vector_dtype_survives_a_real_executable_file(exe, tmp_path):
    """A plan whose slot has a float32x65536 dtype goes through save() and load() intact."""
    from kiln.runtime.executable import Executable
    from kiln.runtime.plan import Plan, SlotSpec

    wide = DataType("float32x65536")
    vec_plan = Plan(name="vec", input_names=["v"], input_slots=[0],
                    slots=[SlotSpec([4], wide, "input")], calls=[], outputs=0)
    path = tmp_path / "wide.kiln"
    Executable(exe.module, {**exe.plans, "vec": vec_plan}).save(str(path))
    loaded = kiln.load(str(path))
    assert loaded.plans["vec"].slots[0].dtype == wide
    assert loaded.plans["vec"].slots[0].dtype.lanes == 65536


def test_fast_call_checks_its_arguments(exe, monkeypatch):
    """A static model with a native entry runs exact-shape, exact-dtype contiguous numpy
    inputs without the general binding; anything else takes the general path, which converts
    (lists, non-contiguous arrays) or names the culprit (shape, dtype, count)."""
    from kiln.ir.errors import ArgumentError
    from kiln.runtime.executor import Executor

    ex = exe._executor("main")
    assert ex._fast is not None
    x = np.random.default_rng(1).standard_normal((3, 5)).astype("float32")
    want = (x + np.arange(5, dtype="float32")) ** 2
    general = Executor._bind_inputs

    def refuse(self, args):
        raise AssertionError("general path taken")

    monkeypatch.setattr(Executor, "_bind_inputs", refuse)
    out = exe(x)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert out is not exe(x)  # a fresh output array per call
    frozen = x.copy()
    frozen.flags.writeable = False  # ctypes cannot view it: its address is found another way
    np.testing.assert_allclose(exe(frozen), want, rtol=1e-6)
    monkeypatch.setattr(Executor, "_bind_inputs", general)
    wide = np.zeros((3, 10), "float32")
    wide[:, ::2] = x
    np.testing.assert_allclose(exe(wide[:, ::2]), want, rtol=1e-6)
    np.testing.assert_allclose(exe(x.tolist()), want, rtol=1e-6)
    np.testing.assert_allclose(exe(x=x), want, rtol=1e-6)
    with pytest.raises(ArgumentError, match="expected dtype float32"):
        exe(x.astype("float64"))
    with pytest.raises(ArgumentError, match=r"expected shape \(3, 5\)"):
        exe(x[:2])
    with pytest.raises(ArgumentError, match="expected 1 input"):
        exe(x, x)


def test_fast_call_returns_tuple_outputs():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4,), "float32"))
    with bb.function("main", [x]):
        a = bb.emit(op.add(x, x))
        m = bb.emit(op.multiply(x, x))
        s = bb.emit(op.subtract(x, x))
        bb.emit_func_output(g.Tuple([m, g.Tuple([a, s])]))
    tup = kiln.build(bb.get())
    assert tup._executor("main")._fast is not None
    v = np.arange(4, dtype="float32")
    m, (a, s) = tup(v)
    np.testing.assert_array_equal(m, v * v)
    np.testing.assert_array_equal(a, v + v)
    np.testing.assert_array_equal(s, v - v)
