"""Guarded specialization: compiling an ONNX model whose ``If`` branches differ in rank.

kiln gives every value one rank and dtype, so an ``If`` on a run-time condition whose
branches return, say, a scalar in one and a 1-element vector in the other (AffineGrid's
function body does) cannot be imported as one function. ``compile_onnx`` compiles such a
model the way torch.compile handles a graph break on a data-dependent branch:

* the import stops at that ``If`` (``importer.BranchGuard``): what comes before it becomes
  the *prefix*, a function returning the condition and every run-time value the rest of the
  model reads (the *live* values);
* calling the model runs the prefix, reads the condition and runs the *continuation* for
  that value: the rest of the model imported with the condition pinned (only the taken
  branch, so what follows gets that branch's ranks), the live values as its inputs;
* each continuation is compiled on first use and cached by the condition's value (the
  guard), so each specialization compiles once; a continuation that meets another such
  ``If`` is guarded the same way in turn.

The result is a :class:`GuardedExecutable`, called like an :class:`~kiln.runtime.executable.
Executable`. The import may stop only where it can resume: at an ``If`` in the model's graph
or inside the branches of ``If`` nodes whose condition the import knows; one inside a loop
body or a run-time branch (compiled as a function of its own) still gets the KilnError.
Setting the PassContext option ``frontend.onnx.specialize_if`` to False turns specialization
off: the model then gets the same KilnError as ``from_onnx``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...build import build
from ...runtime.executable import Executable, run_session_style
from ...transform.pass_infra import PassContext, register_config
from .importer import Resume, import_model, load_model
from .subgraph import capture_sinfo

__all__ = ["SPECIALIZE_KEY", "GuardedExecutable", "compile_onnx"]

SPECIALIZE_KEY = "frontend.onnx.specialize_if"
register_config(
    SPECIALIZE_KEY, bool, True,
    "compile_onnx specializes the model on the condition of an If whose branches differ in "
    "rank or dtype (compiled per condition value on first use); False: a KilnError names it.",
)


def compile_onnx(model: Any, target: Any = "c",
                 shape_dict: Mapping[str, Sequence[Any]] | None = None,
                 dtype_dict: Mapping[str, Any] | None = None, opset: int | None = None,
                 freeze_inputs: Mapping[str, np.ndarray] | None = None,
                 base_dir: str | None = None, **build_kwargs: Any
                 ) -> Executable | GuardedExecutable:
    """Import ONNX ``model`` (as :func:`~kiln.frontend.onnx.from_onnx` does) and build it for
    ``target`` with its weights bound (``build_kwargs`` go to :func:`kiln.build`).

    A model that needs guarded specialization (see the module) gives a
    :class:`GuardedExecutable`, any other an ``Executable``; both are called alike. The
    PassContext active here decides ``frontend.onnx.specialize_if`` and is the one each
    continuation is built under, also when it is compiled later, on first use.
    """
    if base_dir is None and isinstance(model, str):
        base_dir = os.path.dirname(os.path.abspath(model))
    proto = load_model(model)
    pass_ctx = PassContext.current()
    specialize = bool(pass_ctx.get_config(SPECIALIZE_KEY))
    options = dict(shape_dict=shape_dict, dtype_dict=dtype_dict, opset=opset,
                   freeze_inputs=freeze_inputs, base_dir=base_dir)
    return _compile(proto, options, pass_ctx, target, build_kwargs, specialize, None)


def _compile(proto: Any, options: dict[str, Any], pass_ctx: PassContext, target: Any,
             build_kwargs: dict[str, Any], specialize: bool, resume: Resume | None) -> Any:
    """Import (the whole model, or a continuation for ``resume``) and build under
    ``pass_ctx``'s settings; a guarded executable when the import stopped at an If."""
    if PassContext.current() is pass_ctx:
        mod, params, guard = import_model(proto, **options, specialize=specialize,
                                          resume=resume)
        exe = build(mod, target, params=params, **build_kwargs)
    else:  # a continuation compiled on first use: under a copy of the compile's context
        with PassContext(pass_ctx.opt_level, pass_ctx.required_pass, pass_ctx.disabled_pass,
                         pass_ctx.config, pass_ctx.instruments):
            return _compile(proto, options, PassContext.current(), target, build_kwargs,
                            specialize, resume)
    if guard is None:
        return exe
    live = [(name, capture_sinfo(expr.struct_info)) for name, expr in guard.live]
    pinned = dict(resume.pinned) if resume is not None else {}

    def continuation(taken: bool) -> Any:
        point = Resume(guard.path, live, guard.consts, guard.shape_dims,
                       {**pinned, guard.path: taken})
        return _compile(proto, options, pass_ctx, target, build_kwargs, specialize, point)

    return GuardedExecutable(exe, continuation, guard.node,
                             [vo.name for vo in proto.graph.output])


class GuardedExecutable:
    """A model compiled by guarded specialization (:func:`compile_onnx`): calling it runs
    the prefix up to the guarded ``If``, then the continuation compiled for the condition's
    value (on its first use; :attr:`specializations` holds those compiled so far). It is
    called as an ``Executable`` (``exe(x)``, ``exe(**feeds)``, :meth:`run`); saving, profiling
    and the per-function views stay with the executables it holds (``prefix``,
    ``specializations``)."""

    def __init__(self, prefix: Executable, compile_continuation: Any, guard: str,
                 output_names: Sequence[str]):
        self.prefix = prefix
        #: The model's output names (every continuation computes them).
        self.output_names = tuple(output_names)
        #: The If the guard is on (as messages name it).
        self.guard = guard
        #: Continuations compiled so far, by condition value.
        self.specializations: dict[bool, Any] = {}
        #: How often a continuation was compiled (one per condition value seen).
        self.compiles = 0
        self._compile = compile_continuation
        self._lock = threading.Lock()
        self._num_threads: int | None = None

    @property
    def inputs(self) -> list[Any]:
        """The model's inputs (the prefix takes them all), as ``Executable.inputs``."""
        return self.prefix.inputs

    def continuation(self, taken: bool) -> Any:
        """The rest of the model for condition value ``taken``, compiled on first use (once,
        also when several threads call the model)."""
        exe = self.specializations.get(taken)
        if exe is None:
            with self._lock:
                exe = self.specializations.get(taken)
                if exe is None:
                    exe = self._compile(taken)
                    exe.set_num_threads(self._num_threads)
                    self.specializations[taken] = exe
                    self.compiles += 1
        return exe

    def set_num_threads(self, n: int | None) -> None:
        """As :meth:`Executable.set_num_threads`, for the prefix and every continuation (also
        those compiled later)."""
        with self._lock:
            self.prefix.set_num_threads(n)
            for exe in self.specializations.values():
                exe.set_num_threads(n)
            self._num_threads = n

    def get_max_threads(self) -> int:
        """How many threads a call made now from this thread uses (the prefix's count)."""
        return self.prefix.get_max_threads()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.prefix(*args, **kwargs)
        cond, *live = out if isinstance(out, tuple) else (out,)
        return self.continuation(bool(np.asarray(cond)))(*live)

    def run(self, feeds: Mapping[str, Any] | Sequence[Any],
            output_names: Sequence[str] | None = None, as_dict: bool = False) -> Any:
        """As :meth:`Executable.run` (onnxruntime's ``session.run``): ``feeds`` by input
        name or in order; the outputs named ``output_names`` (all when None)."""
        return run_session_style(self, self.output_names, feeds, output_names, as_dict)
