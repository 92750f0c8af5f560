"""Test-wide fixtures.

Every test runs inside a PassContext whose WellFormedInstrument checks ``kiln.graph.well_formed``
around every pass the test runs (directly, in a Sequential, or inside ``kiln.build``), so a pass
that breaks the IR fails the test that ran it with an error naming the pass. Nested contexts a
test makes inherit the instrument unless they pass their own ``instruments``.
"""

import pytest

from kiln.transform import PassContext, WellFormedInstrument


@pytest.fixture(autouse=True)
def _check_every_pass_keeps_ir_well_formed():
    with PassContext(instruments=[WellFormedInstrument()]):
        yield


@pytest.fixture(autouse=True)
def _cross_check_builds_on_gpu_targets(monkeypatch):
    """With KILN_TEST_TARGETS=c,opencl (kiln.testing.gpu_testing) every kiln.build a test
    makes also builds for the GPU targets, and every call compares their results with the
    CPU's."""
    import kiln
    from kiln.testing.gpu_testing import (
        compile_test_targets,
        cross_checked_build,
        gpu_test_targets,
    )

    if gpu_test_targets() or compile_test_targets():
        monkeypatch.setattr(kiln, "build", cross_checked_build(kiln.build))
    yield


def _cuda_device_present() -> bool:
    try:
        from kiln.runtime.gpu.module import get_device

        get_device("cuda")
        return True
    except Exception:  # noqa: BLE001 - no package, no driver or no device
        return False


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA device: skipped (with the reason) without one."""
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked or _cuda_device_present():
        return
    skip = pytest.mark.skip(reason="no CUDA device (tests marked gpu run on a machine with one)")
    for item in marked:
        item.add_marker(skip)
