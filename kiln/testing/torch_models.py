"""Real networks written in plain PyTorch and exported to ONNX with random weights.

They are what users bring to kiln: the ONNX frontend's end-to-end tests and
``benchmarks/models.py`` use them. torchvision has no CPU build on kiln's machines, so ResNet-18
and MobileNetV2 are written here from their papers' layer tables (same layers, same shapes as
torchvision's); the encoder is a BERT-base-style block stack with an attention mask; the text
detector is a small DBNet-style FPN on MobileNetV2's backbone (resizes, concats, transposed
convolutions).

PyTorch is a test-only dependency: this module imports it lazily, inside the functions.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np


def _torch() -> Any:
    import torch

    return torch


def resnet18(num_classes: int = 1000) -> Any:
    """ResNet-18 (He et al. 2015): 4 stages of 2 basic blocks, 64-128-256-512 channels."""
    torch = _torch()
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            idt = x if self.down is None else self.down(x)
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + idt)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet18()


def _inverted_residual_blocks() -> tuple[Any, Any]:
    """``(conv_bn, InvertedResidual)``: MobileNetV2's building blocks, shared by
    :func:`mobilenet_v2` and the backbone of :func:`text_detector`."""
    torch = _torch()
    nn = torch.nn

    def conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1,
                act: bool = True) -> Any:
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.ReLU6())
        return nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int):
            super().__init__()
            hidden = cin * expand
            layers = [] if expand == 1 else [conv_bn(cin, hidden, 1, 1)]
            layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden),
                       conv_bn(hidden, cout, 1, 1, act=False)]
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.residual else self.body(x)

    return conv_bn, InvertedResidual


def _inverted_residual_stage(block: Any, cin: int, settings: Any) -> tuple[list[Any], int]:
    """The blocks of MobileNetV2 setting rows ``(t, c, n, s)``, and the channels they end with."""
    layers = []
    for t, c, n, s in settings:
        for i in range(n):
            layers.append(block(cin, c, s if i == 0 else 1, t))
            cin = c
    return layers, cin


def mobilenet_v2(num_classes: int = 1000) -> Any:
    """MobileNetV2 (Sandler et al. 2018): inverted residual blocks with ReLU6, width 1.0."""
    torch = _torch()
    nn = torch.nn
    conv_bn, block = _inverted_residual_blocks()

    class MobileNetV2(nn.Module):
        # (expansion t, channels c, repeats n, first stride s) from the paper's Table 2
        SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

        def __init__(self) -> None:
            super().__init__()
            stem = conv_bn(3, 32, 3, 2)
            layers, cin = _inverted_residual_stage(block, 32, self.SETTINGS)
            self.features = nn.Sequential(stem, *layers, conv_bn(cin, 1280, 1, 1))
            self.classifier = nn.Linear(1280, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.features(x).mean((2, 3))
            return self.classifier(x)

    return MobileNetV2()


def text_detector(inner: int = 24) -> Any:
    """A DBNet-style text detector (Liao et al. 2020), small: a MobileNetV2 backbone (width 1.0,
    to stride 32), an FPN neck (1x1 laterals to ``inner`` channels, nearest-neighbour top-down
    upsampling and sums, 3x3 smoothing to ``inner / 4`` channels per level, bilinear upsampling
    of every level to stride 4 and a concat of the four), and the probability head: 3x3 conv,
    two 2x2 stride-2 ConvTranspose layers (``inner -> inner`` to stride 2, ``inner -> 1`` to full
    resolution, BatchNorm + ReLU between) and a sigmoid.

    ``forward(image (B, 3, H, W))`` with H, W multiples of 32 returns the (B, 1, H, W) text
    probability map. It holds what detection networks add to a classifier: resizes, concats of
    feature maps at several scales, transposed convolutions and large maps with few channels.
    """
    torch = _torch()
    nn = torch.nn
    functional = nn.functional
    conv_bn, block = _inverted_residual_blocks()
    # MobileNetV2's rows up to stride 32 (the 96-channel row at stride 16, the last one at 32)
    stages = (((1, 16, 1, 1), (6, 24, 2, 2)), ((6, 32, 3, 2),), ((6, 64, 4, 2), (6, 96, 3, 1)),
              ((6, 160, 3, 2),))

    class TextDetector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = conv_bn(3, 32, 3, 2)
            cin, self.stages, widths = 32, nn.ModuleList(), []
            for rows in stages:
                layers, cin = _inverted_residual_stage(block, cin, rows)
                self.stages.append(nn.Sequential(*layers))
                widths.append(cin)
            self.lateral = nn.ModuleList(nn.Conv2d(c, inner, 1, bias=False) for c in widths)
            self.smooth = nn.ModuleList(nn.Conv2d(inner, inner // 4, 3, padding=1, bias=False)
                                        for _ in widths)
            self.head = nn.Sequential(
                nn.Conv2d(inner, inner, 3, padding=1, bias=False), nn.BatchNorm2d(inner),
                nn.ReLU(), nn.ConvTranspose2d(inner, inner, 2, 2), nn.BatchNorm2d(inner),
                nn.ReLU(), nn.ConvTranspose2d(inner, 1, 2, 2), nn.Sigmoid())

        def forward(self, x: Any) -> Any:
            x = self.stem(x)
            feats = []
            for stage in self.stages:
                x = stage(x)
                feats.append(x)
            lat = [conv(f) for conv, f in zip(self.lateral, feats)]
            for i in range(len(lat) - 2, -1, -1):  # top-down: nearest upsampling and sum
                lat[i] = lat[i] + functional.interpolate(lat[i + 1], scale_factor=2.0,
                                                         mode="nearest")
            size = lat[0].shape[2:]
            maps = [functional.interpolate(conv(p), size=size, mode="bilinear",
                                           align_corners=False) if i else conv(p)
                    for i, (conv, p) in enumerate(zip(self.smooth, lat))]
            return self.head(torch.cat(maps, 1))

    return TextDetector()


def mlp(sizes: tuple[int, ...] = (784, 1024, 1024, 10)) -> Any:
    """Linear-ReLU layers (no ReLU after the last): the MLP of the speed targets."""
    torch = _torch()
    layers: list[Any] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def bert_encoder(layers: int = 6, hidden: int = 768, heads: int = 12, ffn: int = 3072,
                 vocab: int = 30522, max_len: int = 512) -> Any:
    """A BERT-style encoder: embeddings + ``layers`` post-LN transformer blocks (GELU FFN).

    ``forward(input_ids int64 (B, S), attention_mask int64 (B, S))`` returns the last hidden
    state (B, S, hidden); masked key positions get -10000 added to their scores, as BERT does.
    """
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.out = nn.Linear(hidden, hidden)
            self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
            self.ff1 = nn.Linear(hidden, ffn)
            self.ff2 = nn.Linear(ffn, hidden)
            self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, x: Any, bias: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split(hidden, dim=-1)
            d = hidden // heads

            def split(t: Any) -> Any:
                return t.reshape(b, s, heads, d).transpose(1, 2)

            scores = split(q) @ split(k).transpose(-1, -2) / (d ** 0.5) + bias
            ctx = (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, s, hidden)
            x = self.ln1(x + self.out(ctx))
            return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(max_len, hidden)
            self.ln = nn.LayerNorm(hidden, eps=1e-12)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            x = self.ln(self.tok(input_ids) + self.pos(pos))
            bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for blk in self.blocks:
                x = blk(x, bias)
            return x

    return Encoder()


def lstm_classifier(vocab: int = 1000, hidden: int = 512, layers: int = 2,
                    classes: int = 10) -> Any:
    """Embedding -> ``layers``-layer LSTM (batch first) -> linear classifier of the last step's
    hidden state: the recurrent model of the speed targets (ONNX ``LSTM`` nodes once exported;
    ``kiln.testing.torch_programs.lstm`` is the same network for the torch frontend)."""
    torch = _torch()
    nn = torch.nn

    class LSTMClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
            self.head = nn.Linear(hidden, classes)

        def forward(self, ids: Any) -> Any:
            out, _ = self.lstm(self.embed(ids))
            return self.head(out[:, -1])

    return LSTMClassifier()


def export_onnx(module: Any, example_inputs: tuple[Any, ...], input_names: list[str],
                dynamic_batch: bool = False, opset: int = 17, seed: int = 0) -> bytes:
    """Serialize ``module`` (random weights, eval mode) to ONNX bytes with torch's exporter.

    BatchNorm running statistics are randomized too, so that folding them is actually tested.
    Uses the TorchScript-based exporter (``dynamo=False``): the torch.export-based one needs the
    ``onnxscript`` package, which kiln does not depend on.
    """
    torch = _torch()
    torch.manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    module.eval()
    buf = io.BytesIO()
    dyn = {n: {0: "batch"} for n in input_names} if dynamic_batch else None
    torch.onnx.export(module, example_inputs, buf, input_names=input_names,
                      output_names=["output"], dynamic_axes=dyn, opset_version=opset,
                      dynamo=False)
    return buf.getvalue()


def example_inputs(name: str, batch: int = 1, seq: int = 128, seed: int = 0) -> list[np.ndarray]:
    """Random inputs for ``resnet18``/``mobilenet_v2`` (224x224 images), ``text_detector``
    (640x640 images), ``mlp`` (batch x 784), ``lstm`` (batch x 64 token ids) or
    ``bert_encoder`` (token ids + attention mask)."""
    rng = np.random.default_rng(seed)
    if name in ("resnet18", "mobilenet_v2"):
        return [rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)]
    if name == "text_detector":
        return [rng.standard_normal((batch, 3, 640, 640), dtype=np.float32)]
    if name == "mlp":
        return [rng.standard_normal((batch, 784), dtype=np.float32)]
    if name == "lstm":
        return [rng.integers(0, 1000, size=(batch, 64), dtype=np.int64)]
    if name == "bert_encoder":
        ids = rng.integers(0, 30522, size=(batch, seq), dtype=np.int64)
        mask = np.ones((batch, seq), dtype=np.int64)
        mask[:, seq * 3 // 4:] = 0  # padded tail
        return [ids, mask]
    raise ValueError(f"unknown model {name!r}")


MODELS = {"resnet18": (resnet18, ["input"]), "mobilenet_v2": (mobilenet_v2, ["input"]),
          "text_detector": (text_detector, ["input"]),
          "mlp": (mlp, ["input"]), "lstm": (lstm_classifier, ["ids"]),
          "bert_encoder": (bert_encoder, ["input_ids", "attention_mask"])}


def exported(name: str, batch: int = 1, dynamic_batch: bool = False) -> tuple[Any, bytes, list]:
    """(torch module in eval mode, its ONNX bytes, example numpy inputs) for one of ``MODELS``;
    the module is the exported one, so torch eager and the ONNX file compute the same thing."""
    torch = _torch()
    make, names = MODELS[name]
    torch.manual_seed(0)
    module = make()
    inputs = example_inputs(name, batch)
    data = export_onnx(module, tuple(torch.from_numpy(a) for a in inputs), names,
                       dynamic_batch=dynamic_batch)
    return module, data, inputs


def onnx_model(name: str, batch: int = 1, dynamic_batch: bool = False) -> tuple[bytes, list]:
    """(ONNX bytes, example numpy inputs) for one of ``MODELS``."""
    _, data, inputs = exported(name, batch, dynamic_batch)
    return data, inputs
