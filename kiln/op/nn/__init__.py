"""Neural-network operators, the ``kiln.op.nn`` namespace (registry names ``nn.<name>``).

One file per family, each a set of declarations a reader can finish:

- :mod:`.convolution`: ``conv2d`` (NCHW/OIHW by default, any ``data_layout``/``kernel_layout``
  permutation such as NHWC/HWIO, groups, depthwise), the channel-blocked ``conv2d_nchwc`` and
  ``depthwise_conv2d_nchwc`` (NCHW[x]c data: what ``conv2d`` becomes on CPUs through the
  AlterOpLayout pass), and the adjoints ``conv2d_backward_data`` / ``conv2d_backward_weight``;
- :mod:`.pooling`: max/average pooling and their adaptive (global) forms in any layout with
  unsplit H and W, and their adjoints;
- :mod:`.softmax`: ``softmax``, ``log_softmax``; :mod:`.normalization`: ``layer_norm``,
  ``batch_norm`` (inference form); :mod:`.dropout`: ``dropout`` (inference form);
- :mod:`.window`: the attribute normalization and window arithmetic convolution and pooling
  share (padding as one int, ``(vertical, horizontal)`` or ``(top, left, bottom, right)``).

Fusion patterns follow TVM: convolution and pooling are OUT_EWISE_FUSABLE (element-wise
consumers such as bias-add and relu fuse into their output loop); softmax, log_softmax and
layer_norm are OPAQUE; batch_norm in inference form is BROADCAST. The namespace also re-exports
the activations declared with the element-wise ops (``nn.relu``, ``nn.gelu``...).
"""

from ..elementwise import gelu, relu, sigmoid, silu, tanh  # noqa: F401  (kiln.op.nn.relu ...)
from .convolution import (  # noqa: F401 - and the attrs classes (kiln.op.nn.Conv2DAttrs ...)
    Conv2DAttrs,
    Conv2DNCHWcAttrs,
    DepthwiseConv2DNCHWcAttrs,
    conv2d,
    conv2d_backward_data,
    conv2d_backward_weight,
    conv2d_nchwc,
    depthwise_conv2d_nchwc,
)
from .dropout import DropoutAttrs, dropout  # noqa: F401
from .normalization import BatchNormAttrs, LayerNormAttrs, batch_norm, layer_norm  # noqa: F401
from .pooling import (  # noqa: F401
    AdaptivePool2DAttrs,
    AvgPool2DAttrs,
    MaxPool2DAttrs,
    adaptive_avg_pool2d,
    adaptive_avg_pool2d_backward,
    adaptive_max_pool2d,
    adaptive_max_pool2d_backward,
    avg_pool2d,
    avg_pool2d_backward,
    global_avg_pool2d,
    global_max_pool2d,
    max_pool2d,
    max_pool2d_backward,
)
from .softmax import SoftmaxAttrs, log_softmax, softmax  # noqa: F401

__all__ = [
    "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward", "adaptive_max_pool2d",
    "adaptive_max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward", "batch_norm", "conv2d",
    "conv2d_backward_data", "conv2d_backward_weight", "conv2d_nchwc", "depthwise_conv2d_nchwc",
    "dropout", "global_avg_pool2d", "global_max_pool2d", "layer_norm", "log_softmax",
    "max_pool2d", "max_pool2d_backward", "softmax",
]
