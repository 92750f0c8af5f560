"""Executable files: round trip, dtype table derived from the layout, malformed, damaged,
foreign and newer files, extra sections, read-only caches, code for CPUs this one is not."""

import json
import os
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import DataType, ModelFormatError, abi
from kiln.runtime import file_format


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
    assert data[:8] == b"KILNEXE\0" and struct.unpack_from("<I", data, 8)[0] == 3
    raw = bytes(file_format.read(data, str(path))["dtypes"])
    assert len(raw) % abi.DTYPE_STRUCT.size == 0 and len(raw) >= abi.DTYPE_STRUCT.size
    assert abi.unpack_dtype(raw, 0) == DataType("float32")


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
    with pytest.raises(ModelFormatError, match="is not a kiln executable"):
        kiln.load(str(path))
    path.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="is not a kiln executable"):
        kiln.load(str(path))
    with pytest.raises(ModelFormatError, match="No such file"):
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


# ---- damage, versions, sections ------------------------------------------------------------
def _saved(exe, tmp_path) -> tuple[str, bytes, list]:
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    data = open(path, "rb").read()
    return path, data, file_format.read_table(data, path)


def _flip(path: str, data: bytes, offset: int) -> None:
    damaged = bytearray(data)
    damaged[offset] ^= 0x20
    with open(path, "wb") as f:
        f.write(bytes(damaged))


@pytest.mark.parametrize("mapped", [False, True])
def test_a_flipped_byte_in_any_section_names_the_section(exe, tmp_path, mapped):
    """Weights, code, plans: a flipped byte anywhere in a section is caught by its checksum
    before the library is loaded or a constant is read (it used to run and print garbage, or
    segfault) -- whether the file is read or mapped."""
    path, data, table = _saved(exe, tmp_path)
    assert [s.name for s in table] == ["constants", "meta", "dtypes", "header", "library",
                                       "source"]
    for section in table:
        for offset in {section.offset, section.offset + section.size // 2,
                       section.offset + section.size - 1}:
            _flip(path, data, offset)
            with pytest.raises(ModelFormatError,
                               match=f"section '{section.name}' .* fails its checksum"):
                kiln.load(path, mmap=mapped)


# ---- constants used in place ---------------------------------------------------------------
@pytest.fixture(scope="module")
def weights_exe():
    """Constants of several sizes and dtypes (odd byte counts between them)."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((7, 3)).astype("float32")
    b1 = rng.standard_normal((3,)).astype("float64")
    w2 = rng.integers(-9, 9, (13,)).astype("int8")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((2, 7), "float32"))
    k = g.Var("k", g.TensorStructInfo((13,), "int8"))
    with bb.function("main", [x, k]):
        y = bb.emit(op.matmul(x, g.const(w1)))
        z = bb.emit(op.add(bb.emit(op.cast(y, "float64")), g.const(b1)))
        bb.emit_func_output(g.Tuple([z, bb.emit(op.multiply(k, g.const(w2)))]))
    return kiln.build(bb.get(), cache=False), (w1, b1, w2)


def _expected(weights, x, k):
    w1, b1, w2 = weights
    return (x @ w1).astype("float64") + b1, k * w2


@pytest.mark.parametrize("mapped", [False, True])
def test_constants_are_aligned_in_the_file_and_used_in_place(weights_exe, tmp_path, mapped):
    """Every constant starts at a 64-byte file offset, and a loaded executable uses the
    constants where they lie in the loaded (or mapped) file instead of copying each."""
    exe, weights = weights_exe
    path, data, table = _saved(exe, tmp_path)
    sections = file_format.read(data, path)
    header = json.loads(bytes(sections["header"]))
    start = next(s.offset for s in table if s.name == "constants")
    entries = [c for pj in header["plans"].values() for c in pj["constants"]]
    assert len(entries) >= 3
    assert all((start + c["offset"]) % 64 == 0 for c in entries)
    loaded = kiln.load(path, mmap=mapped)
    consts = loaded.plans["main"].constants
    addr = {s: a.__array_interface__["data"][0] for s, a in consts.items()}
    assert all(a % 64 == 0 for a in addr.values())
    # views of the one buffer holding the file, laid out as in it (copies would be scattered)
    first = header["plans"]["main"]["constants"][0]
    assert all(addr[c["slot"]] - addr[first["slot"]] == c["offset"] - first["offset"]
               for c in header["plans"]["main"]["constants"])
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 7)).astype("float32")
    k = rng.integers(-9, 9, (13,)).astype("int8")
    for got, want in zip(loaded(x, k), _expected(weights, x, k)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("mapped", [False, True])
def test_a_constant_held_by_several_slots_is_stored_and_loaded_once(tmp_path, mapped):
    """One weight used by three products (an unrolled recurrence's steps, in small): the plan's
    slots hold one array, the file stores its bytes once, and the loaded plan's slots share
    one array again (an LSTM of 64 steps saved each step's copy: a 540 MB file whose loaded
    executable ran 3.7x slower than the built one)."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype("float32")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wc = g.const(w)
            a = bb.emit(op.dense(x, wc))
            b = bb.emit(op.dense(op.nn.relu(a), wc))
            out = bb.emit_output(op.dense(op.tanh(b), wc))
        bb.emit_func_output(out)
    exe = kiln.build(bb.get(), "c", cache=False)
    built = exe.plans["main"].constants
    assert len(built) == 3 and len({id(v) for v in built.values()}) == 1
    path = str(tmp_path / "shared.kiln")
    exe.save(path)
    sections = file_format.read((tmp_path / "shared.kiln").read_bytes(), path)
    assert len(sections["constants"]) < 2 * w.nbytes
    loaded = kiln.load(path, mmap=mapped)
    consts = loaded.plans["main"].constants
    assert len({v.__array_interface__["data"][0] for v in consts.values()}) == 1
    xv = np.random.default_rng(1).standard_normal((4, 64)).astype("float32")
    want = np.tanh(np.maximum(xv @ w.T, 0) @ w.T) @ w.T
    np.testing.assert_allclose(loaded(xv), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(loaded(xv), exe(xv), rtol=0, atol=0)


def test_a_file_with_unaligned_constants_still_loads(weights_exe, tmp_path):
    """Files written before the constants were aligned (the constants section last, packed):
    the table's offsets are explicit, so they load as before, each constant copied."""
    exe, weights = weights_exe
    path, data, _ = _saved(exe, tmp_path)
    sections = file_format.read(data, path)
    order = ["meta", "dtypes", "header", "library", "source", "constants"]
    file_format.write(path, [(n, bytes(sections[n])) for n in order])
    for mapped in (False, True):
        loaded = kiln.load(path, mmap=mapped)
        x = np.ones((2, 7), "float32")
        k = np.arange(13, dtype="int8")
        for got, want in zip(loaded(x, k), _expected(weights, x, k)):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_mapped_executable_outlives_its_file(weights_exe, tmp_path):
    """The executable cache maps its entries; evicting (removing) or replacing an entry while
    an executable loaded from it runs is safe (the mapping keeps the old file's pages)."""
    exe, weights = weights_exe
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    loaded = kiln.load(path, mmap=True)
    exe.save(path)  # replaced atomically
    os.unlink(path)
    x = np.full((2, 7), 0.5, "float32")
    k = np.arange(13, dtype="int8")
    for got, want in zip(loaded(x, k), _expected(weights, x, k)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("where,message", [
    (0, "magic number .* is corrupt"), (7, "magic number .* is corrupt"),
    (8, "format version field .* is corrupt"), (13, "header .* is corrupt"),
    (20, "header .* is corrupt"), (60, "header .* is corrupt"),
])
def test_a_flipped_byte_in_the_header_is_named(exe, tmp_path, where, message):
    path, data, _ = _saved(exe, tmp_path)
    _flip(path, data, where)
    with pytest.raises(ModelFormatError, match=message):
        kiln.load(path)


def test_extra_or_missing_bytes(exe, tmp_path):
    path, data, _ = _saved(exe, tmp_path)
    with open(path, "wb") as f:
        f.write(data + b"\0")
    with pytest.raises(ModelFormatError, match="extra bytes"):
        kiln.load(path)
    with open(path, "wb") as f:
        f.write(data[:-1])
    with pytest.raises(ModelFormatError, match="truncated"):
        kiln.load(path)


def _with_version(data: bytes, version: int) -> bytes:
    """``data`` rewritten as a genuine file of format ``version`` (its preamble checksum
    recomputed, as a newer kiln would write it)."""
    import hashlib

    table_len = struct.unpack_from("<I", data, 12)[0]
    head = data[:8] + struct.pack("<II", version, table_len)
    digest = hashlib.sha256(head + data[48:48 + table_len]).digest()
    return head + digest + data[48:]


def test_newer_and_older_formats_are_explained(exe, tmp_path):
    path, data, _ = _saved(exe, tmp_path)
    with open(path, "wb") as f:
        f.write(_with_version(data, 4))
    with pytest.raises(ModelFormatError, match="newer kiln .*version 4.*upgrade kiln"):
        kiln.load(path)
    with open(path, "wb") as f:  # a version 2 file: no checksums
        f.write(b"KILNEXE\0" + struct.pack("<II", 2, 1) + bytes(100))
    with pytest.raises(ModelFormatError, match="older kiln .*version 2.*rebuild"):
        kiln.load(path)


def test_extra_sections_round_trip(exe, tmp_path):
    from kiln.runtime.executable import Executable

    copy = Executable(exe.module, exe.plans, exe.target, exe.required_features)
    copy.add_section("gpu.ptx", b"// device code")
    copy.add_section("empty", b"")
    with pytest.raises(kiln.KilnError, match="reserved"):
        copy.add_section("library", b"x")
    path, data, table = _saved(copy, tmp_path)
    assert [s.name for s in table][-2:] == ["gpu.ptx", "empty"]
    loaded = kiln.load(path)
    assert loaded.section("gpu.ptx") == b"// device code" and loaded.section("empty") == b""
    with pytest.raises(kiln.KilnError, match="no section 'cubin'.*gpu.ptx, empty"):
        loaded.section("cubin")
    ptx = next(s for s in table if s.name == "gpu.ptx")
    _flip(path, data, ptx.offset + 3)
    with pytest.raises(ModelFormatError, match="section 'gpu.ptx'"):
        kiln.load(path)


def test_meta_records_target_features_and_version(exe, tmp_path):
    path, data, _ = _saved(exe, tmp_path)
    meta = json.loads(bytes(file_format.read(data, path)["meta"]))
    assert meta["kiln_version"] == kiln.__version__ and meta["target"] == "c"
    assert meta["machine"] == "x86_64" or meta["machine"]
    from kiln.target.cpu import host_features
    assert set(meta["required_features"]) <= host_features()
    if "avx2" in host_features():
        assert "avx2" in meta["required_features"]  # -march=native on an AVX2 machine
    loaded = kiln.load(path)
    assert loaded.target == "c" and loaded.kiln_version == kiln.__version__


_READ_ONLY_CHILD = """
import sys, numpy as np, kiln
exe = kiln.load(sys.argv[1])
x = np.arange(15, dtype="float32").reshape(3, 5)
np.save(sys.argv[2], exe(x))
"""


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_load_with_a_read_only_cache(exe, tmp_path):
    _load_read_only(exe, tmp_path)


def test_load_with_a_read_only_cache_as_any_user(exe, tmp_path):
    """The cache directory is a file path that cannot be a directory (works as root too)."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    _load_read_only(exe, tmp_path, str(blocker / "kiln"))


def _load_read_only(exe, tmp_path, cache=None):
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    if cache is None:
        cache = str(tmp_path / "ro_cache")
        os.makedirs(cache)
        os.chmod(cache, stat.S_IRUSR | stat.S_IXUSR)
    env = {**os.environ, "KILN_CACHE_DIR": cache}
    out = str(tmp_path / "y.npy")
    subprocess.run([sys.executable, "-c", _READ_ONLY_CHILD, path, out], env=env, check=True,
                   cwd=os.path.dirname(os.path.dirname(kiln.__file__)))
    x = np.arange(15, dtype="float32").reshape(3, 5)
    np.testing.assert_allclose(np.load(out), (x + np.arange(5, dtype="float32")) ** 2)


def test_inputs_outputs_and_run_like_onnxruntime(tmp_path):
    n = kiln.tir.Var("n", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, 4), "float32"))
    y = g.Var("y", g.TensorStructInfo((4,), "int32"))
    with bb.function("main", [x, y]):
        s = bb.emit(op.add(x, x))
        c = bb.emit(op.multiply(y, y))
        bb.emit_func_output(g.Tuple([s, g.Tuple([c, bb.emit(op.exp(x))])]))
    exe = kiln.build(bb.get())
    from kiln.runtime.plan import TensorInfo

    assert exe.inputs == [TensorInfo("x", ("n", 4), "float32"), TensorInfo("y", (4,), "int32")]
    assert exe.outputs == [TensorInfo("output_0", ("n", 4), "float32"),
                           TensorInfo("output_1", (4,), "int32"),
                           TensorInfo("output_2", ("n", 4), "float32")]
    xv = np.arange(8, dtype="float32").reshape(2, 4)
    yv = np.arange(4, dtype="int32")
    feeds = {"x": xv, "y": yv}
    full = exe.run(feeds)
    assert [a.shape for a in full] == [(2, 4), (4,), (2, 4)]
    np.testing.assert_array_equal(full[1], yv * yv)
    picked = exe.run(feeds, ["output_2", "output_0"])
    np.testing.assert_allclose(picked[0], np.exp(xv), rtol=1e-6)
    np.testing.assert_array_equal(picked[1], xv + xv)
    as_dict = exe.run([xv, yv], as_dict=True)
    assert list(as_dict) == ["output_0", "output_1", "output_2"]
    with pytest.raises(kiln.KilnError, match=r"unknown output name\(s\) \['out'\].*output_0"):
        exe.run(feeds, ["out"])
    with pytest.raises(kiln.KilnError, match=r"unknown input\(s\) \['z'\]"):
        exe.run({"x": xv, "z": yv})
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    assert kiln.load(path).outputs == exe.outputs
    assert "-> (output_0: float32[n, 4]" in exe.summary()
