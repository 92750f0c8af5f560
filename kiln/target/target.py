"""Target: what kiln generates code for, with the CPU's detected features.

``Target("c")`` (alias ``"cpu"``/``"llvm"``) means C compiled by the system compiler for this CPU
(``-march=native``), with features read from ``/proc/cpuinfo``: the vector width used by
schedules (512 bits with AVX-512, 256 with AVX2, else 128), fp16/bf16/AMX availability.
``Target("cuda", arch="sm_90")`` and ``Target("opencl")`` are GPU targets: their limits
(``target.gpu``) live in :mod:`kiln.target.gpu`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

from ..ir.errors import KilnError
from . import gpu as gpu_targets


@functools.lru_cache(maxsize=1)
def detect_cpu_features() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@dataclass(frozen=True)
class Target:
    kind: str = "c"
    mcpu: str = "native"
    features: frozenset[str] = field(default_factory=detect_cpu_features)
    num_threads: int = 0  # 0: OpenMP's default (all cores)
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    arch: str = ""  # GPU architecture (``sm_90``) of a CUDA target

    def __post_init__(self):
        kind = {"cpu": "c", "llvm": "c"}.get(self.kind, self.kind)
        if kind not in ("c", "cuda", "opencl", "npu"):
            raise KilnError(f"unknown target kind {self.kind!r} (expected 'c', 'cuda', 'opencl' "
                            "or 'npu')")
        object.__setattr__(self, "kind", kind)
        gpu_targets.check_target(self)

    @staticmethod
    def create(target: Target | str | None) -> Target:
        if target is None:
            return Target("c")
        if isinstance(target, Target):
            return target
        return Target(str(target))

    @property
    def vector_bits(self) -> int:
        """Width of the widest SIMD register usable by generated code."""
        if os.environ.get("KILN_VECTOR_BITS"):
            return int(os.environ["KILN_VECTOR_BITS"])
        if "avx512f" in self.features:
            return 512
        if "avx2" in self.features or "avx" in self.features:
            return 256
        return 128

    def vector_lanes(self, dtype: Any) -> int:
        """How many lanes of ``dtype`` fit one SIMD register."""
        from ..ir.dtype import as_dtype

        dt = as_dtype(dtype)
        return max(1, self.vector_bits // max(8, dt.bits))

    @property
    def has_fp16(self) -> bool:
        return "avx512fp16" in self.features

    @property
    def has_amx(self) -> bool:
        """AMX tile registers (``amx_tile``); see ``has_amx_bf16`` / ``has_amx_int8``."""
        return "amx_tile" in self.features

    @property
    def has_amx_bf16(self) -> bool:
        """AMX tiles with the bfloat16 dot product (``_tile_dpbf16ps``)."""
        return self.has_amx and "amx_bf16" in self.features

    @property
    def has_amx_int8(self) -> bool:
        """AMX tiles with the int8 dot products (``_tile_dpbssd``...)."""
        return self.has_amx and "amx_int8" in self.features

    @property
    def is_gpu(self) -> bool:
        """Whether code is generated as GPU kernels (CUDA or OpenCL)."""
        return gpu_targets.is_gpu_kind(self.kind)

    @property
    def gpu(self) -> gpu_targets.GpuLimits:
        """The limits of a GPU target (threads, shared memory, registers...)."""
        return gpu_targets.limits_of(self)

    def __str__(self) -> str:
        return self.kind
