"""A zoo of real architectures, exported to ONNX with random weights and checked against
onnxruntime: ``transformers`` models built from their configurations (offline) and vision and
audio networks written in PyTorch. See :mod:`.catalogue` (entries), :mod:`.export` (the
cached, deterministic export) and :mod:`.runner` (import, compile, run, compare, time);
``benchmarks/zoo.py`` runs the whole zoo, ``tests/testing/test_testing_zoo.py`` its CI subset.
"""

from . import hf, vision
from .catalogue import CATALOGUE, FAMILIES, InputSpec, ZooModel
from .export import exported

__all__ = ["CATALOGUE", "FAMILIES", "InputSpec", "ZooModel", "exported", "hf", "vision"]
