"""kiln.ir.fingerprint: a digest of IR that is the same in every process and sees names,
spans and constants' bytes (what an on-disk cache key needs)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import graph as g
from kiln import op
from kiln.ir.fingerprint import NotFingerprintable, fingerprint
from kiln.ir.span import Span


def _mod(name: str = "x", w: np.ndarray | None = None, span: Span | None = None):
    w = np.arange(6, dtype="float32").reshape(2, 3) if w is None else w
    x = g.Var(name, g.TensorStructInfo((4, 3), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        call = op.dense(x, g.const(w))
        if span is not None:
            call = call.replace(span=span)
        bb.emit_func_output(bb.emit(call))
    return bb.get()


def test_equal_ir_gets_equal_digests():
    assert fingerprint(_mod()) == fingerprint(_mod())
    assert len(fingerprint(_mod())) == 64


def test_names_spans_and_constant_bytes_change_the_digest():
    base = fingerprint(_mod())
    w = np.arange(6, dtype="float32").reshape(2, 3)
    w[1, 2] = np.nextafter(w[1, 2], np.float32(0))
    assert fingerprint(_mod(w=w)) != base
    assert fingerprint(_mod(name="y")) != base
    assert fingerprint(_mod(span=Span.of("fc", "Gemm"))) != base
    assert fingerprint(_mod(span=Span.of("fc", "Gemm"))) == fingerprint(
        _mod(span=Span.of("fc", "Gemm")))


def test_plain_data():
    assert fingerprint([np.zeros(3, "float32"), 1.5, "a"]) == fingerprint(
        [np.zeros(3, "float32"), 1.5, "a"])
    assert fingerprint(np.zeros(3, "float32")) != fingerprint(np.zeros(3, "float64"))
    assert fingerprint(np.zeros((3, 1), "float32")) != fingerprint(np.zeros((1, 3), "float32"))
    assert fingerprint(1) != fingerprint(1.0) != fingerprint("1")
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_low_precision_and_string_arrays():
    """ml_dtypes' arrays (no buffer protocol; bfloat16 and float8 share dtype codes) and
    string arrays (digested by content, not by their object pointers)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    one = np.ones(3, ml_dtypes.bfloat16)
    assert fingerprint(one) == fingerprint(np.ones(3, ml_dtypes.bfloat16))
    assert fingerprint(one) != fingerprint(np.ones(3, np.float16))
    assert fingerprint(one) != fingerprint(np.full(3, 2, ml_dtypes.bfloat16))
    assert (fingerprint(np.zeros(3, ml_dtypes.float8_e4m3fn))
            != fingerprint(np.zeros(3, ml_dtypes.float8_e5m2)))
    words = np.array(["ab", "c"], object)
    assert fingerprint(words) == fingerprint(np.array(["a" + "b", "c"], object))
    assert fingerprint(words) != fingerprint(np.array(["a", "bc"], object))


def test_values_without_stable_content_are_refused():
    class Opaque:
        pass

    with pytest.raises(NotFingerprintable, match="Opaque"):
        fingerprint({"x": Opaque()})
