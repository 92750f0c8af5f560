"""Real networks exported from PyTorch (random weights) run through kiln and match onnxruntime.

ResNet-18, MobileNetV2, a 6-layer BERT-style encoder (seq 128, attention mask), a DBNet-style
text detector (640x640: resizes, concats, transposed convolutions) and an LSTM classifier (two
ONNX LSTM nodes of width 512 over 64 steps) are defined in
``kiln.testing.torch_models``; each is exported with torch's ONNX exporter, imported with
``from_onnx``, compiled at the default opt level and compared with onnxruntime on the same
random inputs: max |kiln - ort| / max |ort| <= 1e-5 (float32).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.testing import torch_models


def _ort_run(data: bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_encoder", "text_detector",
                                  "lstm"])
def test_exported_network_matches_onnxruntime(name: str) -> None:
    data, inputs = torch_models.onnx_model(name)
    model = onnx.load_from_string(data)
    names = [i.name for i in model.graph.input
             if i.name not in {t.name for t in model.graph.initializer}]
    feeds = dict(zip(names, inputs))
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    out = np.asarray(exe(**feeds))  # feeds by the model's input names, as ORT users pass them
    ref = _ort_run(data, feeds)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert _rel_err(out, ref) <= 1e-5
    # positional inputs give the same result
    np.testing.assert_array_equal(np.asarray(exe(*inputs)), out)


def test_dynamic_batch_compiles_once_runs_at_several_sizes() -> None:
    """A model exported with a dynamic batch dimension is one executable for every batch."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))
    data = torch_models.export_onnx(net, (torch.randn(2, 3, 16, 16),), ["x"],
                                    dynamic_batch=True)
    mod, params = from_onnx(onnx.load_from_string(data))
    exe = kiln.build(mod, params=params)
    rng = np.random.default_rng(1)
    for batch in (1, 3, 8):
        x = rng.standard_normal((batch, 3, 16, 16), dtype=np.float32)
        out = np.asarray(exe(x=x))
        ref = _ort_run(data, {"x": x})
        assert out.shape == (batch, 10)
        assert _rel_err(out, ref) <= 1e-4
