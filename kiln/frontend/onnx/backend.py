"""An ``onnx.backend`` implementation, so ONNX's own conformance tests can run kiln.

``prepare`` imports and compiles the model once. Shape-determining inputs that are graph inputs
(Reshape's shape, Expand's shape, Slice's starts, ...) are ordinary run-time inputs: their
values are read by host shape functions while the model runs (``kiln.runtime.shape_funcs``),
so one compiled model serves every value; nothing is specialized to the first run, except
where an ``If``'s branches differ in rank (``specialize``: one continuation per condition
value, compiled on first use).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from onnx.backend.base import Backend, BackendRep

from ...ir import KilnError
from .importer import load_model, onnx_dtype
from .specialize import compile_onnx


def _array(value: Any) -> Any:
    """Test data may hold TensorProtos (for dtypes numpy lacks); make them arrays."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _feed(value: Any) -> Any:
    """An input value: arrays as arrays, a sequence (list) as a list of arrays, None (an
    empty optional) as None."""
    if value is None:
        return None
    if isinstance(value, list):
        return [np.asarray(_array(v)) for v in value]
    return np.asarray(_array(value))


class KilnBackendRep(BackendRep):
    """A prepared model: imported and compiled once by ``prepare``."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__()
        self.model = model
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        # an Executable, or a GuardedExecutable where an If's branches differ in rank
        self.exe: Any = compile_onnx(model)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """The outputs in model order: arrays, lists of arrays for sequences, None for an
        empty optional (what onnxruntime returns)."""
        if isinstance(inputs, dict):
            feeds = {k: _feed(v) for k, v in inputs.items()}
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = {n: _feed(v) for n, v in zip(self.input_names, inputs)}
        for vi in self.model.graph.input:
            if vi.name not in feeds and vi.type.HasField("optional_type"):
                feeds[vi.name] = None  # an optional input the test data leave out: empty
            # object arrays (e.g. parsed from text) take the dtype the model declares
            value = feeds.get(vi.name)
            if (isinstance(value, np.ndarray) and value.dtype == object
                    and vi.type.HasField("tensor_type")
                    and vi.type.tensor_type.elem_type != onnx.TensorProto.STRING):
                elem = vi.type.tensor_type.elem_type
                feeds[vi.name] = value.astype(onnx_dtype(elem, vi.name))
        out = self.exe(**feeds)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o if o is None or isinstance(o, list) else np.asarray(o) for o in outs)


class KilnBackend(Backend):
    """kiln as an ONNX backend (CPU only)."""

    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> KilnBackendRep:
        if not cls.supports_device(device):
            raise KilnError(f"kiln's ONNX backend runs on CPU, not {device!r}")
        return KilnBackendRep(load_model(model))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Any = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        raise KilnError("kiln's ONNX backend runs whole models; use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")


backend = KilnBackend
prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
supports_device = KilnBackend.supports_device
