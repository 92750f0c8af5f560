"""ONNX converters by op family; importing this package registers them all."""

from . import (  # noqa: F401
    attention,
    control_flow,
    detection,
    dynamic,
    elementwise,
    host,
    image,
    index,
    loss,
    ml,
    nn,
    quantize,
    random,
    reduce,
    rnn,
    sequence,
    shape,
    signal,
    strings,
)
