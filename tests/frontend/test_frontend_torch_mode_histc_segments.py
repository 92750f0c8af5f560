"""torch.mode, torch.histc, torch.segment_reduce and embedding_bag through torch.export and
kiln, against eager: repeated values and ties (mode), the data's range, edges and values
outside (histc), empty segments and ``initial`` for every reduction (segment_reduce), and
every mode with padding_idx, per_sample_weights and include_last_offset (embedding_bag,
all four results)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln.frontend.torch import from_exported_program


def _run(module, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, args)
    mod, params = from_exported_program(ep)
    got = kiln.build(mod, params=params)(*args)
    want = module(*args)
    return (got if isinstance(got, (tuple, list)) else (got,),
            want if isinstance(want, (tuple, list)) else (want,))


def _same(got, want, rtol=1e-6):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        w = w.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6, equal_nan=True,
                                   err_msg=f"result {k}")


class Mode(torch.nn.Module):
    def forward(self, x, y, z):
        return (*torch.mode(x, 1), *torch.mode(y, 0, keepdim=True), *torch.mode(z))


def test_mode_counts_repeats_and_breaks_ties_like_torch():
    """The most frequent value (ties: the smallest), at its last position; NaNs count as
    one value."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (6, 9), generator=g).float()
    y = torch.randint(-2, 3, (7, 5), generator=g)
    z = torch.tensor([float("nan"), 1.0, float("nan"), 2.0, 3.0, 3.0])
    _same(*_run(Mode(), x, y, z))


class Histc(torch.nn.Module):
    def forward(self, x, flat, small):
        return (torch.histc(x, 17, -1.3, 2.7), torch.histc(small, 10), torch.histc(flat, 5),
                torch.histc(x, 40, -8, 8))


def test_histc_bins_like_torch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, generator=g) * 2
    x[:5] = torch.tensor([2.7, -1.3, float("nan"), 1.5, 100.0])  # edges, NaN, outside
    _same(*_run(Histc(), x, torch.full((7,), 3.0), torch.randn(3000, generator=g)))


class Segments(torch.nn.Module):
    def __init__(self, reduce, initial):
        super().__init__()
        self.reduce, self.initial = reduce, initial

    def forward(self, d, d2, lengths, offsets):
        return (torch.segment_reduce(d, self.reduce, lengths=lengths, initial=self.initial),
                torch.segment_reduce(d2, self.reduce, offsets=offsets, initial=self.initial))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 10.0])
def test_segment_reduce_like_torch(reduce, initial):
    """Lengths and offsets with an empty segment; rows of a 2-D tensor; ``initial``."""
    g = torch.Generator().manual_seed(2)
    d = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    _same(*_run(Segments(reduce, initial), d, torch.randn(6, 3, generator=g),
                torch.tensor([2, 0, 3, 1]), torch.tensor([0, 2, 2, 5, 6])))


#: (which offsets, include_last_offset): the last two with their final offset at the end,
#: where torch's kernels agree on include_last_offset
BAG_LAYOUTS = ((0, False), (1, True), (2, True))


class Bags(torch.nn.Module):
    """Every layout x padding_idx (x per_sample_weights in sum mode) in one program."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def forward(self, w, i, psw, *offsets):
        out = []
        for k, last in BAG_LAYOUTS:
            for padding in (-1, 2):
                for weights in (None, psw) if self.mode == 0 else (None,):
                    out += torch.ops.aten._embedding_bag_forward_only(
                        w, i, offsets[k], False, self.mode, False, weights, last, padding)
        return tuple(out)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag_like_torch(mode):
    """All four results of each call, with empty bags, padding_idx, per_sample_weights (sum)
    and include_last_offset."""
    g = torch.Generator().manual_seed(3)
    w, psw = torch.randn(10, 3, generator=g), torch.randn(8, generator=g)
    i = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    _same(*_run(Bags(mode), w, i, psw, torch.tensor([0, 4, 4]), torch.tensor([0, 3, 8]),
                torch.tensor([0, 0, 5, 8])))
