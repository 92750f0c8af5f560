"""Run ONNX's backend tests through kiln and print pass tables per folder and per op type.

Usage: ``python benchmarks/onnx_suite.py [-j JOBS] [--all] [--filter SUBSTR] [--kind KIND]``.
The folders are ``node`` (generated in memory), ``pytorch-converted``, ``pytorch-operator`` and
``simple`` (model files shipped with onnx). By default only the cases
``kiln.frontend.onnx.exclusions`` does not exclude are run; ``--all`` also runs KNOWN_FAILURES
(to see which of them pass now). A folder's pass rate counts every case except those excluded
as training-only or map-type cases (the issue's rule; string tensors, sequences and
optionals are run since issue 26).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import sys
import time
import warnings

import numpy as np

KINDS = ("node", "pytorch-converted", "pytorch-operator", "simple")
#: Exclusion categories that do not count against a folder's pass rate.
NOT_COUNTED = ("training-only", "map types")


def _cases(kinds: tuple[str, ...] = KINDS) -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [c for kind in kinds for c in load_model_tests(kind=kind)]


def _data_sets(case) -> list:
    """(inputs, expected outputs) pairs: in memory for node cases, .pb files for the others."""
    import glob
    import os

    import onnx

    if case.data_sets is not None:
        return case.data_sets

    def load(path: str):
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        return t

    def number(path: str) -> int:
        return int(path.rsplit("_", 1)[1].split(".")[0])

    out = []
    for d in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*"))):
        ins = sorted(glob.glob(os.path.join(d, "input_*.pb")), key=number)
        outs = sorted(glob.glob(os.path.join(d, "output_*.pb")), key=number)
        out.append(([load(p) for p in ins], [load(p) for p in outs]))
    return out


def _model(case):
    import os

    import onnx

    if case.model is not None:
        return case.model
    return onnx.load(os.path.join(case.model_dir, "model.onnx"))


def _compare(got, want, rtol: float, atol: float) -> str:
    """'' when output ``got`` matches ``want`` (an array, a list of them for a sequence, None
    for an empty optional), else what differs (assert_allclose raises for values)."""
    import onnx
    import onnx.numpy_helper

    if isinstance(want, onnx.TensorProto):
        want = onnx.numpy_helper.to_array(want)
    if want is None or got is None:
        return "" if want is None and got is None else f"got {type(got).__name__}, expected " \
            f"{type(want).__name__}"
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"got {type(got).__name__}, expected a sequence of {len(want)}"
        return next((p for p in (_compare(o, e, rtol, atol) for o, e in zip(got, want)) if p),
                    "")
    want = np.asarray(want)
    if isinstance(got, list):
        return "got a sequence, expected an array"
    if want.dtype.kind in "OUS":  # strings: compared as text
        if np.asarray(got).dtype.kind not in "OUS":
            return f"dtype {got.dtype}, expected strings"
        np.testing.assert_array_equal(np.asarray(got).astype(str), want.astype(str))
        return ""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return ""


def run_case(case) -> tuple[str, str, float]:
    """('pass' | 'fail', message, seconds) for one backend test case."""

    from kiln.frontend.onnx.backend import KilnBackend

    t0 = time.perf_counter()
    try:
        rep = KilnBackend.prepare(_model(case))
        for inputs, expected in _data_sets(case):
            outs = rep.run(list(inputs))
            if len(outs) != len(expected):
                return "fail", f"{len(outs)} outputs, expected {len(expected)}", 0.0
            for o, e in zip(outs, expected):
                problem = _compare(o, e, case.rtol, case.atol)
                if problem:
                    return "fail", problem, 0.0
    except Exception as err:  # noqa: BLE001 - reported per case
        msg = f"{type(err).__name__}: {err}".splitlines()
        return "fail", " | ".join(msg[:3])[:300], time.perf_counter() - t0
    return "pass", "", time.perf_counter() - t0


def _worker(name: str) -> tuple[str, str, str, float]:
    case = next(c for c in _CASES if c.name == name)
    status, msg, secs = run_case(case)
    return name, status, msg, secs


_CASES: list = []


def main(argv: list[str] | None = None) -> int:
    from kiln.frontend.onnx.exclusions import KNOWN_FAILURES, exclusion_reason

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-j", "--jobs", type=int, default=mp.cpu_count())
    ap.add_argument("--all", action="store_true", help="also run KNOWN_FAILURES")
    ap.add_argument("--filter", default="")
    ap.add_argument("--kind", choices=KINDS, action="append",
                    help="only this folder (repeatable; default: all four)")
    args = ap.parse_args(argv)

    _CASES.extend(_cases(tuple(args.kind or KINDS)))
    selected, reasons = [], collections.Counter()
    folders: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in _CASES:
        if args.filter not in case.name:
            continue
        reason = exclusion_reason(_model(case), case.name)
        folders[case.kind]["total"] += 1
        if reason is None or (args.all and case.name in KNOWN_FAILURES):
            selected.append(case)
        else:
            category = reason.split(":")[0]
            reasons[category] += 1
            folders[case.kind]["not counted" if category in NOT_COUNTED else "excluded"] += 1
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(args.jobs) as pool:
        results = pool.map(_worker, [c.name for c in selected], chunksize=1)
    wall = time.perf_counter() - t0

    by_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for (name, status, msg, _), case in zip(results, selected):
        for op_type in sorted({n.op_type for n in _model(case).graph.node}):
            by_op[op_type][1] += 1
            by_op[op_type][0] += status == "pass"
        if status != "pass":
            print(f"FAIL {name}: {msg}")
    print(f"\n{'op type':24s} pass / run")
    for op_type, (ok, n) in sorted(by_op.items()):
        print(f"{op_type:24s} {ok:4d} / {n}")
    for (_, status, _, _), case in zip(results, selected):
        folders[case.kind]["run"] += 1
        folders[case.kind]["pass"] += status == "pass"
    print(f"\n{'folder':18s} {'cases':>6s} {'not counted':>12s} {'counted':>8s} {'run':>5s} "
          f"{'pass':>5s} {'pass %':>7s}")
    for kind, c in folders.items():
        counted = c["total"] - c["not counted"]
        rate = 100.0 * c["pass"] / counted if counted else 0.0
        print(f"{kind:18s} {c['total']:6d} {c['not counted']:12d} {counted:8d} {c['run']:5d} "
              f"{c['pass']:5d} {rate:6.1f}%")
    passed = sum(r[1] == "pass" for r in results)
    print(f"\n{passed} / {len(selected)} run cases pass in {wall:.1f} s ({args.jobs} jobs); "
          f"{len(_CASES)} cases in the suite")
    for reason, n in reasons.most_common():
        print(f"  excluded: {n:4d}  {reason}")
    return 0 if passed == len(selected) else 1


if __name__ == "__main__":
    sys.exit(main())
