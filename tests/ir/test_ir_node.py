"""Structural equality and hashing of IR nodes (variables up to renaming)."""

import numpy as np
import pytest

from kiln import tir
from kiln.ir import IRModule, KilnError, assert_structural_equal, structural_equal, structural_hash


def _loop(name_i, name_buf, offset=0):
    i = tir.Var(name_i, "int64")
    buf = tir.decl_buffer((16,), "float32", name_buf)
    return tir.For(i, 0, 16, tir.ForKind.SERIAL, tir.BufferStore(buf, buf[i] + 1.0, (i + offset,)))


def test_equal_up_to_renaming():
    a, b = _loop("i", "A"), _loop("j", "B")
    assert structural_equal(a, b)
    assert structural_hash(a) == structural_hash(b)
    assert_structural_equal(a, b)


def test_different_constant_is_not_equal():
    a, b = _loop("i", "A"), _loop("i", "A", offset=1)
    assert not structural_equal(a, b)
    with pytest.raises(AssertionError, match="structural mismatch"):
        assert_structural_equal(a, b)


def test_variables_must_be_used_consistently():
    x, y = tir.Var("x"), tir.Var("y")
    assert structural_equal(x + x, y + y)
    u, v = tir.Var("u"), tir.Var("v")
    assert not structural_equal(x + x, u + v)
    assert not structural_equal(x + y, u + u)


def test_var_types_must_agree():
    assert not structural_equal(tir.Var("x", "int32"), tir.Var("x", "int64"))


def test_map_free_vars_false_requires_identity():
    x, y = tir.Var("x"), tir.Var("y")
    assert not structural_equal(x + 1, y + 1, map_free_vars=False)
    assert structural_equal(x + 1, x + 1, map_free_vars=False)


def test_arrays_compare_by_value():
    assert structural_equal({"w": np.ones(3)}, {"w": np.ones(3)})
    assert not structural_equal({"w": np.ones(3)}, {"w": np.zeros(3)})
    assert structural_hash(np.ones(3)) == structural_hash(np.ones(3))


def test_nodes_are_immutable_and_replace_copies():
    x = tir.Var("x")
    e = x + 1
    with pytest.raises(AttributeError):
        e.a = x  # type: ignore[misc]
    f = e.replace(b=tir.const("int32", 2))
    assert f is not e and f.b.value == 2 and e.b.value == 1


def test_primexpr_has_no_truth_value():
    with pytest.raises(KilnError):
        bool(tir.Var("x") < 3)


def test_irmodule_access():
    mod = IRModule({"f": _loop("i", "A")})
    assert "f" in mod and len(mod) == 1
    with pytest.raises(KilnError, match="no function named 'g'"):
        mod["g"]
    mod2 = mod.with_function("g", _loop("j", "B"))
    assert "g" in mod2 and "g" not in mod
