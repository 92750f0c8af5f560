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

import importlib.abc
import importlib.machinery
import sys
from typing import Any

from ...ir.errors import KilnError
from .tensors import to_kiln, to_torch


def _is_state(node: Any, value: Any) -> bool:
    """Whether a Dynamo graph input is a parameter or a buffer of a module."""
    import torch

    if isinstance(value, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    name = source.name() if source is not None else ""
    return "_buffers[" in name or "_parameters[" in name


class KilnCompiledGraph:
    """One Dynamo graph compiled by kiln: called with the graph's inputs, returns its outputs."""

    def __init__(self, gm: Any, example_inputs: list[Any], freeze_params: bool = True):
        import torch

        import kiln

        from .importer import from_exported_program

        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        metas = [n.meta.get("example_value") for n in placeholders]
        self.num_inputs = len(example_inputs)
        #: positions of the run-time tensor inputs, of frozen state, and of SymInt inputs
        self.runtime: list[int] = []
        state: dict[int, Any] = {}
        syms: dict[int, tuple[int, int]] = {}
        sym_source: dict[str, tuple[int, int]] = {}
        for i, (node, value, meta) in enumerate(zip(placeholders, example_inputs, metas)):
            if isinstance(value, torch.Tensor):
                if freeze_params and _is_state(node, value):
                    state[i] = value.detach()
                    continue
                self.runtime.append(i)
                for axis, d in enumerate(getattr(meta, "shape", ())):
                    if isinstance(d, torch.SymInt):
                        sym_source.setdefault(str(d.node.expr), (i, axis))
        for i, meta in enumerate(metas):
            if isinstance(meta, torch.SymInt) and i not in state:
                src = sym_source.get(str(meta.node.expr))
                if src is None:
                    raise KilnError(f"graph input {placeholders[i].name!r}: a size ({meta}) "
                                    "that no tensor input has; kiln cannot compile it")
                syms[i] = src
            elif not isinstance(example_inputs[i], torch.Tensor) and i not in syms:
                state[i] = example_inputs[i]
        self.syms = syms
        module = _GraphWrapper(gm, self.num_inputs, self.runtime, state, syms)
        args = tuple(example_inputs[i] for i in self.runtime)
        dynamic = []
        for i in self.runtime:
            shape = getattr(metas[i], "shape", ())
            dims = {axis: torch.export.Dim.DYNAMIC for axis, d in enumerate(shape)
                    if isinstance(d, torch.SymInt)}
            dynamic.append(dims or None)
        with torch.no_grad():
            ep = torch.export.export(module, args, dynamic_shapes=tuple(dynamic), strict=False)
        mod, params = from_exported_program(ep, bind_params=True)
        self.exe = kiln.build(mod, params=params)
        self.source = ep

    def __call__(self, *args: Any) -> Any:
        inputs = [to_kiln(args[i], f"input {i}") for i in self.runtime]
        out = self.exe(*inputs)
        return to_torch(out)


class _GraphWrapper:
    """A module whose inputs are the run-time tensors of a Dynamo graph: frozen state is held
    as parameters/buffers (so export lifts it as such) and SymInt inputs are computed from the
    tensors' shapes."""

    def __new__(cls, gm: Any, num_inputs: int, runtime: list[int], state: dict[int, Any],
                syms: dict[int, tuple[int, int]]) -> Any:
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.gm = gm
                self.consts: dict[int, Any] = {}
                for i, v in state.items():
                    if isinstance(v, torch.Tensor):
                        self.register_buffer(f"state_{i}", v, persistent=True)
                    else:
                        self.consts[i] = v

            def forward(self, *tensors: Any) -> Any:
                full: list[Any] = [None] * num_inputs
                for i, t in zip(runtime, tensors):
                    full[i] = t
                for i in state:
                    full[i] = self.consts[i] if i in self.consts else getattr(
                        self, f"state_{i}")
                for i, (j, axis) in syms.items():
                    full[i] = full[j].shape[axis]
                return self.gm(*full)

        return Wrapper()


def kiln_backend(gm: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
    """``torch.compile`` backend entry: compile Dynamo graph ``gm`` with kiln.

    ``options={"freeze_params": False}`` (``torch.compile(..., options=...)``) keeps
    parameters and buffers as run-time inputs.
    """
    options = dict(kwargs.get("options") or {})
    freeze = bool(options.pop("freeze_params", True))
    if options:
        raise KilnError(f"kiln backend: unknown options {sorted(options)}")
    return KilnCompiledGraph(gm, list(example_inputs), freeze_params=freeze)


#: The module of torch's backend registry, which a hook registers kiln into once imported.
REGISTRY_MODULE = "torch._dynamo.backends.registry"


def register() -> None:
    """Register ``"kiln"`` with torch.compile (idempotent; imports torch's backend registry)."""
    import importlib

    _register_into(importlib.import_module(REGISTRY_MODULE))


def _register_into(registry: Any) -> None:
    try:
        registry.register_backend(kiln_backend, name="kiln")
    except AssertionError:  # registered already (by the entry point or an earlier import)
        pass


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
