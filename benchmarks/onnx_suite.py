"""Run ONNX's backend node tests through kiln and print a pass table per op type.

Usage: ``python benchmarks/onnx_suite.py [-j JOBS] [--all] [--filter SUBSTR]``.
By default only the cases ``kiln.frontend.onnx.exclusions`` does not exclude are run;
``--all`` also runs KNOWN_FAILURES (to see which of them pass now).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import sys
import time
import warnings

import numpy as np


def _cases() -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model_tests(kind="node")


def _model(case):
    import os

    import onnx

    if case.model is not None:
        return case.model
    return onnx.load(os.path.join(case.model_dir, "model.onnx"))


def run_case(case) -> tuple[str, str, float]:
    """('pass' | 'fail', message, seconds) for one backend test case."""
    import onnx
    import onnx.numpy_helper

    from kiln.frontend.onnx.backend import KilnBackend

    t0 = time.perf_counter()
    try:
        rep = KilnBackend.prepare(_model(case))
        for inputs, expected in case.data_sets:
            outs = rep.run(list(inputs))
            if len(outs) != len(expected):
                return "fail", f"{len(outs)} outputs, expected {len(expected)}", 0.0
            for o, e in zip(outs, expected):
                if isinstance(e, onnx.TensorProto):
                    e = onnx.numpy_helper.to_array(e)
                e = np.asarray(e)
                if o.dtype != e.dtype:
                    return "fail", f"dtype {o.dtype}, expected {e.dtype}", 0.0
                np.testing.assert_allclose(o, e, rtol=case.rtol, atol=case.atol)
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
    args = ap.parse_args(argv)

    _CASES.extend(_cases())
    selected, reasons = [], collections.Counter()
    for case in _CASES:
        if args.filter not in case.name:
            continue
        reason = exclusion_reason(_model(case), case.name)
        if reason is None or (args.all and case.name in KNOWN_FAILURES):
            selected.append(case)
        else:
            reasons[reason.split(":")[0]] += 1
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
    passed = sum(r[1] == "pass" for r in results)
    print(f"\n{passed} / {len(selected)} run cases pass in {wall:.1f} s ({args.jobs} jobs); "
          f"{len(_CASES)} cases in the suite")
    for reason, n in reasons.most_common():
        print(f"  excluded: {n:4d}  {reason}")
    return 0 if passed == len(selected) else 1


if __name__ == "__main__":
    sys.exit(main())
