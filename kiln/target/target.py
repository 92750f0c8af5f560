"""Target: what kiln generates code for, with the features of the CPU it is built for.

``Target("c")`` (alias ``"cpu"``/``"llvm"``) means C compiled by the system compiler for this CPU
(``-march=native``), with features read from ``/proc/cpuinfo``. ``Target("c",
mcpu="x86-64-v3")`` builds for another CPU: an x86-64 level (``x86-64-v2``/``-v3``/``-v4``) or a
micro-architecture the C compiler knows (``znver3``, ``skylake-avx512``), with the features that
CPU implies (``kiln.target.cpu``), not this machine's. Schedules follow ``features``: the
vector width (512 bits with AVX-512, 256 with AVX2, else 128), fp16/bf16/AMX availability.
An executable records its target and ``required_features``; ``kiln.load`` refuses it on a CPU
that lacks any of them.

Strings: ``Target.create("c")``, ``"native"``, ``"x86-64-v3"`` (a CPU name alone means the C
target for that CPU), ``"c -mcpu=znver3"`` (TVM's spelling; ``llvm -mcpu=...`` too), ``"cuda"``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..ir.dtype import as_dtype
from ..ir.errors import KilnError
from .cpu import NATIVE, host_features, mcpu_features, normalize_mcpu

#: Target kinds, and the spellings that mean one of them.
KINDS = ("c", "cuda", "npu", "opencl")
KIND_ALIASES = {"cpu": "c", "llvm": "c"}

#: This CPU's flags (``/proc/cpuinfo``), the features of ``Target("c")``.
detect_cpu_features = host_features


@dataclass(frozen=True)
class Target:
    kind: str = "c"
    mcpu: str = NATIVE
    #: Instruction sets the schedules may use; by default the ones ``mcpu`` implies (this
    #: CPU's for ``native``). Given explicitly, they steer the schedules only: the C code is
    #: still compiled for ``mcpu``.
    features: frozenset[str] | None = None
    num_threads: int = 0  # 0: the caller's setting (kiln_set_num_threads; default all cores)
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        kind = KIND_ALIASES.get(self.kind, self.kind)
        if kind not in KINDS:
            raise KilnError(f"unknown target kind {self.kind!r} (expected one of "
                            f"{', '.join(repr(k) for k in KINDS)}, or a CPU name such as "
                            f"'x86-64-v3')")
        object.__setattr__(self, "kind", kind)
        mcpu = normalize_mcpu(self.mcpu)
        object.__setattr__(self, "mcpu", mcpu)
        if self.features is None:
            implied = mcpu_features(mcpu) if kind == "c" and mcpu != NATIVE else host_features()
            object.__setattr__(self, "features", implied)
        else:
            object.__setattr__(self, "features", frozenset(self.features))

    @staticmethod
    def create(target: Target | str | None) -> Target:
        """A Target from a Target, None (``Target("c")``) or a string (module docstring)."""
        if target is None:
            return Target("c")
        if isinstance(target, Target):
            return target
        if not isinstance(target, str):
            raise KilnError(f"expected a Target or a target string, got {type(target).__name__}")
        words = target.split()
        if not words:
            raise KilnError("empty target string")
        head, options = words[0], words[1:]
        kind = KIND_ALIASES.get(head, head)
        if kind not in KINDS:
            if options:
                raise KilnError(f"unknown target kind {head!r} in {target!r}")
            return Target("c", mcpu=head)  # a CPU name alone (validated by the compiler)
        kwargs: dict[str, Any] = {}
        for opt in options:
            key, eq, value = opt.lstrip("-").partition("=")
            if key == "mcpu" and eq and value:
                kwargs["mcpu"] = value
            elif key == "num_threads" and eq and value.isdigit():
                kwargs["num_threads"] = int(value)
            else:
                raise KilnError(f"target {target!r}: unknown option {opt!r} (options: "
                                f"-mcpu=NAME, -num_threads=N)")
        return Target(kind, **kwargs)

    @property
    def required_features(self) -> frozenset[str]:
        """The instruction sets the compiled code may use: those ``-march=<mcpu>`` enables.
        A CPU running the code must have all of them (``kiln.load`` checks)."""
        return mcpu_features(self.mcpu) if self.kind == "c" else frozenset()

    @property
    def spec(self) -> str:
        """The string :meth:`create` reads back into an equal target (features aside)."""
        text = self.kind
        if self.mcpu != NATIVE:
            text += f" -mcpu={self.mcpu}"
        if self.num_threads:
            text += f" -num_threads={self.num_threads}"
        return text

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

    def __str__(self) -> str:
        return self.kind
