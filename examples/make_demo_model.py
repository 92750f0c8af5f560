"""Write the bundled demo model, ``examples/models/demo_resnet.onnx``, from a fixed seed.

A small image classifier shaped like the networks users bring: a conv-BN-ReLU stem, three
residual blocks (conv-BN-ReLU, conv-BN, skip add, ReLU; the middle block downsamples with a
strided conv and a 1x1 projection), global average pooling, Flatten and Gemm. The batch
dimension is dynamic ("batch"), opset 17, random weights and batch-norm statistics. The file is
committed so the demo needs no generator; re-run this script to reproduce it byte for byte.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "demo_resnet.onnx")


def build(seed: int = 0, width: int = 32, classes: int = 10) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def weight(name: str, shape: tuple[int, ...], scale: float, offset: float = 0.0) -> str:
        arr = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def conv_bn(x: str, name: str, cin: int, cout: int, k: int, stride: int,
                relu: bool) -> str:
        w = weight(f"{name}.w", (cout, cin, k, k), (2.0 / (cin * k * k)) ** 0.5)
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}.conv"], name=f"{name}.conv",
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4))
        bn = [weight(f"{name}.gamma", (cout,), 0.1, 1.0), weight(f"{name}.beta", (cout,), 0.1),
              weight(f"{name}.mean", (cout,), 0.1), weight(f"{name}.var", (cout,), 0.05, 1.0)]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn],
                                      [f"{name}.bn"], name=f"{name}.bn", epsilon=1e-5))
        if not relu:
            return f"{name}.bn"
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"],
                                      name=f"{name}.relu"))
        return f"{name}.relu"

    h = conv_bn("image", "stem", 3, width, 3, 1, True)
    cin = width
    for i, (cout, stride) in enumerate(((width, 1), (2 * width, 2), (2 * width, 1))):
        y = conv_bn(h, f"block{i}.a", cin, cout, 3, stride, True)
        y = conv_bn(y, f"block{i}.b", cout, cout, 3, 1, False)
        skip = h if stride == 1 and cin == cout else conv_bn(h, f"block{i}.proj", cin, cout, 1,
                                                              stride, False)
        nodes.append(helper.make_node("Add", [y, skip], [f"block{i}.add"], name=f"block{i}.add"))
        nodes.append(helper.make_node("Relu", [f"block{i}.add"], [f"block{i}.out"],
                                      name=f"block{i}.out"))
        h, cin = f"block{i}.out", cout
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"))
    fc_w = weight("fc.w", (classes, cin), (1.0 / cin) ** 0.5)
    fc_b = weight("fc.b", (classes,), 0.1)
    nodes.append(helper.make_node("Gemm", ["flat", fc_w, fc_b], ["logits"], name="fc",
                                  transB=1))
    graph = helper.make_graph(
        nodes, "demo_resnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="kiln examples/make_demo_model.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    onnx.save(build(), OUT)
    print(f"wrote {OUT} ({os.path.getsize(OUT) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
