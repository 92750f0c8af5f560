"""ONNX's official backend tests run through ``kiln.frontend.onnx.backend``: the node cases and
the pytorch-converted, pytorch-operator and simple model folders.

Only cases whose operators all have converters run (``kiln.frontend.onnx.exclusions``); every
other case is excluded with its reason, which shows in the skip message (a regex comment).
``benchmarks/onnx_suite.py`` runs the same selection and prints pass tables per folder and op
type.
"""

from __future__ import annotations

import collections
import os
import re
import warnings

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx.backend.test.loader import load_model_tests

from kiln.frontend.onnx.backend import KilnBackend
from kiln.frontend.onnx.exclusions import KNOWN_FAILURES, exclusion_reason

# Measured with onnx 1.23 (issue 26: string tensors, sequences and optionals run, Loops with
# a trip count known only at run time run, carrying sequences and optionals too; an If whose
# branches differ in rank runs by guarded specialization; a 16-bit Attention computes its
# softmax in its input type): 1996 cases
# run and pass (node 1858 of the 1877 that count, i.e. all but training-only cases;
# pytorch-converted 82/82, pytorch-operator 35/35, simple 21/21); the rest are KNOWN_FAILURES
# or excluded, each with its reason. Every run case must pass and their number must not fall
# below this floor.
MIN_PASSING_CASES = 1996

#: The folders run here: generated node cases and the model files shipped with onnx ("real"
#: needs downloads and is not run).
KINDS = ("node", "pytorch-converted", "pytorch-operator", "simple")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _CASES = [c for kind in KINDS for c in load_model_tests(kind=kind)]


def _model(case):
    if case.model is not None:
        return case.model
    return onnx.load(os.path.join(case.model_dir, "model.onnx"))


#: Cases that kiln runs but onnx's runner cannot judge: its assert_similar_outputs recurses into
#: a sequence output and takes len() of each element, which fails for a 0-d tensor whatever the
#: values. They run in :func:`test_cases_the_runner_cannot_compare` instead, compared element
#: by element with the case's own tolerances.
RUNNER_CANNOT_COMPARE = {
    "test_loop16_seq_none": "a sequence of 0-d tensors (the runner takes len() of each)",
}

_RUN: list[str] = []
_EXCLUDED: dict[str, list[str]] = collections.defaultdict(list)
for _case in _CASES:
    _reason = exclusion_reason(_model(_case), _case.name)
    if _reason is None:
        _RUN.append(_case.name)
    else:
        _EXCLUDED[_reason].append(_case.name)

backend_test = onnx.backend.test.BackendTest(KilnBackend, __name__)
backend_test.include("^(?:" + "|".join(
    re.escape(n) for n in _RUN if n not in RUNNER_CANNOT_COMPARE) + ")_cpu$")
for _reason, _names in _EXCLUDED.items():
    _comment = _reason.replace(")", "]").replace("(", "[")
    backend_test.exclude(f"(?#{_comment})^(?:{'|'.join(map(re.escape, _names))})_cpu$")

globals().update(backend_test.test_cases)


def test_node_case_counts():
    """Print the selection and check that the passing floor is kept."""
    groups = collections.Counter(r.split(":")[0] for r in exclusion_reasons())
    print(f"\nONNX backend cases: {len(_CASES)}; run: {len(_RUN)}; "
          f"known failures: {len(KNOWN_FAILURES)}")
    for reason, n in groups.most_common():
        print(f"  excluded {n:4d}: {reason}")
    assert len(_CASES) >= 1800
    assert len(_RUN) >= MIN_PASSING_CASES
    assert sum(groups.values()) + len(_RUN) == len(_CASES)
    # every known failure is a real, converted case
    names = {c.name for c in _CASES}
    assert set(KNOWN_FAILURES) <= names


def _same(got, want, rtol: float, atol: float) -> None:
    """``got`` equals ``want`` (an array, or a list of them for a sequence)."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w, rtol, atol)
        return
    want = np.asarray(want)
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(RUNNER_CANNOT_COMPARE))
def test_cases_the_runner_cannot_compare(name):
    case = next(c for c in _CASES if c.name == name)
    assert name in _RUN  # converted and not a known failure
    rep = KilnBackend.prepare(_model(case))
    for inputs, expected in case.data_sets:
        outs = rep.run(list(inputs))
        assert len(outs) == len(expected)
        for got, want in zip(outs, expected):
            _same(got, want, case.rtol, case.atol)


def exclusion_reasons() -> list[str]:
    return [r for r, names in _EXCLUDED.items() for _ in names]


def test_backend_device_and_errors():
    assert KilnBackend.supports_device("CPU")
    assert not KilnBackend.supports_device("CUDA")
    with pytest.raises(Exception, match="CPU"):
        KilnBackend.prepare(_CASES[0].model, device="CUDA")
