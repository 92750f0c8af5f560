"""The zoo's entries: what a model is (a builder and its configuration) and what it is fed.

A :class:`ZooModel` is plain data: ``config`` says everything that decides the exported file
(sizes, classes, options), ``build(config)`` makes the torch module in eval mode with random
weights (seeded by the exporter), and ``inputs`` describes the example inputs, generated from a
fixed seed. The export cache keys on all three (see :mod:`kiln.testing.zoo.export`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Families of the catalogue, as ``--family`` of ``benchmarks/zoo.py`` selects them.
FAMILIES = ("encoder", "decoder", "encoder-decoder", "moe", "vision", "speech", "audio")
#: ONNX opset of an export unless the entry names another (:attr:`ZooModel.opset`).
OPSET = 17


@dataclass(frozen=True)
class InputSpec:
    """One example input: ``kind`` is ``"normal"`` (standard normal float32), ``"ids"``
    (int64 token ids below ``high``), ``"mask"`` (int64 attention mask of ones with the last
    quarter of each row zero, a padded tail) or ``"ones"`` (an int64 mask without padding)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "normal"
    high: int = 0

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "normal":
            return rng.standard_normal(self.shape, dtype=np.float32)
        if self.kind == "ids":
            return rng.integers(0, self.high, size=self.shape, dtype=np.int64)
        if self.kind in ("mask", "ones"):
            mask = np.ones(self.shape, dtype=np.int64)
            if self.kind == "mask":
                mask[..., self.shape[-1] * 3 // 4:] = 0
            return mask
        raise ValueError(f"unknown input kind {self.kind!r} of input {self.name!r}")


@dataclass(frozen=True)
class ZooModel:
    """One architecture of the zoo."""

    name: str
    family: str
    source: str  # "transformers" or "torch"
    build: Callable[[Mapping[str, Any]], Any]
    config: Mapping[str, Any]
    inputs: tuple[InputSpec, ...]
    #: fixed-subset membership: the CI test runs the models marked ``ci``
    ci: bool = False
    #: rewrites the exported ONNX bytes (what torch's exporter cannot write, e.g. an ``If``)
    edit: Callable[[bytes], bytes] | None = None
    #: ONNX opset of the export (:data:`OPSET` unless the architecture needs a later
    #: operator, such as Col2Im, opset 18, for ``torch.nn.functional.fold``)
    opset: int = OPSET

    def example_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """The model's inputs by name, the same for every call with the same ``seed``."""
        rng = np.random.default_rng(seed)
        return {s.name: s.make(rng) for s in self.inputs}


CATALOGUE: dict[str, ZooModel] = {}


def register(model: ZooModel) -> ZooModel:
    """Add ``model`` to :data:`CATALOGUE` (names are unique)."""
    if model.name in CATALOGUE:
        raise ValueError(f"zoo model {model.name!r} registered twice")
    if model.family not in FAMILIES:
        raise ValueError(f"zoo model {model.name!r}: unknown family {model.family!r}")
    CATALOGUE[model.name] = model
    return model
