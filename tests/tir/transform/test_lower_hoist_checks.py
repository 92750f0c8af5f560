"""hoist_checks: a run-time index check leaves the loops it does not depend on (a gathered row
is checked once, not once per element), but never an ``if``, a loop that writes what it reads,
or a loop whose variable it uses."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as codegen_c
from kiln.ir import Node, RuntimeCheckError
from kiln.ir.node import node_field_names
from kiln.tir import stmt as S
from kiln.tir.transform.convert_blocks_to_loops import convert_blocks_to_loops
from kiln.tir.transform.flatten_buffers import flatten_buffers
from kiln.tir.transform.hoist_checks import has_checks, hoist_checks

ROWS, COLS, PICK = 6, 40, 5


def _gather_rows() -> tir.PrimFunc:
    x = te.placeholder((ROWS, COLS), "float32", name="X")
    idx = te.placeholder((PICK,), "int64", name="I")
    out = te.compute((PICK, COLS), lambda i, j: x[tir.check_index(idx[i], ROWS, "rows"), j],
                     name="O")
    return te.create_prim_func([x, idx, out])


def _loops_around_checks(node, depth: int = 0) -> list[int]:
    """For every check, the number of loops around it."""
    if tir.is_check(node):
        return [depth]
    if isinstance(node, (tuple, list)):
        return [d for child in node for d in _loops_around_checks(child, depth)]
    if not isinstance(node, Node) or isinstance(node, tir.Buffer):
        return []
    inner = depth + isinstance(node, S.For)
    return [d for name in node_field_names(node)
            for d in _loops_around_checks(getattr(node, name), inner)]


def _loops(func: tir.PrimFunc) -> tir.PrimFunc:
    return flatten_buffers(convert_blocks_to_loops(func))


def test_a_row_index_is_checked_once_per_row():
    func = _loops(_gather_rows())
    assert _loops_around_checks(func.body) == [2]  # inside i and j before
    hoisted = hoist_checks(func)
    assert _loops_around_checks(hoisted.body) == [1]  # inside i only
    assert has_checks(hoisted.body) and not has_checks(S.Evaluate(tir.const("int32", 0)))


def test_a_check_under_a_guard_or_over_a_written_buffer_stays():
    n = tir.Var("n", "int64")
    x = tir.decl_buffer((ROWS,), "float32", "X")
    idx = tir.decl_buffer((PICK,), "int64", "I")
    out = tir.decl_buffer((PICK, COLS), "float32", "O")
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    load = x.load((tir.check_index(idx.load((i,)), ROWS, "x"),))
    guarded = S.For(j, tir.const("int64", 0), tir.const("int64", COLS), S.ForKind.SERIAL,
                    S.IfThenElse(i < n, S.BufferStore(out, load, (i, j))))
    writes_index = S.For(j, tir.const("int64", 0), tir.const("int64", COLS), S.ForKind.SERIAL,
                         tir.seq(S.BufferStore(out, load, (i, j)),
                                 S.BufferStore(idx, tir.const("int64", 0), (i,))))
    for inner in (guarded, writes_index):
        loop = S.For(i, tir.const("int64", 0), tir.const("int64", PICK), S.ForKind.SERIAL, inner)
        func = tir.PrimFunc((), {}, loop)
        assert hoist_checks(func).body is loop


@pytest.mark.parametrize("parallel", [False, True])
def test_an_index_out_of_range_fails_the_call_with_its_value(parallel):
    sch = tir.Schedule(_gather_rows())
    i, j = sch.get_loops(sch.get_block("O"))
    if parallel:
        sch.parallel(i)
    sch.vectorize(sch.split(j, [None, 8])[1])
    mod = codegen_c.build({"gather": sch.func})
    x = np.arange(ROWS * COLS, dtype="float32").reshape(ROWS, COLS)
    out = np.zeros((PICK, COLS), "float32")
    good = np.array([0, -1, 5, -6, 2])
    mod["gather"](x, good, out)
    np.testing.assert_array_equal(out, x[good])
    for bad in (6, -7, 2**40):
        with pytest.raises(RuntimeCheckError, match=rf"rows: index {bad} is out of range "
                                                    rf"\[-6, 6\)"):
            mod["gather"](x, np.array([0, 1, bad, 3, 4]), out)
    body = mod.source.split("int32_t gather__body(")[1].split("\n}\n")[0]
    assert "kiln_check_report" in body
