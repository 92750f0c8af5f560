"""The ``torch.compile`` backend: ``torch.compile(model, backend="kiln")``.

Dynamo captures the model's graphs (graph breaks run in Python between them) and hands each
to :func:`kiln_backend`, which exports it with ``torch.export`` (functionalized, core ATen
decompositions), imports it with ``from_exported_program`` and builds one kiln executable.

- Parameters and buffers (the graph inputs that are ``nn.Parameter``s or a module's buffers)
  become constants of the executable, as ``torch.export`` + ``kiln.build(params=...)`` would
  make them: weights are packed and folded at compile time. Pass
  ``options={"freeze_params": False}`` to keep them run-time inputs (for weights updated in
  place after compiling).
- Dynamic shapes: when Dynamo marks a dimension dynamic (after a second size is seen, or with
  ``dynamic=True``), the graph is exported with that dimension symbolic and kiln compiles one
  executable for every size: recompilation stops there. Size arguments Dynamo passes as
  SymInt inputs are read from the tensors' shapes at run time.
- Inputs and outputs are torch CPU tensors passed through DLPack (``kiln.frontend.torch.
  tensors``): no copies.

The backend is registered under the name ``"kiln"`` by ``import kiln`` when torch is already
imported, and through the ``torch_dynamo_backends`` entry point of kiln's package metadata
otherwise (torch looks it up by name without importing kiln first).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any

from ...build import build
from ...ir.errors import KilnError
from .importer import from_graph_module
from .tensors import to_kiln, to_torch


def _is_state(node: Any, value: Any) -> bool:
    """Whether a Dynamo graph input is a parameter or a buffer of a module."""
    import torch

    if isinstance(value, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    name = source.name if isinstance(getattr(source, "name", None), str) else (
        source.name() if source is not None else "")
    return "_buffers[" in name or "_parameters[" in name


class KilnCompiledGraph:
    """One ATen graph compiled by kiln: called with the graph's inputs (a list, AOT
    Autograd's boxed convention), returns its outputs as torch tensors."""

    _boxed_call = True

    def __init__(self, gm: Any, constants: dict[int, Any]):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        #: positions of the run-time tensor inputs (frozen state and sizes are not passed)
        self.runtime = [i for i, n in enumerate(placeholders)
                        if i not in constants and _is_tensor(n.meta.get("val"))]
        self.exe = build(from_graph_module(gm, constants))

    def __call__(self, args: list[Any]) -> Any:
        inputs = [to_kiln(args[i], f"input {i}") for i in self.runtime]
        args.clear()  # the boxed convention: the callee frees its inputs
        return list(to_torch(self.exe(*inputs)))


def _is_tensor(val: Any) -> bool:
    import torch

    return isinstance(val, torch.Tensor)


def kiln_backend(gm: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
    """``torch.compile`` backend entry: compile Dynamo graph ``gm`` with kiln.

    AOT Autograd traces it to functional core ATen (PyTorch's own decompositions) and hands
    the forward graph to kiln. ``options={"freeze_params": False}`` (``torch.compile(...,
    options=...)``) keeps parameters and buffers as run-time inputs.
    """
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    options = dict(kwargs.get("options") or {})
    freeze = bool(options.pop("freeze_params", True))
    if options:
        raise KilnError(f"kiln backend: unknown options {sorted(options)}")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = {i: v for i, (n, v) in enumerate(zip(placeholders, example_inputs))
                 if freeze and _is_tensor(v) and _is_state(n, v)}

    def forward_compiler(fw: Any, fw_inputs: list[Any]) -> Any:
        n_in = len([n for n in fw.graph.nodes if n.op == "placeholder"])
        if n_in != len(example_inputs):
            raise KilnError(f"kiln backend: the traced graph takes {n_in} inputs, Dynamo's "
                            f"{len(example_inputs)} (input mutations are not supported)")
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # AOT compiles under a fake mode; weights are real
            return KilnCompiledGraph(fw, constants)

    return aot_autograd(fw_compiler=forward_compiler,
                        decompositions=core_aten_decompositions())(gm, example_inputs)


#: The module of torch's backend registry, which a hook registers kiln into once imported.
REGISTRY_MODULE = "torch._dynamo.backends.registry"


def register() -> None:
    """Register ``"kiln"`` with torch.compile (idempotent; imports torch's backend registry)."""
    _register_into(importlib.import_module(REGISTRY_MODULE))


def _register_into(registry: Any) -> None:
    # torch registers a backend it found through the entry point itself when it is first
    # looked up (loading the entry point imports kiln, which must not register it first:
    # torch then refuses the duplicate); torch keeps those names in its ``_BACKENDS`` table
    if "kiln" in getattr(registry, "_BACKENDS", {}):
        return
    registry.register_backend(kiln_backend, name="kiln")


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers kiln into torch's backend registry right after that module is imported, so
    ``import kiln`` neither imports torch nor misses a torch imported later."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != REGISTRY_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _register_into(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def register_on_torch_import() -> None:
    """What ``import kiln`` runs: register now when torch's registry is loaded, else when it
    is (a finder on ``sys.meta_path`` that only looks at that one module name)."""
    if REGISTRY_MODULE in sys.modules:
        _register_into(sys.modules[REGISTRY_MODULE])
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
