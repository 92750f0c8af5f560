"""KILN_TEST_TARGETS: op cases and builds also run on GPU targets and must match the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.testing import gpu_testing, models
from kiln.testing.op_testing import run_cases


def test_targets_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(gpu_testing.TARGETS_ENV, "c, opencl")
    assert [t.kind for t in gpu_testing.gpu_test_targets()] == ["opencl"]
    monkeypatch.delenv(gpu_testing.TARGETS_ENV)
    assert gpu_testing.gpu_test_targets() == []


def test_assert_close_is_exact_for_integers_and_tolerant_for_floats():
    gpu_testing.assert_close(np.array([1.0, np.nan]), np.array([1.0 + 1e-6, np.nan]), "f")
    with pytest.raises(AssertionError):
        gpu_testing.assert_close(np.array([1, 2]), np.array([1, 3]), "ints")
    with pytest.raises(AssertionError):
        gpu_testing.assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.1]), "floats")
    with pytest.raises(AssertionError, match="shape"):
        gpu_testing.assert_close(np.zeros(3), np.zeros(4), "shapes")
    gpu_testing.assert_close(np.zeros(3), np.ones(3), "random", exact=False)


def test_run_cases_checks_every_case_on_opencl(monkeypatch):
    monkeypatch.setenv(gpu_testing.TARGETS_ENV, "c,opencl")
    x = np.random.default_rng(0).standard_normal((6, 40)).astype("float32")
    called = []
    original = gpu_testing.assert_close

    def spy(*args, **kwargs):
        called.append(args[2])
        return original(*args, **kwargs)

    monkeypatch.setattr("kiln.testing.op_testing.assert_close", spy)
    (out,) = run_cases([("sum", [x], {"axis": [1]})])
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5)
    assert called and called[0].startswith("opencl: sum")


def test_cross_checked_build_compares_each_call(monkeypatch):
    monkeypatch.setenv(gpu_testing.TARGETS_ENV, "c,opencl")
    m = models.mlp(batch=2, sizes=(16, 8, 4))
    build = gpu_testing.cross_checked_build(kiln.build.__wrapped__ if hasattr(
        kiln.build, "__wrapped__") else kiln.build)
    exe = build(m.mod)
    assert isinstance(exe, gpu_testing.CrossCheckExecutable)
    np.testing.assert_allclose(exe(*m.inputs), m.reference(*m.inputs), rtol=1e-4, atol=1e-6)
    assert exe._gpus[0][1].module.kind == "opencl"  # a real OpenCL build
    wrong = gpu_testing.CrossCheckExecutable(exe._cpu, [(kiln.Target("opencl"), lambda *a:
                                                         np.zeros((2, 4), "float32"))], True)
    with pytest.raises(AssertionError, match="opencl vs CPU"):
        wrong(*m.inputs)


def test_cross_checked_build_leaves_npu_builds_alone(monkeypatch):
    # an NPU build runs its products in float16: a float32 OpenCL build is no reference for it
    # (tests/schedule/test_schedule_npu_ops.py failed 38 cases under KILN_TEST_TARGETS=c,opencl)
    monkeypatch.setenv(gpu_testing.TARGETS_ENV, "c,opencl")
    m = models.mlp(batch=2, sizes=(16, 8, 4))
    build = gpu_testing.cross_checked_build(kiln.build.__wrapped__ if hasattr(
        kiln.build, "__wrapped__") else kiln.build)
    exe = build(m.mod, "npu -hw=edge")
    assert not isinstance(exe, gpu_testing.CrossCheckExecutable)
    np.testing.assert_allclose(exe(*m.inputs), m.reference(*m.inputs), rtol=1e-2, atol=1e-2)
