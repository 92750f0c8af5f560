"""An ``onnx.backend`` implementation, so ONNX's own conformance tests can run kiln.

``prepare`` imports nothing yet: the model is imported and compiled on the first ``run``. When
a shape-determining input (Reshape's shape, ...) is a graph input, the import is retried with
that input frozen to the value of the first run -- the compiled model is then specialized to
it, and later runs with a different value of that input are rejected. When the non-constant
value is computed from graph inputs, every integer graph input is frozen (shape arguments).
Run-time shape functions (a later part of the frontend) will remove this restriction.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from onnx.backend.base import Backend, BackendRep

from ...ir import KilnError
from .importer import NonConstantInputError, from_onnx, load_model, onnx_dtype


def _array(value: Any) -> Any:
    """Test data may hold TensorProtos (for dtypes numpy lacks); make them arrays."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


class KilnBackendRep(BackendRep):
    """A prepared model; compiled lazily on the first ``run``."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__()
        self.model = model
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        self.frozen: dict[str, np.ndarray] = {}
        self.exe: Any = None

    def _compile(self, feeds: dict[str, np.ndarray]) -> None:
        import kiln

        while True:
            try:
                mod, params = from_onnx(self.model, freeze_inputs=self.frozen)
                break
            except NonConstantInputError as err:
                name = err.value_name
                if name in feeds and name not in self.frozen:
                    self.frozen[name] = np.asarray(feeds[name])
                    continue
                # computed from graph inputs: freeze the integer ones (shape arguments)
                ints = {n: v for n, v in feeds.items()
                        if v.dtype.kind in "iu" and n not in self.frozen}
                if not ints:
                    raise
                self.frozen.update(ints)
        self.exe = kiln.build(mod, params=params)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            inputs = {k: _array(v) for k, v in inputs.items()}
        elif isinstance(inputs, (list, tuple)):
            inputs = [_array(v) for v in inputs]
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = {n: np.asarray(v) for n, v in zip(self.input_names, inputs)}
        for vi in self.model.graph.input:
            # object arrays (e.g. parsed from text) take the dtype the model declares
            if vi.name in feeds and feeds[vi.name].dtype == object:
                elem = vi.type.tensor_type.elem_type
                feeds[vi.name] = feeds[vi.name].astype(onnx_dtype(elem, vi.name))
        if self.exe is None:
            self._compile(feeds)
        for name, value in self.frozen.items():
            if name in feeds and not np.array_equal(feeds[name], value):
                raise KilnError(f"input {name!r} determines a shape and was specialized to "
                                f"{value.tolist()} on the first run; got {feeds[name].tolist()}")
        args = {n: v for n, v in feeds.items() if n not in self.frozen}
        out = self.exe(**args)
        outs = out if isinstance(out, (list, tuple)) else (out,)
        return tuple(np.asarray(o) for o in outs)


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
