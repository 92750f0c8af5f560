"""export_native + examples/run_from_c.c: the model runs from a plain C program."""

import os
import subprocess

import numpy as np
import pytest

import kiln
from kiln.codegen.c import find_compiler
from kiln.ir import KilnError
from kiln.testing import models

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "run_from_c.c")


def test_c_program_matches_python(tmp_path):
    model = models.mlp(batch=2, sizes=(12, 16, 5))
    exe = kiln.build(model.mod)
    exe.export_native(str(tmp_path / "model"))
    manifest = (tmp_path / "model" / "manifest.txt").read_text().split()
    assert manifest[:4] == ["kiln-native", "1", "entry", exe.plans["main"].entry]
    runner = tmp_path / "run_from_c"
    cc = find_compiler().command
    subprocess.run([*cc, "-O1", "-o", str(runner), EXAMPLE, "-ldl"], check=True)
    model.inputs[0].tofile(tmp_path / "x.bin")
    subprocess.run([str(runner), str(tmp_path / "model"), str(tmp_path / "x.bin"),
                    str(tmp_path / "y.bin")], check=True)
    got = np.fromfile(tmp_path / "y.bin", dtype="float32").reshape(2, 5)
    np.testing.assert_array_equal(got, exe(*model.inputs))


def test_symbolic_function_cannot_be_exported(tmp_path):
    from kiln import graph as g
    from kiln import op

    n = kiln.tir.Var("n", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, 4), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op.exp(x)))
    exe = kiln.build(bb.get())
    with pytest.raises(KilnError, match="symbolic"):
        exe.export_native(str(tmp_path / "m"))
