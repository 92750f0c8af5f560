"""Fuzz cases: one seed makes one case, and one case runs and is classified in a worker.

:func:`make_case` draws, from the seed alone, a kind of case and what it is made of: a sample
(a node test model or a hand-built one) and one mutation of that kind (see ``mutate.py``):

============  ================================================================================
kind          what is broken
============  ================================================================================
valid         nothing: the sample as it is (a hand-built one with fresh random sizes)
inputs        a run-time input: values (NaN/Inf, extremes), dtype, shape, size, presence
attribute     one attribute of one node: its value, type, presence
dims          the declared shape or element type of a graph input
edges         the graph's wiring: a node input or output, the node order, the graph outputs
opset         the opset or IR version, an unknown domain
initializer   an initializer: dims vs data, data type, raw bytes, values, shadowing, presence
bytes         the serialized model, damaged byte by byte
executable    a saved executable of the (valid) sample, damaged byte by byte, then loaded
============  ================================================================================

:func:`execute` runs it -- kiln, then the references -- and returns an :class:`Outcome` whose
``cls`` is one of :data:`CLASSES`. The worker process reports the phase it is in before each
(``report``), so a crash or hang in a reference is not counted against kiln.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError

from .corpus import Sample, handbuilt
from .mutate import MODEL_MUTATIONS, damage_bytes, mutate_inputs

#: Case kinds and their share of the cases.
KINDS: dict[str, float] = {
    "valid": 0.06, "inputs": 0.2, "attribute": 0.2, "dims": 0.12, "edges": 0.1, "opset": 0.06,
    "initializer": 0.08, "bytes": 0.1, "executable": 0.08,
}

#: How a case ends. "correct": kiln's outputs match a reference; "kiln_error": kiln refused with
#: a KilnError; "crash": the process died by a signal in kiln; "hang": kiln ran past the time
#: limit; "other_exception": any other exception escaped kiln; "wrong": both references agree
#: and kiln does not; "wrong_refs_disagree": the references disagree with each other and kiln
#: matches neither; "wrong_one_reference": only one reference ran (the other refused the case)
#: and kiln does not match it -- to look at case by case (onnx.reference wraps integers that
#: overflow, onnxruntime indexes with a NaN coordinate); "unverified": kiln ran but no reference
#: could (each refused the case);
#: "harness_error": the fuzzer itself failed making or judging the case (a bug to fix here).
CLASSES = ("correct", "kiln_error", "crash", "hang", "other_exception", "wrong",
           "wrong_refs_disagree", "wrong_one_reference", "unverified", "harness_error")

#: Words of Python's own error messages that a KilnError must not show a user.
PYTHON_WORDING = re.compile(r"NoneType|object has no attribute|object is not (subscriptable|"
                            r"iterable|callable)|unhashable type|takes \d+ positional|"
                            r"index out of range|referenced before assignment|"
                            r"unsupported operand type|invalid literal for int")


#: Errors about the model as a whole, not one of its nodes (a file that is no ONNX model, a
#: graph input, an initializer or a graph output): they need not name a node; one naming a
#: node by its position (``node #3``, where its name is not text) names it.
GRAPH_LEVEL = re.compile(r"not a valid ONNX model|graph input|graph output|initializer|"
                         r"ONNX value .* (is used before|never produced)|the ONNX model uses "
                         r"\d+ operator type|opset|"
                         r"node #\d+")


@dataclass
class Case:
    """One fuzz case (see the module docstring)."""

    seed: int
    kind: str
    source: str
    what: str
    model: bytes
    feeds: dict[str, Any]
    damage_seed: int = 0


@dataclass
class Outcome:
    """How a case ended (``cls``) and where: the stage (``import``, ``build``, ``run``,
    ``load``, ``reference``), the error's type and message, notes on the check."""

    seed: int
    kind: str
    source: str
    what: str
    cls: str
    stage: str = ""
    error: str = ""
    message: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _choose(rng: np.random.Generator, weights: dict[str, float]) -> str:
    names = list(weights)
    p = np.array([weights[n] for n in names], dtype=np.float64)
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def make_case(seed: int, corpus: list[Sample], kinds: dict[str, float] | None = None) -> Case:
    """The case of ``seed``: a kind, a sample (node test model or hand-built) and a mutation."""
    rng = np.random.default_rng(seed)
    kind = _choose(rng, kinds or KINDS)
    sample = handbuilt(rng) if not corpus or rng.random() < 0.2 else corpus[
        int(rng.integers(len(corpus)))]
    model = onnx.ModelProto()
    model.ParseFromString(sample.model)
    feeds: dict[str, Any] = sample.feeds()
    what = "unchanged"
    if kind in MODEL_MUTATIONS:
        what = MODEL_MUTATIONS[kind](rng, model, feeds)
        if rng.random() < 0.25:  # now and then a second mutation, of any kind, on top
            other = list(MODEL_MUTATIONS)[int(rng.integers(len(MODEL_MUTATIONS)))]
            what += "; " + MODEL_MUTATIONS[other](rng, model, feeds)
    elif kind == "inputs":
        what = mutate_inputs(rng, model, feeds)
    data = model.SerializeToString()
    if kind == "bytes":
        data, what = damage_bytes(rng, data)
    return Case(seed, kind, sample.name, what, data, feeds, int(rng.integers(2**31)))


# ---- running --------------------------------------------------------------------------------
def _tolerance(dtype: np.dtype) -> tuple[float, float]:
    if dtype.itemsize <= 2:
        return 2e-2, 2e-2
    if dtype == np.float64:
        return 1e-6, 1e-9
    return 1e-3, 1e-4


def same_outputs(got: list[Any], want: list[Any]) -> bool:
    """Whether two output lists agree: count, shapes, dtypes, values (NaN where NaN)."""
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind in "fc":
            rtol, atol = _tolerance(a.dtype)
            af, bf = a.astype(np.float64), b.astype(np.float64)
            if not np.allclose(af, bf, rtol=rtol, atol=atol, equal_nan=True):
                return False
        elif a.dtype.kind in "biu" and not np.array_equal(a, b):
            return False
        elif a.dtype.kind not in "biufc" and not np.array_equal(
                np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)):
            # other kinds (bool, bfloat16/float8 from ml_dtypes, ...) compare bit for bit; a
            # non-contiguous output (a transposed view) is copied first, as .view() requires
            return False
    return True


class _Stage:
    """Which step of kiln is running, for the outcome of an exception escaping it."""

    def __init__(self) -> None:
        self.name = "import"


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _run_kiln(case: Case, stage: _Stage) -> list[Any]:
    stage.name = "import"
    mod, params = from_onnx(case.model)
    stage.name = "build"
    exe = kiln.build(mod, params=params)
    stage.name = "run"
    return _as_list(exe(**case.feeds))


def _run_executable(case: Case, stage: _Stage) -> tuple[list[Any], list[Any]]:
    """Build the sample, save it, damage the file, load and run it: (outputs, undamaged
    outputs)."""
    stage.name = "import"
    mod, params = from_onnx(case.model)
    stage.name = "build"
    exe = kiln.build(mod, params=params)
    stage.name = "run"
    want = _as_list(exe(**case.feeds))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.kiln")
        exe.save(path)
        with open(path, "rb") as f:
            data, what = damage_bytes(np.random.default_rng(case.damage_seed), f.read())
        case.what = f"saved executable: {what}"
        with open(path, "wb") as f:
            f.write(data)
        stage.name = "load"
        loaded = kiln.load(path)
        stage.name = "run"
        return _as_list(loaded(**case.feeds)), want


def _ort(case: Case) -> list[Any]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    sess = ort.InferenceSession(case.model, opts, providers=["CPUExecutionProvider"])
    return _as_list(sess.run(None, case.feeds))


def _onnx_reference(case: Case) -> list[Any]:
    return _as_list(ReferenceEvaluator(case.model).run(None, case.feeds))


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else "")[:300]


def execute(case: Case, report: Callable[..., None]) -> Outcome:
    """Run ``case`` and classify it (see :func:`_execute`), timed."""
    start = time.perf_counter()
    out = _execute(case, report)
    out.seconds = round(time.perf_counter() - start, 3)
    return out


def _execute(case: Case, report: Callable[..., None]) -> Outcome:
    """Run ``case`` (kiln, then the references when kiln gave outputs) and classify it;
    ``report(phase)`` is called as each phase starts (``kiln``, ``reference``) and
    ``report("kiln_done", outcome)`` with kiln's own outcome before the references run."""
    out = Outcome(case.seed, case.kind, case.source, case.what, "")
    stage = _Stage()
    want: list[Any] | None = None
    report("kiln")
    try:
        if case.kind == "executable":
            got, want = _run_executable(case, stage)
        else:
            got = _run_kiln(case, stage)
    except KilnError as err:
        out.cls, out.stage = "kiln_error", stage.name
        out.error, out.message = type(err).__name__, _first_line(err)
        _message_notes(out, err, case)
        return out
    except Exception as err:  # noqa: BLE001 - what the fuzzer is looking for
        out.cls, out.stage = "other_exception", stage.name
        out.error, out.message = type(err).__name__, _first_line(err)
        out.notes.append(_where(err))
        return out
    out.what = case.what
    report("kiln_done", Outcome(case.seed, case.kind, case.source, case.what, "unverified",
                                stage.name))
    report("reference")
    return _check(out, case, got, want)


def _check(out: Outcome, case: Case, got: list[Any], want: list[Any] | None) -> Outcome:
    """Classify kiln's outputs against the references."""
    if want is not None:  # a damaged executable: the undamaged one is the reference
        out.cls = "correct" if same_outputs(got, want) else "wrong"
        return out
    results: dict[str, list[Any] | None] = {}
    for name, ref in (("onnxruntime", _ort), ("onnx.reference", _onnx_reference)):
        try:
            results[name] = ref(case)
        except Exception as err:  # noqa: BLE001 - a reference refusing the case
            results[name] = None
            out.notes.append(f"{name}: {type(err).__name__}: {_first_line(err)[:120]}")
        if results[name] is not None and same_outputs(got, results[name]):
            out.cls = "correct"
            return out
    ort, ref = results["onnxruntime"], results["onnx.reference"]
    if ort is None and ref is None:
        out.cls = "unverified"
    elif ort is None or ref is None:
        out.cls = "wrong_one_reference"
    elif not same_outputs(ort, ref):
        out.cls = "wrong_refs_disagree"
    else:
        out.cls = "wrong"
    return out


def _where(err: BaseException) -> str:
    """The innermost frame of kiln in the traceback: ``kiln/op/nn.py:123 in _infer``."""
    frames = traceback.extract_tb(err.__traceback__)
    for fr in reversed(frames):
        if "/kiln/" in fr.filename:
            return f"{fr.filename.split('/kiln/')[-1]}:{fr.lineno} in {fr.name}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _message_notes(out: Outcome, err: BaseException, case: Case) -> None:
    """Flag a KilnError message that shows Python wording, or (from import or build) names no
    node of the model."""
    text = str(err)
    if PYTHON_WORDING.search(text):
        out.notes.append("python wording")
    if out.stage in ("import", "build") and not GRAPH_LEVEL.search(text):
        names = _node_names(case.model)
        if names and not any(n and n in text for n in names):
            out.notes.append("names no node")


def _node_names(model: bytes) -> set[str]:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(model)
    except Exception:  # noqa: BLE001 - damaged bytes: nothing to name
        return set()
    names = {n.name for n in proto.graph.node} | {n.op_type for n in proto.graph.node}
    # a name that is not UTF-8 comes back as bytes: the message cannot show it as it is
    return {n for n in names if isinstance(n, str)}
