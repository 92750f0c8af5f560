"""Real PyTorch models with random weights for the PyTorch frontend's tests and benchmark.

Each entry of :data:`MODELS` builds ``(module in eval mode, example inputs, dynamic shapes)``
at a ``size``: ``"test"`` (small enough that the tests compile every model twice -- through
``torch.export`` and ``torch.compile`` -- in CI time) or ``"full"`` (the published
architecture's sizes, for ``benchmarks/torch_models.py``). ResNet-18 and MobileNetV2 are the
plain-PyTorch ones of ``kiln.testing.torch_models`` (torchvision has no build beside this torch);
BERT (MiniLM sizes), GPT-2 and ViT come from ``transformers`` configurations (no download);
the LSTM model is an embedding, a 2-layer LSTM and a classifier.

Dynamic shapes name the batch (``"batch"``) and, for sequence models, the sequence length
(``"seq"``) as ``torch.export.Dim``s. PyTorch and transformers are imported lazily.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import torch_models


def _seed() -> Any:
    import torch

    torch.manual_seed(0)
    return torch


def _randomize_norms(module: Any) -> Any:
    """Random BatchNorm statistics and affine parameters, so folding them is tested."""
    torch = _seed()
    for m in module.modules():
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            with torch.no_grad():
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return module.eval()


def _image_model(make: Callable[[], Any], size: str) -> tuple[Any, tuple, dict]:
    torch = _seed()
    model = _randomize_norms(make())
    hw = 64 if size == "test" else 224
    x = torch.randn(2 if size == "test" else 1, 3, hw, hw)
    batch = torch.export.Dim("batch", min=1, max=64)
    return model, (x,), {"x": {0: batch}}


def resnet18(size: str = "test") -> tuple[Any, tuple, dict]:
    return _image_model(lambda: torch_models.resnet18(num_classes=100 if size == "test"
                                                      else 1000), size)


def mobilenet_v2(size: str = "test") -> tuple[Any, tuple, dict]:
    return _image_model(lambda: torch_models.mobilenet_v2(num_classes=100 if size == "test"
                                                          else 1000), size)


def _last_hidden_state(model: Any, inputs: tuple[str, ...]) -> Any:
    """A module with positional ``inputs`` (names of the transformers model's arguments)
    returning the output's ``last_hidden_state``."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any, mask: Any = None) -> Any:
            kwargs = {inputs[0]: x}
            if mask is not None:
                kwargs[inputs[1]] = mask
            return self.model(**kwargs, return_dict=True).last_hidden_state

    return LastHiddenState().eval()


def _token_inputs(vocab: int, batch: int, seq: int, mask: bool) -> tuple[Any, ...]:
    torch = _seed()
    ids = torch.randint(0, vocab, (batch, seq))
    if not mask:
        return (ids,)
    attn = torch.ones(batch, seq, dtype=torch.int64)
    attn[:, seq * 3 // 4:] = 0  # a padded tail
    return ids, attn


def _seq_dims(names: tuple[str, ...], max_seq: int) -> dict:
    import torch

    batch = torch.export.Dim("batch", min=1, max=32)
    seq = torch.export.Dim("seq", min=2, max=max_seq)
    return {n: {0: batch, 1: seq} for n in names}


def bert(size: str = "test") -> tuple[Any, tuple, dict]:
    """BERT with MiniLM-L6's sizes (hidden 384, 12 heads, FFN 1536), 2 layers for tests."""
    _seed()
    import transformers

    cfg = transformers.BertConfig(hidden_size=384, num_hidden_layers=2 if size == "test" else 6,
                                  num_attention_heads=12, intermediate_size=1536,
                                  attn_implementation="sdpa")
    model = _last_hidden_state(transformers.BertModel(cfg, add_pooling_layer=False).eval(),
                               ("input_ids", "attention_mask"))
    inputs = _token_inputs(cfg.vocab_size, 2 if size == "test" else 1,
                           16 if size == "test" else 128, True)
    return model, inputs, _seq_dims(("x", "mask"), 512)


def gpt2(size: str = "test") -> tuple[Any, tuple, dict]:
    """GPT-2 (small: 12 layers, hidden 768), 2 layers of hidden 256 for tests. Eager
    attention: with SDPA, torch.export of transformers' GPT-2 fails on dynamic shapes (a view
    of the attention output whose symbolic strides torch cannot prove contiguous)."""
    _seed()
    import transformers

    if size == "test":
        cfg = transformers.GPT2Config(n_embd=256, n_layer=2, n_head=8, use_cache=False,
                                      attn_implementation="eager")
    else:
        cfg = transformers.GPT2Config(use_cache=False, attn_implementation="eager")
    model = _last_hidden_state(transformers.GPT2Model(cfg).eval(), ("input_ids",))
    inputs = _token_inputs(cfg.vocab_size, 2 if size == "test" else 1,
                           16 if size == "test" else 128, False)
    return model, inputs, _seq_dims(("x",), 1024)


def vit(size: str = "test") -> tuple[Any, tuple, dict]:
    """ViT-B/16 at 224 px; for tests 2 layers of hidden 192 on 64 px images."""
    torch = _seed()
    import transformers

    if size == "test":
        cfg = transformers.ViTConfig(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=768, image_size=64, patch_size=16,
                                     attn_implementation="sdpa")
    else:
        cfg = transformers.ViTConfig(attn_implementation="sdpa")
    model = _last_hidden_state(transformers.ViTModel(cfg, add_pooling_layer=False).eval(),
                               ("pixel_values",))
    x = torch.randn(2 if size == "test" else 1, 3, cfg.image_size, cfg.image_size)
    batch = torch.export.Dim("batch", min=1, max=64)
    return model, (x,), {"x": {0: batch}}


def lstm(size: str = "test") -> tuple[Any, tuple, dict]:
    """Embedding -> 2-layer LSTM -> linear classifier of the last step's hidden state. Only
    the batch is dynamic: torch.export unrolls the recurrence over the time steps, so the
    sequence length is fixed by the export (torch reports a constraint violation otherwise)."""
    torch = _seed()
    hidden = 128 if size == "test" else 512

    class LSTMClassifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(1000, hidden)
            self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(hidden, 10)

        def forward(self, ids: Any) -> Any:
            out, _ = self.lstm(self.embed(ids))
            return self.head(out[:, -1])

    inputs = _token_inputs(1000, 2 if size == "test" else 1, 16 if size == "test" else 64,
                           False)
    batch = torch.export.Dim("batch", min=1, max=32)
    return LSTMClassifier().eval(), inputs, {"ids": {0: batch}}


MODELS: dict[str, Callable[[str], tuple[Any, tuple, dict]]] = {
    "resnet18": resnet18, "mobilenet_v2": mobilenet_v2, "bert": bert, "gpt2": gpt2,
    "vit": vit, "lstm": lstm,
}


def dynamic_shapes(model: Any, inputs: tuple, dims: dict) -> dict:
    """``dims`` (by input name) as torch.export's ``dynamic_shapes`` for ``model``'s forward:
    one entry per argument the inputs fill."""
    names = list(inspect.signature(model.forward).parameters)[:len(inputs)]
    return {n: dims.get(n) for n in names}
