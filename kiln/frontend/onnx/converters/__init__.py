"""ONNX converters by op family; importing this package registers them all."""

from . import elementwise, nn, reduce, shape  # noqa: F401
