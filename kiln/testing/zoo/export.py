"""Exporting zoo models to ONNX, deterministically, once: the files are cached on disk.

``<cache>/zoo/<name>-<key>.onnx`` holds the model and ``<name>-<key>.npz`` its example inputs,
where ``<cache>`` is kiln's cache directory (:func:`kiln.runtime.cache.cache_dir`) and ``key``
hashes the entry's configuration and inputs, the source of its builder, the torch and
transformers versions and :data:`FORMAT` (bumped when the way of exporting changes). A rerun
(CI's second run, the benchmark after the tests) reads the files instead of exporting again.

The exporter is torch's TorchScript-based one (``dynamo=False``): it works offline without the
``onnxscript`` package and, with the weights seeded, writes the same bytes every time.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ...runtime.cache import cache_dir
from .catalogue import ZooModel

#: Version of the export recipe; part of every key.
FORMAT = 1
OPSET = 17


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
    spec = {"name": model.name, "config": model.config, "format": FORMAT, "opset": OPSET,
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
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=[s.name for s in model.inputs],
                          output_names=["output"], opset_version=OPSET, dynamo=False)
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
