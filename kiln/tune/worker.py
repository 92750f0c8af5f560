"""The measuring process of the local runner (``python -m kiln.tune.worker``).

It reads requests from its standard input and answers on its standard output, each message a
pickled dict behind an 8-byte length (:func:`send`, :func:`receive`); its first message says
its imports are done. A request names a reference artifact (the default schedule's kernel)
and a candidate: the worker makes the kernel's inputs from a fixed seed, runs the reference
once for the expected outputs (kept for the next candidates of the same kernel), runs the
candidate on outputs poisoned with NaN, compares, and times it in rounds alternating with the
reference: the ratio of paired timings is what the tuner compares, so load from other
processes that comes and goes (a shared machine) does not crown a candidate that happened to
run in a quiet moment. A candidate that crashes takes this process down with it, one that
hangs is killed by the parent (:class:`kiln.tune.measure.LocalRunner`): either way the
tuner's own process goes on. Native code that prints would corrupt the answers, so the
protocol runs on a copy of the original standard output, and file descriptor 1 goes to
standard error.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import struct
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from ..codegen.c import externs
from ..runtime.executable import Executable, load
from ..runtime.module import FunctionInfo, Module
from ..target import Target

__all__ = ["compare", "main", "make_inputs", "make_model_inputs", "measure", "measure_model",
           "receive", "send", "time_calls"]

_HEADER = struct.Struct("<Q")


def send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the other side closed the pipe")
    (size,) = _HEADER.unpack(head)
    return pickle.loads(stream.read(size))


def make_inputs(info: FunctionInfo, seed: int = 0) -> list[np.ndarray]:
    """Arrays for every parameter: normal floats for inputs (zeros for integer and boolean
    ones: always valid indices), NaN-poisoned (77 for integers) outputs."""
    rng = np.random.default_rng(seed)
    n_out = info.num_outputs if info.num_outputs is not None else 1
    arrays = []
    for i, p in enumerate(info.params):
        dtype = p.dtype.to_numpy()
        shape = tuple(int(d) for d in p.shape)
        if i < len(info.params) - n_out and dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(np.zeros(shape, dtype))
    return arrays


def make_model_inputs(exe: Executable, seed: int = 0) -> list[np.ndarray]:
    """Inputs for a whole model (static shapes): normal floats, zeros for integer and boolean
    inputs (always valid indices)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for info in exe.inputs:
        if not all(isinstance(d, int) for d in info.shape):
            raise ValueError(f"input {info.name!r} has a symbolic shape {info.shape}: a model "
                             "is measured at fixed shapes")
        dtype = np.dtype(info.dtype)
        arrays.append(rng.standard_normal(info.shape).astype(dtype) if dtype.kind == "f"
                      else np.zeros(info.shape, dtype))
    return arrays


def measure_model(exe: Executable, inputs: list[np.ndarray], repeat: int,
                  min_repeat_s: float) -> list[float]:
    """Seconds per run of a whole model, as :func:`measure` times a kernel."""
    return time_calls(exe, inputs, repeat, min_repeat_s)


def _outputs(result: Any) -> list[np.ndarray]:
    items = result if isinstance(result, (list, tuple)) else [result]
    return [np.asarray(r).copy() for r in items]


def _poison(arrays: list[np.ndarray], n_out: int) -> None:
    for a in arrays[len(arrays) - n_out:]:
        a.fill(np.nan if a.dtype.kind == "f" else 77)


def compare(outputs: list[np.ndarray], expected: list[np.ndarray]) -> str:
    """'' when the candidate's outputs match the reference's, else what differs. Floats get a
    tolerance for reordered sums (relative 1e-3, absolute 1e-4 of the output's scale)."""
    for k, (out, ref) in enumerate(zip(outputs, expected)):
        if ref.dtype.kind == "f":
            scale = float(np.nanmax(np.abs(ref))) if ref.size and np.isfinite(ref).any() else 1.0
            ok = np.allclose(out, ref, rtol=1e-3, atol=1e-4 * max(scale, 1.0), equal_nan=True)
        else:
            ok = np.array_equal(out, ref)
        if not ok:
            bad = int(np.sum(~np.isclose(out, ref, rtol=1e-3, equal_nan=True)))
            return f"output {k} differs from the default schedule's ({bad} of {ref.size} elements)"
    return ""


def measure(fn: Any, arrays: list[np.ndarray], repeat: int, min_repeat_s: float) -> list[float]:
    """Seconds per call of the unchecked entry ``fn``: ``repeat`` times the mean of enough
    back-to-back calls to last ``min_repeat_s``."""
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    return time_calls(fn, (ptrs, None), repeat, min_repeat_s)


def time_calls(fn: Any, args: Sequence[Any], repeat: int, min_repeat_s: float) -> list[float]:
    """``repeat`` times the mean seconds of enough back-to-back ``fn(*args)`` to last
    ``min_repeat_s`` (one untimed call first sizes the blocks; no wrapper between the loop and
    ``fn``, whose own cost is the measurement)."""
    start = time.perf_counter()
    fn(*args)
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, min(1000, int(min_repeat_s / once)))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn(*args)
        times.append((time.perf_counter() - start) / number)
    return times


class _Worker:
    def __init__(self) -> None:
        self.modules: dict[str, Module] = {}
        self.expected: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def module(self, art: Any) -> Module:
        mod = self.modules.get(art.lib_path)
        if mod is None:
            externs.before_load(art.source, Target.create(art.target))
            mod = self.modules[art.lib_path] = Module(art.lib_path, art.source, art.infos)
        return mod

    def run(self, art: Any, arrays: list[np.ndarray]) -> None:
        self.module(art)[art.name](*arrays)

    def reference(self, art: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if art.lib_path not in self.expected:
            info = art.infos[art.name]
            inputs = make_inputs(info)
            arrays = [a.copy() for a in inputs]
            self.run(art, arrays)
            n_out = info.num_outputs or 1
            self.expected[art.lib_path] = (inputs, arrays[len(arrays) - n_out:])
        return self.expected[art.lib_path]

    def handle_model(self, req: dict[str, Any]) -> dict[str, Any]:
        """Two whole models saved as .kiln files: the candidate's outputs against the
        reference's on the same seeded inputs, then their run times in alternation."""
        ref, cand = load(req["reference"]), load(req["candidate"])
        inputs = make_model_inputs(ref)
        error = compare(_outputs(cand(*inputs)), _outputs(ref(*inputs)))
        if error:
            return {"ok": False, "times": [], "error": error}
        times, ref_times = [], []
        for _ in range(req["repeat"]):
            ref_times += measure_model(ref, inputs, 1, req["min_repeat_s"])
            times += measure_model(cand, inputs, 1, req["min_repeat_s"])
        return {"ok": True, "times": times, "ref_times": ref_times, "error": ""}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("model"):
            return self.handle_model(req)
        ref, cand = req["reference"], req["candidate"]
        inputs, expected = self.reference(ref)
        info = cand.infos[cand.name]
        arrays = [a.copy() for a in inputs]
        n_out = info.num_outputs or 1
        _poison(arrays, n_out)
        self.run(cand, arrays)
        error = compare(arrays[len(arrays) - n_out:], expected)
        if error:
            return {"ok": False, "times": [], "error": error}
        fn = self.module(cand).unchecked_function(cand.name)
        ref_fn = self.module(ref).unchecked_function(ref.name)
        ref_arrays = [a.copy() for a in inputs]
        times, ref_times = [], []
        for _ in range(req["repeat"]):
            ref_times += measure(ref_fn, ref_arrays, 1, req["min_repeat_s"])
            times += measure(fn, arrays, 1, req["min_repeat_s"])
        return {"ok": True, "times": times, "ref_times": ref_times, "error": ""}


def main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    worker = _Worker()
    send(out, {"ready": os.getpid()})  # imports done: the parent's timeouts start now
    while True:
        try:
            req = receive(inp)
        except EOFError:
            return
        try:
            answer = worker.handle(req)
        except Exception as err:  # noqa: BLE001 - any failure marks the candidate bad
            answer = {"ok": False, "times": [], "error": f"{type(err).__name__}: {err}"}
        send(out, answer)


if __name__ == "__main__":
    main()
