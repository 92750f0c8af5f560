"""Vision and audio networks written in plain PyTorch (torchvision has no build beside the
CPU torch kiln tests with): the layer patterns of the published models at small sizes.

ResNet-18 and MobileNetV2 are :mod:`kiln.testing.torch_models`' (full width, 64x64 images);
the others are written here from their papers: MobileNetV3 (hard-swish, squeeze-excite),
EfficientNet (MBConv with SiLU and squeeze-excite), ConvNeXt (7x7 depthwise, channels-last
LayerNorm, layer scale), U-Net (transposed-convolution decoder with skip concatenations), a
DBNet-style text detector (FPN over a ResNet backbone, probability and threshold maps,
differentiable binarization), a CRNN (conv features read by a bidirectional LSTM), LSTM/GRU
taggers, a keyword-spotting TC-ResNet, a convolutional STFT voice-activity detector whose
silence gate is an ONNX ``If`` (scripted control flow, as the Silero VAD export has),
SqueezeNet, ShuffleNetV2, a DenseNet block stack and a VGG. ``build(config)`` dispatches on
``config["arch"]``; every other key is an argument of the architecture's function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import onnx
from onnx import TensorProto, helper

from .. import torch_models
from .catalogue import InputSpec, ZooModel, register


def _nn() -> Any:
    import torch

    return torch.nn


def conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
            act: str | None = "relu") -> Any:
    """Conv (same padding, no bias) -> BatchNorm -> activation (``None`` for none)."""
    nn = _nn()
    acts = {"relu": nn.ReLU, "relu6": nn.ReLU6, "hswish": nn.Hardswish, "silu": nn.SiLU,
            "gelu": nn.GELU}
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act:
        layers.append(acts[act]())
    return nn.Sequential(*layers)


def squeeze_excite(channels: int, reduced: int, gate: str = "sigmoid") -> Any:
    nn = _nn()

    class SqueezeExcite(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Conv2d(channels, reduced, 1)
            self.fc2 = nn.Conv2d(reduced, channels, 1)
            self.gate = nn.Hardsigmoid() if gate == "hsigmoid" else nn.Sigmoid()

        def forward(self, x: Any) -> Any:
            s = x.mean((2, 3), keepdim=True)
            return x * self.gate(self.fc2(nn.functional.relu(self.fc1(s))))

    return SqueezeExcite()


def inverted_residual(cin: int, cout: int, k: int, stride: int, expand: int, act: str,
                      se: bool) -> Any:
    """MobileNetV3/EfficientNet block: expand 1x1 -> depthwise kxk -> (SE) -> project 1x1."""
    nn = _nn()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            hidden = cin * expand
            layers = [] if expand == 1 else [conv_bn(cin, hidden, 1, act=act)]
            layers.append(conv_bn(hidden, hidden, k, stride, groups=hidden, act=act))
            if se:
                layers.append(squeeze_excite(hidden, max(8, hidden // 4),
                                             "hsigmoid" if act == "hswish" else "sigmoid"))
            layers.append(conv_bn(hidden, cout, 1, act=None))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.residual else self.body(x)

    return Block()


def mobilenet_v3(classes: int = 10) -> Any:
    """MobileNetV3-Small's block table (kernel, expansion, out, SE, activation, stride)."""
    nn = _nn()
    table = ((3, 1, 16, True, "relu", 2), (3, 4, 24, False, "relu", 2),
             (3, 3, 24, False, "relu", 1), (5, 4, 40, True, "hswish", 2),
             (5, 6, 40, True, "hswish", 1), (5, 3, 48, True, "hswish", 1),
             (5, 6, 96, True, "hswish", 2), (5, 6, 96, True, "hswish", 1))
    layers, cin = [conv_bn(3, 16, 3, 2, act="hswish")], 16
    for k, t, c, se, act, s in table:
        layers.append(inverted_residual(cin, c, k, s, t, act, se))
        cin = c
    layers.append(conv_bn(cin, 576, 1, act="hswish"))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(576, 256),
                         nn.Hardswish(), nn.Linear(256, classes))


def efficientnet(width: float = 0.5, classes: int = 10) -> Any:
    """EfficientNet-B0's stages (MBConv, SiLU, squeeze-excite) at ``width`` x channels, one
    block per stage."""
    nn = _nn()

    def ch(c: int) -> int:
        return max(8, int(c * width + 4) // 8 * 8)

    stages = ((1, 3, 16, 1), (6, 3, 24, 2), (6, 5, 40, 2), (6, 3, 80, 2), (6, 5, 112, 1),
              (6, 5, 192, 2), (6, 3, 320, 1))
    layers, cin = [conv_bn(3, ch(32), 3, 2, act="silu")], ch(32)
    for t, k, c, s in stages:
        layers.append(inverted_residual(cin, ch(c), k, s, t, "silu", True))
        cin = ch(c)
    layers.append(conv_bn(cin, ch(1280), 1, act="silu"))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(ch(1280), classes))


def convnext(dims: tuple[int, ...] = (32, 64, 128), depths: tuple[int, ...] = (1, 1, 2),
             classes: int = 10) -> Any:
    """ConvNeXt: patchify stem, blocks of 7x7 depthwise conv -> LayerNorm (channels last) ->
    4x MLP with GELU -> layer scale, residual; LayerNorm + 2x2 stride-2 conv downsampling."""
    torch = __import__("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.fc1 = nn.Linear(dim, 4 * dim)
            self.fc2 = nn.Linear(4 * dim, dim)
            self.gamma = nn.Parameter(torch.rand(dim) * 0.5 + 0.1)

        def forward(self, x: Any) -> Any:
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.fc2(nn.functional.gelu(self.fc1(self.norm(y)))) * self.gamma
            return x + y.permute(0, 3, 1, 2)

    class ChannelNorm(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(dim, eps=1e-6)

        def forward(self, x: Any) -> Any:
            return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    layers: list[Any] = [nn.Conv2d(3, dims[0], 4, 4), ChannelNorm(dims[0])]
    for i, (dim, depth) in enumerate(zip(dims, depths)):
        if i:
            layers += [ChannelNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
        layers += [Block(dim) for _ in range(depth)]
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(dims[-1]),
            nn.Linear(dims[-1], classes)]
    return nn.Sequential(*layers, *head)


def unet(base: int = 16, depth: int = 3, classes: int = 2) -> Any:
    """U-Net: double 3x3 conv stages, max-pool down, 2x2 transposed conv up, skip concat."""
    torch = __import__("torch")
    nn = torch.nn

    def double(cin: int, cout: int) -> Any:
        return nn.Sequential(conv_bn(cin, cout), conv_bn(cout, cout))

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            chans = [base * 2 ** i for i in range(depth + 1)]
            self.down = nn.ModuleList([double(3, chans[0])] + [
                double(chans[i], chans[i + 1]) for i in range(depth)])
            self.up = nn.ModuleList(nn.ConvTranspose2d(chans[i + 1], chans[i], 2, 2)
                                    for i in reversed(range(depth)))
            self.dec = nn.ModuleList(double(2 * chans[i], chans[i])
                                     for i in reversed(range(depth)))
            self.head = nn.Conv2d(chans[0], classes, 1)

        def forward(self, x: Any) -> Any:
            skips = []
            for i, stage in enumerate(self.down):
                x = stage(x if i == 0 else nn.functional.max_pool2d(x, 2))
                skips.append(x)
            for up, dec, skip in zip(self.up, self.dec, reversed(skips[:-1])):
                x = dec(torch.cat([up(x), skip], 1))
            return self.head(x)

    return UNet()


def basic_block(cin: int, cout: int, stride: int) -> Any:
    """ResNet's basic block (two 3x3 convs, projection shortcut when the shape changes)."""
    nn = _nn()

    class BasicBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(conv_bn(cin, cout, 3, stride),
                                      conv_bn(cout, cout, 3, act=None))
            self.down = (None if stride == 1 and cin == cout
                         else conv_bn(cin, cout, 1, stride, act=None))

        def forward(self, x: Any) -> Any:
            idt = x if self.down is None else self.down(x)
            return nn.functional.relu(self.body(x) + idt)

    return BasicBlock()


def dbnet(width: int = 16, k: float = 50.0) -> Any:
    """DBNet (Liao et al. 2020): a ResNet backbone (strides 4-32), an FPN (nearest upsampling,
    additions, 3x3 smoothing, concatenation at 1/4), a probability head and a threshold head
    (3x3 conv, two 2x2 transposed convs, sigmoid) and the approximate binary map
    1 / (1 + exp(-k (P - T))). Returns the three maps stacked on channels."""
    torch = __import__("torch")
    nn = torch.nn
    F = nn.functional

    def head() -> Any:
        c = width
        return nn.Sequential(conv_bn(4 * c, c), nn.ConvTranspose2d(c, c, 2, 2),
                             nn.BatchNorm2d(c), nn.ReLU(), nn.ConvTranspose2d(c, 1, 2, 2),
                             nn.Sigmoid())

    class DBNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = width
            chans = (c, 2 * c, 4 * c, 8 * c)
            self.stem = nn.Sequential(conv_bn(3, c, 3, 2), nn.MaxPool2d(3, 2, 1))
            self.stages = nn.ModuleList()
            cin = c
            for i, cout in enumerate(chans):
                self.stages.append(nn.Sequential(basic_block(cin, cout, 1 if i == 0 else 2),
                                                 basic_block(cout, cout, 1)))
                cin = cout
            self.lateral = nn.ModuleList(nn.Conv2d(ch, 4 * c, 1, bias=False) for ch in chans)
            self.smooth = nn.ModuleList(nn.Conv2d(4 * c, c, 3, padding=1, bias=False)
                                        for _ in chans)
            self.prob, self.thresh = head(), head()

        def forward(self, x: Any) -> Any:
            feats = []
            x = self.stem(x)
            for stage in self.stages:
                x = stage(x)
                feats.append(x)
            lat = [conv(f) for conv, f in zip(self.lateral, feats)]
            for i in range(len(lat) - 2, -1, -1):
                lat[i] = lat[i] + F.interpolate(lat[i + 1], scale_factor=2.0, mode="nearest")
            outs = [F.interpolate(s(t), scale_factor=2.0 ** i, mode="nearest")
                    for i, (s, t) in enumerate(zip(self.smooth, lat))]
            fuse = torch.cat(outs, 1)
            p, t = self.prob(fuse), self.thresh(fuse)
            return torch.cat([p, t, torch.reciprocal(1 + torch.exp(-k * (p - t)))], 1)

    return DBNet()


def crnn(classes: int = 37, hidden: int = 64) -> Any:
    """CRNN (Shi et al. 2015): a VGG-style conv stack squeezing a 32-pixel-high text line to
    height 1, a 2-layer bidirectional LSTM over the columns, per-column log-probabilities."""
    nn = _nn()

    class CRNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cnn = nn.Sequential(
                conv_bn(1, 32), nn.MaxPool2d(2, 2), conv_bn(32, 64), nn.MaxPool2d(2, 2),
                conv_bn(64, 96), conv_bn(96, 96), nn.MaxPool2d((2, 1), (2, 1)),
                conv_bn(96, 128), nn.MaxPool2d((2, 1), (2, 1)),
                nn.Conv2d(128, 128, (2, 1)), nn.ReLU())
            self.rnn = nn.LSTM(128, hidden, num_layers=2, bidirectional=True,
                               batch_first=True)
            self.fc = nn.Linear(2 * hidden, classes)

        def forward(self, x: Any) -> Any:
            f = self.cnn(x).squeeze(2).permute(0, 2, 1)  # (N, W/4, C)
            out, _ = self.rnn(f)
            return nn.functional.log_softmax(self.fc(out), -1)

    return CRNN()


def tagger(cell: str = "lstm", vocab: int = 1000, dim: int = 64, tags: int = 17) -> Any:
    """A sequence tagger: embedding -> 2-layer bidirectional LSTM or GRU -> per-token tags."""
    nn = _nn()
    rnn_cls = nn.LSTM if cell == "lstm" else nn.GRU

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.rnn = rnn_cls(dim, dim, num_layers=2, bidirectional=True, batch_first=True)
            self.fc = nn.Linear(2 * dim, tags)

        def forward(self, ids: Any) -> Any:
            out, _ = self.rnn(self.embed(ids))
            return self.fc(out)

    return Tagger()


def tc_resnet(classes: int = 12, mels: int = 40, width: int = 24) -> Any:
    """TC-ResNet keyword spotter: MFCC-like features as channels, 1-D temporal convolutions
    (kernel 9) in residual blocks, average pooling, a linear classifier."""
    nn = _nn()

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv1d(cin, cout, 9, stride, 4, bias=False), nn.BatchNorm1d(cout), nn.ReLU(),
                nn.Conv1d(cout, cout, 9, 1, 4, bias=False), nn.BatchNorm1d(cout))
            self.short = nn.Sequential(nn.Conv1d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm1d(cout))

        def forward(self, x: Any) -> Any:
            return nn.functional.relu(self.body(x) + self.short(x))

    w = width
    return nn.Sequential(nn.Conv1d(mels, w, 3, 1, 1, bias=False), Block(w, 2 * w, 2),
                         Block(2 * w, 2 * w, 2), Block(2 * w, 3 * w, 2),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(3 * w, classes))


def stft_vad(n_fft: int = 256, hop: int = 128, hidden: int = 32) -> Any:
    """A voice-activity detector in the shape of Silero VAD's export: the STFT as a strided
    Conv1d with a fixed cosine/sine basis, magnitude, log compression, a conv encoder, a GRU
    and a sigmoid speech probability per frame. Its ONNX file gets a silence gate, an ``If``
    (:func:`add_silence_gate`)."""
    torch = __import__("torch")
    nn = torch.nn

    class VAD(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            bins = n_fft // 2 + 1
            n = torch.arange(n_fft, dtype=torch.float32)
            f = torch.arange(bins, dtype=torch.float32)[:, None]
            window = 0.5 - 0.5 * torch.cos(2 * math.pi * n / n_fft)
            angle = 2 * math.pi * f * n / n_fft
            basis = torch.cat([torch.cos(angle) * window, -torch.sin(angle) * window])
            self.register_buffer("basis", basis[:, None, :])
            self.bins = bins
            self.enc = nn.Sequential(nn.Conv1d(bins, hidden, 3, padding=1), nn.ReLU(),
                                     nn.Conv1d(hidden, hidden, 3, padding=1), nn.ReLU())
            self.gru = nn.GRU(hidden, hidden, batch_first=True)
            self.out = nn.Linear(hidden, 1)

        def forward(self, audio: Any) -> Any:
            spec = nn.functional.conv1d(audio[:, None, :], self.basis, stride=hop)
            re, im = spec[:, :self.bins], spec[:, self.bins:]
            mag = torch.log(torch.sqrt(re * re + im * im + 1e-9) + 1e-3)
            h, _ = self.gru(self.enc(mag).transpose(1, 2))
            return torch.sigmoid(self.out(h)).squeeze(-1)

    return VAD()


def add_silence_gate(data: bytes, threshold: float = 1e-4) -> bytes:
    """Gate the VAD's output with an ``If``: zeros when the input's mean energy is below
    ``threshold``, else the probabilities (both branches read outer-scope values, as the
    branches of exported VADs do). Written into the graph because torch 2.13's TorchScript
    exporter turns scripted control flow into a constant, and its torch.export-based exporter
    needs ``onnxscript``."""
    model = onnx.load_from_string(data)
    g = model.graph
    audio, probs = g.input[0].name, g.output[0].name
    for node in g.node:
        node.output[:] = ["probs" if o == probs else o for o in node.output]
    thr = helper.make_tensor("gate_threshold", TensorProto.FLOAT, [], [threshold])
    g.initializer.append(thr)
    then_b = helper.make_graph(
        [helper.make_node("Shape", ["probs"], ["gate_shape"]),
         helper.make_node("ConstantOfShape", ["gate_shape"], ["silence"],
                          value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))],
        "silent", [], [helper.make_tensor_value_info("silence", TensorProto.FLOAT, None)])
    else_b = helper.make_graph(
        [helper.make_node("Identity", ["probs"], ["speech"])], "speech", [],
        [helper.make_tensor_value_info("speech", TensorProto.FLOAT, None)])
    g.node.extend([
        helper.make_node("Mul", [audio, audio], ["gate_sq"]),
        helper.make_node("ReduceMean", ["gate_sq"], ["gate_energy"], keepdims=0),
        helper.make_node("Less", ["gate_energy", "gate_threshold"], ["gate_silent"]),
        helper.make_node("If", ["gate_silent"], [probs], then_branch=then_b,
                         else_branch=else_b)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def squeezenet(classes: int = 10) -> Any:
    """SqueezeNet 1.1: fire modules (1x1 squeeze, concatenated 1x1 and 3x3 expands)."""
    torch = __import__("torch")
    nn = torch.nn

    class Fire(nn.Module):
        def __init__(self, cin: int, s: int, e: int) -> None:
            super().__init__()
            self.squeeze = nn.Conv2d(cin, s, 1)
            self.e1 = nn.Conv2d(s, e, 1)
            self.e3 = nn.Conv2d(s, e, 3, padding=1)

        def forward(self, x: Any) -> Any:
            x = torch.relu(self.squeeze(x))
            return torch.cat([torch.relu(self.e1(x)), torch.relu(self.e3(x))], 1)

    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(64, 16, 64), Fire(128, 16, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(128, 32, 128), Fire(256, 32, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(256, 48, 192), Fire(384, 64, 256), nn.Conv2d(512, classes, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten())


def shufflenet_v2(widths: tuple[int, ...] = (24, 48, 96, 192), classes: int = 10) -> Any:
    """ShuffleNetV2 (x0.5): channel split, branch of 1x1 -> 3x3 depthwise -> 1x1, concat,
    channel shuffle (reshape-transpose-reshape)."""
    torch = __import__("torch")
    nn = torch.nn

    def shuffle(x: Any) -> Any:
        n, c, h, w = x.shape
        return x.reshape(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)

    class Unit(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.stride = stride
            half = cout // 2
            bin_ = cin if stride > 1 else half
            self.branch = nn.Sequential(conv_bn(bin_, half, 1), conv_bn(half, half, 3, stride,
                                                                        groups=half, act=None),
                                        conv_bn(half, half, 1))
            self.proj = (nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None),
                                       conv_bn(cin, half, 1)) if stride > 1 else None)

        def forward(self, x: Any) -> Any:
            if self.stride == 1:
                a, b = x.chunk(2, 1)
                return shuffle(torch.cat([a, self.branch(b)], 1))
            return shuffle(torch.cat([self.proj(x), self.branch(x)], 1))

    layers = [conv_bn(3, widths[0], 3, 2), nn.MaxPool2d(3, 2, 1)]
    cin = widths[0]
    for cout in widths[1:]:
        layers += [Unit(cin, cout, 2), Unit(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, conv_bn(cin, 256, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(256, classes))


def densenet(growth: int = 12, blocks: tuple[int, ...] = (3, 3, 3), classes: int = 10) -> Any:
    """DenseNet-BC: dense blocks (BN-ReLU-1x1-BN-ReLU-3x3, each layer's output concatenated
    to its input), transitions of 1x1 conv and 2x2 average pooling."""
    torch = __import__("torch")
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self, cin: int) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(),
                                      nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                      nn.BatchNorm2d(4 * growth), nn.ReLU(),
                                      nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

        def forward(self, x: Any) -> Any:
            return torch.cat([x, self.body(x)], 1)

    cin = 2 * growth
    layers: list[Any] = [nn.Conv2d(3, cin, 3, padding=1, bias=False)]
    for i, n in enumerate(blocks):
        for _ in range(n):
            layers.append(Layer(cin))
            cin += growth
        if i < len(blocks) - 1:
            layers += [nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cin // 2, 1, bias=False),
                       nn.AvgPool2d(2)]
            cin //= 2
    return nn.Sequential(*layers, nn.BatchNorm2d(cin), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(cin, classes))


def vgg(widths: tuple[int, ...] = (16, 32, 64, 64), classes: int = 10) -> Any:
    """VGG-style: 3x3 conv-BN-ReLU pairs and max pooling, a two-layer classifier."""
    nn = _nn()
    layers, cin = [], 3
    for w in widths:
        layers += [conv_bn(cin, w), conv_bn(w, w), nn.MaxPool2d(2)]
        cin = w
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(cin * 4 * 4, 128), nn.ReLU(),
                         nn.Dropout(0.5), nn.Linear(128, classes))


ARCHS = {"resnet18": torch_models.resnet18, "mobilenet_v2": torch_models.mobilenet_v2,
         "mobilenet_v3": mobilenet_v3, "efficientnet": efficientnet, "convnext": convnext,
         "unet": unet, "dbnet": dbnet, "crnn": crnn, "tagger": tagger, "tc_resnet": tc_resnet,
         "stft_vad": stft_vad, "squeezenet": squeezenet, "shufflenet_v2": shufflenet_v2,
         "densenet": densenet, "vgg": vgg}


def build(config: Mapping[str, Any]) -> Any:
    """The module of ``config``: ``ARCHS[config["arch"]](**other keys)``."""
    kwargs = {k: v for k, v in config.items() if k != "arch"}
    return ARCHS[config["arch"]](**kwargs).eval()


def torch_model(name: str, family: str, config: Mapping[str, Any],
                inputs: tuple[InputSpec, ...], ci: bool = False,
                edit: Callable[[bytes], bytes] | None = None) -> ZooModel:
    return register(ZooModel(name, family, "torch", build, dict(config), inputs, ci=ci,
                             edit=edit))


IMAGE = (InputSpec("input", (1, 3, 64, 64)),)
torch_model("resnet18", "vision", {"arch": "resnet18", "num_classes": 10}, IMAGE, ci=True)
torch_model("mobilenet-v2", "vision", {"arch": "mobilenet_v2", "num_classes": 10}, IMAGE)
torch_model("mobilenet-v3", "vision", {"arch": "mobilenet_v3"}, IMAGE, ci=True)
torch_model("efficientnet", "vision", {"arch": "efficientnet"}, IMAGE, ci=True)
torch_model("convnext", "vision", {"arch": "convnext"}, IMAGE, ci=True)
torch_model("unet", "vision", {"arch": "unet"}, IMAGE, ci=True)
torch_model("dbnet", "vision", {"arch": "dbnet"}, IMAGE, ci=True)
torch_model("squeezenet", "vision", {"arch": "squeezenet"}, IMAGE)
torch_model("shufflenet-v2", "vision", {"arch": "shufflenet_v2"}, IMAGE)
torch_model("densenet", "vision", {"arch": "densenet"}, (InputSpec("input", (1, 3, 32, 32)),))
torch_model("vgg", "vision", {"arch": "vgg"}, IMAGE)
torch_model("crnn", "audio", {"arch": "crnn"}, (InputSpec("input", (1, 1, 32, 64)),), ci=True)
torch_model("lstm-tagger", "audio", {"arch": "tagger", "cell": "lstm"},
            (InputSpec("ids", (2, 12), "ids", 1000),), ci=True)
torch_model("gru-tagger", "audio", {"arch": "tagger", "cell": "gru"},
            (InputSpec("ids", (2, 12), "ids", 1000),), ci=True)
torch_model("tc-resnet", "audio", {"arch": "tc_resnet"}, (InputSpec("input", (1, 40, 98)),))
torch_model("stft-vad", "audio", {"arch": "stft_vad"}, (InputSpec("audio", (1, 2048)),), ci=True,
            edit=add_silence_gate)
