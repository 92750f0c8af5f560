"""Real models (random weights) through the PyTorch frontend, against eager PyTorch.

ResNet-18, MobileNetV2, BERT (MiniLM sizes), GPT-2, ViT and an LSTM classifier
(``kiln.testing.torch_programs``, at their test sizes) go through ``torch.export`` +
``from_exported_program`` with a dynamic batch (and sequence length for the transformers) and
through ``torch.compile(backend="kiln")``; each executable runs at two sizes and matches eager
within max |kiln - eager| / max |eager| <= 1e-4.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln.frontend.torch import dynamo, from_exported_program
from kiln.testing import torch_programs

SEQUENCE_MODELS = ("bert", "gpt2")


def _rel_err(out, ref) -> float:
    out, ref = np.asarray(out), ref.detach().numpy()
    assert out.shape == ref.shape
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def _other_size(name: str, inputs: tuple) -> tuple:
    """Inputs of another batch (3) and, for sequence models, another length (seq - 5)."""
    out = []
    for t in inputs:
        t = torch.cat([t, t[:1]])
        if name in SEQUENCE_MODELS:
            t = t[:, :-5]
        out.append(t)
    return tuple(out)


@pytest.mark.parametrize("name", list(torch_programs.MODELS))
def test_exported_program_matches_eager(name: str) -> None:
    model, inputs, dims = torch_programs.MODELS[name]("test")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, inputs, strict=False, dynamic_shapes=(
            torch_programs.dynamic_shapes(model, inputs, dims)))
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, params=params)
    for args in (inputs, _other_size(name, inputs)):
        with torch.no_grad():
            ref = model(*args)
        assert _rel_err(exe(*args), ref) <= 1e-4


@pytest.mark.parametrize("name", list(torch_programs.MODELS))
def test_torch_compile_matches_eager(name: str, monkeypatch) -> None:
    """The first call compiles static shapes, the second (another batch and length) the
    graph with those dims symbolic. Dynamo skips frames with RNN modules unless
    ``allow_rnn`` is set; the LSTM reaches kiln as ``aten.mkldnn_rnn_layer``."""
    torch._dynamo.reset()
    built = []
    build = dynamo.build
    monkeypatch.setattr(dynamo, "build", lambda *a, **k: built.append(1) or build(*a, **k))
    model, inputs, _ = torch_programs.MODELS[name]("test")
    compiled = torch.compile(model, backend="kiln")
    with torch._dynamo.config.patch(allow_rnn=True):
        for args in (inputs, _other_size(name, inputs)):
            with torch.no_grad():
                ref = model(*args)
                out = compiled(*args)
            assert isinstance(out, torch.Tensor)
            assert _rel_err(out.numpy(), ref) <= 1e-4
    assert len(built) == 2  # kiln ran the whole model: one static, one dynamic graph
