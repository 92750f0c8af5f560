"""The int8 scheme's numbers: per-channel weight scales, int32 bias, fixed-point multipliers."""

import numpy as np
import pytest

from kiln.quantize import QuantizationError, fixed_point, quantize_weight
from kiln.quantize.scheme import activation_scale, quantize_bias


def test_fixed_point_is_the_nearest_multiplier_at_the_largest_shift():
    rng = np.random.default_rng(0)
    m = rng.uniform(1e-5, 0.9, 64)
    mult, shift = fixed_point(m)
    assert mult.dtype == np.int32 and 1 <= shift <= 62
    assert mult.max() <= 2 ** 31 - 1 and np.rint(m.max() * 2.0 ** (shift + 1)) > 2 ** 31 - 1
    np.testing.assert_array_equal(mult, np.rint(m * 2.0 ** shift))
    assert np.max(np.abs(mult / 2.0 ** shift - m) / m.max()) <= 2.0 ** -31
    mult, shift = fixed_point(np.array([3.0]))  # > 1: fewer fraction bits
    assert shift == 29 and mult[0] == 3 << 29


@pytest.mark.parametrize("bad", [[0.0], [-1.0], [np.inf], [2.0 ** 31]])
def test_fixed_point_rejects_what_it_cannot_represent(bad):
    with pytest.raises(QuantizationError):
        fixed_point(np.array(bad))


def test_per_channel_weights_are_symmetric_and_use_the_full_range():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 3, 3, 3)) * np.arange(1, 7).reshape(6, 1, 1, 1)
    w[5] = 0  # an all-zero channel
    q, s = quantize_weight(w, 0)
    assert q.dtype == np.int8 and s.shape == (6,)
    np.testing.assert_array_equal(np.abs(q[:5]).reshape(5, -1).max(axis=1), 127)
    assert (q[5] == 0).all() and s[5] == 1.0
    np.testing.assert_allclose(q[:5] * s[:5].reshape(5, 1, 1, 1), w[:5],
                               atol=float(s[:5].max()) / 2 + 1e-12)
    q2, s2 = quantize_weight(w.reshape(6, -1).T, 1)  # [K, N]: channels along axis 1
    np.testing.assert_array_equal(q2, q.reshape(6, -1).T)
    np.testing.assert_array_equal(s2, s)


def test_bias_and_activation_scales():
    np.testing.assert_array_equal(quantize_bias(np.array([1.0, -2.5, 1e12]),
                                                np.array([0.5, 1.0, 1.0])),
                                  np.array([2, -2, 2 ** 31 - 1], np.int32))
    assert activation_scale(127.0) == 1.0 and activation_scale(0.0) == 1.0
    with pytest.raises(QuantizationError, match="non-finite"):
        activation_scale(float("nan"))
