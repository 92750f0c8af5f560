"""The CPU convolution schedules' tile choices (kiln/schedule/cpu/convolution.py); their
numerics are checked against numpy in tests/op/test_op_nn.py."""

from __future__ import annotations

import pytest

from kiln.schedule.cpu.convolution import CONV_NCHW_ACCUMULATORS, conv_nchw_tile


@pytest.mark.parametrize(("channels", "vectors", "lanes", "tile"), [
    (6, 10, 16, (3, 5)),   # a text detector's 24 -> 6 smoothing conv at 160 pixels, AVX-512
    (6, 10, 8, (6, 2)),    # the same with AVX2 (12 accumulators at most)
    (6, 5, 16, (3, 5)),
    (5, 4, 16, (5, 4)),
    (1, 7, 16, (1, 7)),
    (7, 1, 8, (7, 1)),
    (64, 2, 16, (8, 2)),
])
def test_conv_nchw_tile(channels, vectors, lanes, tile):
    ob, xv = conv_nchw_tile(channels, vectors, lanes)
    assert (ob, xv) == tile
    assert channels % ob == 0 and vectors % xv == 0
    assert ob * xv <= CONV_NCHW_ACCUMULATORS[lanes]
