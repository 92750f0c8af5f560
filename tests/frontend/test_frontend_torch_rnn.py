"""nn.LSTM / nn.GRU through ``torch.export`` + ``from_exported_program``: torch's decomposition
unrolls the recurrence over the time steps; kiln must match eager for every layout option and
keep one copy of each weight, however many steps read it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.frontend.torch import from_exported_program

torch = pytest.importorskip("torch")

STEPS, BATCH, INPUT, HIDDEN = 5, 3, 8, 32  # 4 * 32 and 3 * 32 gate columns: packed GEMMs


class _Net(torch.nn.Module):
    def __init__(self, cell: str, bidirectional: bool, layers: int, batch_first: bool,
                 initial: bool) -> None:
        super().__init__()
        rnn = getattr(torch.nn, cell)
        self.rnn = rnn(INPUT, HIDDEN, num_layers=layers, bidirectional=bidirectional,
                       batch_first=batch_first)
        self.cell, self.initial = cell, initial

    def forward(self, x: Any, h0: Any, c0: Any) -> Any:
        if not self.initial:
            y, state = self.rnn(x)
        else:
            y, state = self.rnn(x, (h0, c0) if self.cell == "LSTM" else h0)
        return (y, *state) if isinstance(state, tuple) else (y, state)


@pytest.mark.parametrize("cell, bidirectional, layers, batch_first, initial", [
    ("LSTM", True, 2, True, True),
    ("LSTM", False, 1, False, False),
    ("GRU", True, 2, False, True),
    ("GRU", False, 1, True, False),
])
def test_rnn_matches_eager_and_stores_each_weight_once(cell: str, bidirectional: bool,
                                                       layers: int, batch_first: bool,
                                                       initial: bool) -> None:
    torch.manual_seed(0)
    net = _Net(cell, bidirectional, layers, batch_first, initial).eval()
    states = layers * (2 if bidirectional else 1)
    x = torch.randn((BATCH, STEPS, INPUT) if batch_first else (STEPS, BATCH, INPUT))
    h0, c0 = torch.randn(states, BATCH, HIDDEN), torch.randn(states, BATCH, HIDDEN)
    mod, params = from_exported_program(torch.export.export(net, (x, h0, c0), strict=False))
    exe = kiln.build(mod, params=params)
    outs = exe(x.numpy(), h0.numpy(), c0.numpy())
    with torch.no_grad():
        refs = net(x, h0, c0)
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(np.asarray(out), ref.numpy(), rtol=1e-5, atol=1e-5)
    # every step multiplies by the same weights: the executable holds each once (transposed
    # or packed), not a copy per time step
    constants = {id(c): c for c in exe.plans["main"].constants.values()}
    weight_bytes = sum(p.numel() * 4 for p in net.parameters())
    assert sum(c.nbytes for c in constants.values()) <= 2 * weight_bytes
