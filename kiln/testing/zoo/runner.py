"""Running one zoo model through kiln and onnxruntime: import, compile, run, compare, time.

:func:`run_model` never raises for a model's failure: it returns a :class:`ZooResult` whose
``status`` is ``"pass"`` or the stage that failed (:data:`FAILURE_CLASSES`), with the error's
type and message and, where the message names one, the ONNX node. ``"reference"`` is
onnxruntime failing on the exported file (not kiln's fault), ``"target"`` a target this build
cannot compile for. Correctness: kiln's output must be within :data:`TOLERANCE` x the
reference output's largest magnitude of onnxruntime's (fp32), elementwise, with the same shape.
Timing pairs the two engines in alternating rounds (:func:`kiln.testing.timing.compare`),
both with the same thread count.

:func:`run_model_torch` runs the same entry through kiln's PyTorch frontend instead
(``torch.export`` -> :func:`kiln.frontend.torch.from_exported_program`), checked against and
timed beside torch eager; ``export`` is then torch.export failing.
"""

from __future__ import annotations

import re
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...build import build as kiln_build
from ...frontend.onnx import from_onnx
from ...frontend.torch import from_exported_program
from ...ir.errors import TargetError
from ...target import Target
from ..timing import compare
from .catalogue import ZooModel
from .export import exported, randomize_norms

#: kiln's output may differ from onnxruntime's by this fraction of the output's scale.
TOLERANCE = 1e-4
FAILURE_CLASSES = ("export", "reference", "import", "target", "compile", "run", "mismatch",
                   "crash")
#: "<op> node '<name>'" (converters, run-time checks) and "<op> (opset N): nodes a, b"
#: (the importer's list of unsupported operators)
_NODE = re.compile(r"\b([A-Za-z][\w.:]*) node '([^']*)'|(\S+) \(opset \d+\): nodes ([^\n]+)")


@dataclass
class ZooResult:
    """The outcome of one model (times in seconds; None where the stage was not reached)."""

    name: str
    family: str
    source: str
    status: str = "pass"
    error: str = ""
    node: str | None = None
    max_error: float | None = None
    export_s: float | None = None
    compile_s: float | None = None
    kiln_s: float | None = None
    #: the engine kiln is checked against and timed beside: onnxruntime or torch (eager)
    reference: str = "onnxruntime"
    ref_s: float | None = None
    ratio: float | None = None  # median per-round kiln/reference latency

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def error_node(message: str) -> str | None:
    """The node an error message names, as ``"MatMul 'x'"`` (or ``"STFT: a, b"`` for the
    importer's unsupported operators); None when it names none."""
    m = _NODE.search(message)
    if m is None:
        return None
    return f"{m.group(1)} '{m.group(2)}'" if m.group(1) else f"{m.group(3)}: {m.group(4)}"


def _fail(result: ZooResult, status: str, exc: BaseException) -> ZooResult:
    message = str(exc).strip() or traceback.format_exception_only(type(exc), exc)[-1].strip()
    result.status = status
    result.error = f"{type(exc).__name__}: {message}"
    result.node = error_node(message)
    return result


def ort_session(path: str, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def max_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Largest elementwise difference over the reference's largest magnitude (inf when the
    shapes differ or kiln's output has a NaN the reference lacks)."""
    out = np.asarray(out)
    if out.shape != ref.shape:
        return float("inf")
    a, b = out.astype(np.float64), ref.astype(np.float64)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return float("inf")
    ok = ~np.isnan(b)
    scale = max(float(np.abs(b[ok]).max()) if ok.any() else 0.0, 1e-30)
    return float(np.abs(a[ok] - b[ok]).max() / scale) if ok.any() else 0.0


def run_model(model: ZooModel, target: str = "c", timing: bool = True, threads: int = 2,
              rounds: int = 3) -> ZooResult:
    """Export (cached), import, compile and run ``model`` and check it against onnxruntime;
    with ``timing``, time both. Every failure is caught and classified (module docstring)."""
    result = ZooResult(model.name, model.family, model.source)
    t0 = time.perf_counter()
    try:
        path, inputs = exported(model)
    except Exception as exc:  # noqa: BLE001 - the exporter's errors are of every kind
        return _fail(result, "export", exc)
    result.export_s = time.perf_counter() - t0
    try:
        sess = ort_session(str(path), threads)
        ref = sess.run(None, inputs)[0]
    except Exception as exc:  # noqa: BLE001
        return _fail(result, "reference", exc)
    try:
        mod, params = from_onnx(str(path))
    except Exception as exc:  # noqa: BLE001 - a crash in the importer is a failure too
        return _fail(result, "import", exc)
    return compile_and_check(result, mod, params, lambda exe: exe(**inputs), ref,
                             lambda: sess.run(None, inputs), target, timing, threads, rounds)


def compile_and_check(result: ZooResult, mod: Any, params: Any, call: Callable[[Any], Any],
                      ref: np.ndarray, reference: Callable[[], Any], target: str, timing: bool,
                      threads: int, rounds: int) -> ZooResult:
    """Build ``mod`` for ``target``, run it (``call(executable)`` passes the inputs), compare
    with ``ref`` and time it beside ``reference()`` (the stages compile, run and mismatch of
    :func:`run_model`)."""
    t0 = time.perf_counter()
    try:
        tgt = Target.create(target)
        exe = kiln_build(mod, target=tgt, params=params)
    except TargetError as exc:
        return _fail(result, "target", exc)
    except Exception as exc:  # noqa: BLE001
        return _fail(result, "compile", exc)
    result.compile_s = time.perf_counter() - t0
    try:
        if hasattr(exe, "set_num_threads"):
            exe.set_num_threads(threads)
        out = call(exe)
        if isinstance(out, (tuple, list)):
            out = out[0]
        out = np.asarray(out.numpy() if hasattr(out, "numpy") else out)
    except Exception as exc:  # noqa: BLE001
        return _fail(result, "run", exc)
    result.max_error = max_error(out, ref)
    if not result.max_error <= TOLERANCE:
        result.status = "mismatch"
        shape = "" if np.shape(out) == ref.shape else f" (shape {np.shape(out)} vs {ref.shape})"
        result.error = (f"max |kiln - {result.reference}| = {result.max_error:.2e} of the "
                        f"output's scale > {TOLERANCE:g}{shape}")
        return result
    if timing:
        cmp = compare({"kiln": lambda: call(exe), "ref": reference}, rounds=rounds,
                      min_time=0.1)
        result.kiln_s, result.ref_s = cmp.median("kiln"), cmp.median("ref")
        result.ratio = cmp.ratio("kiln", "ref")
    return result


def run_model_torch(model: ZooModel, target: str = "c", timing: bool = True, threads: int = 2,
                    rounds: int = 3) -> ZooResult:
    """:func:`run_model` through kiln's PyTorch frontend: the entry's module (same seeded
    weights as its ONNX export) through ``torch.export``, checked against torch eager."""
    import torch

    result = ZooResult(model.name, model.family, model.source, reference="torch")
    inputs = model.example_inputs()
    args = tuple(torch.from_numpy(inputs[s.name]) for s in model.inputs)
    t0 = time.perf_counter()
    try:
        torch.manual_seed(0)
        module = model.build(model.config)
        randomize_norms(module)
        module.eval()
        with torch.no_grad():
            ref = module(*args).numpy()
            ep = torch.export.export(module, args, strict=False)
    except Exception as exc:  # noqa: BLE001
        return _fail(result, "export", exc)
    result.export_s = time.perf_counter() - t0
    try:
        mod, params = from_exported_program(ep)
    except Exception as exc:  # noqa: BLE001
        return _fail(result, "import", exc)
    arrays = [inputs[s.name] for s in model.inputs]

    def eager() -> Any:
        with torch.no_grad():
            return module(*args)

    torch.set_num_threads(threads)
    return compile_and_check(result, mod, params, lambda exe: exe(*arrays), ref, eager, target,
                             timing, threads, rounds)
