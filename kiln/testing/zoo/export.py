"""Exporting zoo models to ONNX, deterministically, once: the files are cached on disk.

``<cache>/zoo/<name>-<key>.onnx`` holds the model and ``<name>-<key>.npz`` its example inputs,
where ``<cache>`` is kiln's cache directory (:func:`kiln.runtime.cache.cache_dir`) and ``key``
hashes the entry's configuration and inputs, the source of its builder, the torch and
transformers versions and :data:`FORMAT` (bumped when the way of exporting changes). A rerun
(CI's second run, the benchmark after the tests) reads the files instead of exporting again.

The exporter is torch's TorchScript-based one (``dynamo=False``): it works offline without the
``onnxscript`` package and, with the weights seeded, writes the same bytes every time. Some of its
translations are replaced while a zoo model exports (:func:`exact_symbolics`), because torch's
own fail or are wrong on what the zoo's architectures do: ``repeat_interleave`` (rotary
embeddings of Cohere, GLM, Helium: torch's symbolic trips its own shape inference),
``index_add`` (mixture-of-experts combining, JetMoE: torch's symbolic scatters, which drops all
but one of the rows added at a repeated index, and refuses such indices) and, from opset 18,
``col2im`` (``fold`` of MobileViTV2, whose output size is a traced list torch's cannot read).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ...runtime.cache import cache_dir
from .catalogue import OPSET, ZooModel

#: Version of the export recipe; part of every key.
FORMAT = 2


def _versions() -> dict[str, str]:
    import torch

    try:
        import transformers

        tf = transformers.__version__
    except ImportError:  # torch-written models need no transformers
        tf = "none"
    return {"torch": torch.__version__, "transformers": tf}


def cache_key(model: ZooModel) -> str:
    """Hash of everything that decides ``model``'s exported file (see the module docstring)."""
    spec = {"name": model.name, "config": model.config, "format": FORMAT, "opset": model.opset,
            "inputs": [(s.name, s.shape, s.kind, s.high) for s in model.inputs],
            "builder": inspect.getsource(model.build),
            "edit": inspect.getsource(model.edit) if model.edit else None, **_versions()}
    text = json.dumps(spec, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def zoo_dir() -> Path:
    """Where exported zoo models live."""
    return cache_dir() / "zoo"


def randomize_norms(module: Any) -> None:
    """Random BatchNorm running statistics and affine parameters (a fresh module has mean 0,
    variance 1, which would leave their folding untested)."""
    import torch

    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            with torch.no_grad():
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)


def _const(g: Any, values: list[int]) -> Any:
    import torch

    return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))


def _static_sizes(value: Any) -> list[int] | None:
    sizes = value.type().sizes() if value.type().kind() == "TensorType" else None
    return None if sizes is None or any(d is None for d in sizes) else list(sizes)


def _repeat_interleave(g: Any, self: Any, repeats: Any, dim: Any = None,
                       output_size: Any = None) -> Any:
    """``repeat_interleave`` by a constant count along one axis of a statically shaped tensor:
    Unsqueeze after the axis, Expand the new axis to the count, Reshape it into the axis.
    Other cases go to torch's own translation."""
    from torch.onnx import symbolic_helper as sh
    from torch.onnx._internal.torchscript_exporter import symbolic_opset13

    count = sh._maybe_get_const(repeats, "i")
    axis = sh._maybe_get_const(dim, "i") if not sh._is_none(dim) else None
    sizes = _static_sizes(self)
    if not isinstance(count, int) or not isinstance(axis, int) or sizes is None:
        return symbolic_opset13.repeat_interleave(g, self, repeats, dim, output_size)
    axis %= len(sizes)
    wide = g.op("Unsqueeze", self, _const(g, [axis + 1]))
    wide = g.op("Expand", wide, _const(g, sizes[:axis + 1] + [count] + sizes[axis + 1:]))
    return g.op("Reshape", wide,
                _const(g, sizes[:axis] + [sizes[axis] * count] + sizes[axis + 1:]))


def _index_add(g: Any, self: Any, dim: Any, index: Any, source: Any, alpha: Any = None) -> Any:
    """``index_add``: ScatterND with ``reduction="add"`` (opset 16), so that rows added at the
    same index accumulate; the axis is moved to the front and back by Transposes."""
    from torch.onnx import symbolic_helper as sh

    axis = sh._maybe_get_const(dim, "i")
    rank = sh._get_tensor_rank(self)
    if not isinstance(axis, int) or rank is None or sh._get_tensor_rank(source) != rank:
        raise sh.errors.SymbolicValueError(
            "zoo export: index_add needs a constant axis and equal known ranks", self)
    axis %= rank
    if alpha is not None and not sh._is_none(alpha) and sh._maybe_get_const(alpha, "f") != 1:
        source = g.op("Mul", source, alpha)
    perm = [axis] + [d for d in range(rank) if d != axis]
    if axis:
        self = g.op("Transpose", self, perm_i=perm)
        source = g.op("Transpose", source, perm_i=perm)
    indices = g.op("Unsqueeze", index, _const(g, [1]))
    out = g.op("ScatterND", self, indices, source, reduction_s="add")
    if axis:
        out = g.op("Transpose", out, perm_i=[perm.index(d) for d in range(rank)])
    return out


def _int_vector(g: Any, value: Any) -> Any:
    """A list of ints as a 1-D int64 tensor (a traced list of sizes is a ListConstruct of
    scalars, which torch's Col2Im translation cannot read)."""
    node = value.node()
    if node.kind() != "prim::ListConstruct":
        return value
    parts = [g.op("Reshape", item, _const(g, [1])) for item in node.inputs()]
    return g.op("Concat", *parts, axis_i=0)


def _col2im(g: Any, self: Any, output_size: Any, kernel_size: Any, dilation: Any,
            padding: Any, stride: Any) -> Any:
    """``torch.nn.functional.fold``: ONNX Col2Im (opset 18) with the output and kernel sizes
    as tensors, also where the output size is a traced list of sizes (MobileViTV2)."""
    from torch.onnx import symbolic_helper as sh

    pads = [p for p in sh._maybe_get_const(padding, "is") for _ in range(2)]
    return g.op("Col2Im", self, _int_vector(g, output_size), _int_vector(g, kernel_size),
                dilations_i=sh._maybe_get_const(dilation, "is"), pads_i=pads,
                strides_i=sh._maybe_get_const(stride, "is"))


#: (aten op, symbolic, first opset of the ONNX operators it writes) of :func:`exact_symbolics`.
SYMBOLICS = (("aten::repeat_interleave", _repeat_interleave, 13),
             ("aten::index_add", _index_add, 16), ("aten::col2im", _col2im, 18))


@contextmanager
def exact_symbolics(opset: int = OPSET) -> Iterator[None]:
    """Torch's ONNX translations of :data:`SYMBOLICS` at ``opset`` replaced for the duration
    (see the module docstring), restored afterwards so that other exports in the process are
    as torch makes them."""
    import torch

    names = [name for name, _, first in SYMBOLICS if opset >= first]
    for name, fn, first in SYMBOLICS:
        if opset >= first:
            torch.onnx.register_custom_op_symbolic(name, fn, opset)
    try:
        yield
    finally:
        for name in names:
            torch.onnx.unregister_custom_op_symbolic(name, opset)


def export_bytes(model: ZooModel, inputs: dict[str, np.ndarray], seed: int = 0) -> bytes:
    """Build ``model`` with weights from ``seed`` and export it to ONNX bytes."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.manual_seed(seed)
    module = model.build(model.config)
    randomize_norms(module)
    module.eval()
    args = tuple(torch.from_numpy(inputs[s.name]) for s in model.inputs)
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings(), exact_symbolics(model.opset):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=[s.name for s in model.inputs],
                          output_names=["output"], opset_version=model.opset, dynamo=False)
    return model.edit(buf.getvalue()) if model.edit else buf.getvalue()


def exported(model: ZooModel) -> tuple[Path, dict[str, np.ndarray]]:
    """(path of ``model``'s ONNX file, its example inputs), exporting on a cache miss."""
    base = zoo_dir() / f"{model.name}-{cache_key(model)}"
    path, npz = base.with_suffix(".onnx"), base.with_suffix(".npz")
    if path.exists() and npz.exists():
        with np.load(npz) as data:
            return path, {s.name: data[s.name] for s in model.inputs}
    inputs = model.example_inputs()
    data = export_bytes(model, inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    # write-then-rename: concurrent runs (pytest -n 2) never read a half-written file
    tmp = base.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **inputs)
    os.replace(tmp, npz)
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path, inputs
