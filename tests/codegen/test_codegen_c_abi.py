"""The C header from kiln.ir.abi agrees with the ctypes structs, byte for byte."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from kiln.codegen.c.compiler import find_compiler
from kiln.ir import DataType
from kiln.ir.abi import STRUCTS, DLDataType, c_header, pack_dtype, unpack_dtype
from kiln.runtime import from_dl_dtype, to_dl_dtype

LONG = DataType("float32x70000")  # lanes beyond 16 bits


def _run_c(tmp_path, body: str) -> str:
    src = tmp_path / "abi.c"
    src.write_text(c_header() + "#include <stdio.h>\nint main(void) {\n" + body + "return 0;\n}\n")
    exe = tmp_path / "abi"
    compiler = find_compiler()
    subprocess.run([*compiler.command, "-std=gnu11", "-o", str(exe), str(src)], check=True,
                   capture_output=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def test_struct_layout_matches_ctypes(tmp_path):
    body = []
    for name, fields in STRUCTS.items():
        body.append(f'printf("{name} sizeof %zu\\n", sizeof({name}));')
        for fname, _ in fields:
            body.append(f'printf("{name} {fname} %zu %zu\\n", offsetof({name}, {fname}), '
                        f"sizeof((({name}*)0)->{fname}));")
    out = _run_c(tmp_path, "\n".join(body) + "\n")
    from kiln.ir import abi

    seen = 0
    for line in out.splitlines():
        parts = line.split()
        cls = getattr(abi, parts[0])
        if parts[1] == "sizeof":
            assert int(parts[2]) == ctypes.sizeof(cls), line
        else:
            field = getattr(cls, parts[1])
            assert (int(parts[2]), int(parts[3])) == (field.offset, field.size), line
        seen += 1
    assert seen == sum(len(f) + 1 for f in STRUCTS.values())


def test_long_lanes_round_trip(tmp_path):
    assert LONG.lanes == 70000
    assert DataType(str(LONG)) == LONG
    assert LONG.to_numpy() == np.dtype(np.float32)
    dl = to_dl_dtype(LONG)
    assert (dl.code, dl.bits, dl.lanes) == (2, 32, 70000)
    assert from_dl_dtype(dl) == LONG
    assert unpack_dtype(pack_dtype(LONG)) == LONG
    # the C header stores the same bytes for the same value
    out = _run_c(tmp_path, (
        "DLDataType t = {2, 32, 70000};\n"
        "const unsigned char* p = (const unsigned char*)&t;\n"
        "for (size_t i = 0; i < sizeof(t); ++i) printf(\"%02x\", p[i]);\n"
        "printf(\"\\n%d\\n\", (int)t.lanes);\n"
    ))
    hex_bytes, lanes = out.split()
    assert int(lanes) == 70000
    native = bytes(dl)
    # compare the defined bytes (padding may differ)
    for name, _ in STRUCTS["DLDataType"]:
        f = getattr(DLDataType, name)
        assert bytes.fromhex(hex_bytes)[f.offset:f.offset + f.size] == \
            native[f.offset:f.offset + f.size], name


@pytest.mark.parametrize("text", ["bool", "bfloat16", "float16x8", "int8", "uint64x4"])
def test_dl_dtype_round_trip(text):
    dt = DataType(text)
    assert from_dl_dtype(to_dl_dtype(dt)) == dt
