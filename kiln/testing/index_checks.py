"""A model whose kernels check indices at run time, and what every target must do with it.

Gather then ScatterElements (two kernels that check their indices, ``kiln.tir.check_index``, in
two plan calls): negative indices count from the end, an out-of-range one raises
``RuntimeCheckError`` naming the model node, the index and its range, the executable keeps
working after a failed check, and the same holds for the executable saved and loaded. The CPU
checks in its kernels' C code; GPU kernels write a check record the executor reads back
(:mod:`kiln.runtime.gpu.program`). The tests of each target run :func:`check_index_errors`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from ..build import build
from ..frontend.onnx import from_onnx
from ..ir.errors import RuntimeCheckError
from ..runtime.executable import load
from .onnx_graphs import onnx_model, value_info


def gather_scatter_model() -> tuple[Any, dict]:
    """The graph module and parameters of ``ScatterElements(Gather(x, i, axis=0), j, u,
    axis=1)`` (nodes ``g`` and ``s``; x: 6x4, i: 3, j and u: 3x1)."""
    return from_onnx(onnx_model(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="g"),
         helper.make_node("ScatterElements", ["y", "j", "u"], ["z"], axis=1, name="s")],
        [value_info("x", [6, 4]), value_info("i", [3], TensorProto.INT64),
         value_info("j", [3, 1], TensorProto.INT64), value_info("u", [3, 1])],
        [value_info("z", None)]))


def _raises(exe: Any, args: tuple, pattern: str) -> None:
    try:
        exe(*args)
    except RuntimeCheckError as err:
        if not re.search(pattern, str(err)):
            raise AssertionError(f"{err!s} does not match {pattern!r}") from err
        return
    raise AssertionError(f"no RuntimeCheckError matching {pattern!r}")


def check_index_errors(target: Any, directory: Path) -> None:
    """Build :func:`gather_scatter_model` for ``target``, save it into ``directory`` and check
    the built and the loaded executable (see the module docstring); AssertionError if not."""
    mod, params = gather_scatter_model()
    built = build(mod, target, params=params)
    path = Path(directory) / "gather_scatter.kiln"
    built.save(path)
    x = np.arange(24, dtype="float32").reshape(6, 4)
    u = np.full((3, 1), -1, "float32")
    j = np.array([[0], [3], [-1]])
    want = x[[5, 0, 0]].copy()
    want[[0, 1, 2], [0, 3, 3]] = -1
    for exe in (built, load(path)):
        np.testing.assert_array_equal(exe(x, np.array([5, 0, -6]), j, u), want)
        _raises(exe, (x, np.array([5, 6, 0]), j, u),
                r"Gather node 'g'.*index 6 is out of range \[-6, 6\)")
        _raises(exe, (x, np.array([-7, 0, 0]), j, u),
                r"Gather node 'g'.*index -7 is out of range \[-6, 6\)")
        _raises(exe, (x, np.array([1, 2, 3]), np.array([[0], [4], [1]]), u),
                r"ScatterElements node 's'.*index 4 is out of range \[-4, 4\)")
        np.testing.assert_array_equal(exe(x, np.array([5, 0, -6]), j, u), want)
