"""Schedules per target: how an operator's loops run on each kind of hardware.

Operators (``kiln.op``) declare what they compute; each target family keeps its schedules in
its own room and registers them through :mod:`kiln.schedule.registry`:

- ``kiln/schedule/cpu/``: the C target (``"c"``): rules by fusion pattern (injective,
  reduction) plus the ops with their own schedules (GEMM and convolution micro-kernels, pooling,
  row-wise normalizations, scans...) and the CPU's layout preferences (NCHWc, packed GEMM);
- ``kiln/schedule/gpu/`` (CUDA and OpenCL) and ``kiln/schedule/npu/`` beside it.

Importing this package imports every room, so a lookup (:func:`lookup_schedule`) always sees
every registration, whatever was imported first.
"""

from . import cpu  # noqa: F401 - registers the CPU schedules
from .registry import (  # noqa: F401 - the registration API
    FAMILIES,
    TARGET_FAMILIES,
    lookup_alter_layout,
    lookup_epilogue,
    lookup_fallback,
    lookup_schedule,
    no_schedule_reason,
    register_alter_layout,
    register_epilogue,
    register_fallback,
    register_no_schedule,
    register_rule,
    register_schedule,
    schedule_source,
    target_family,
)
