"""CPU feature sets: what this CPU has, and what code built for a named CPU needs.

kiln compiles C with ``-march=<mcpu>``: ``native`` (the default: this CPU), an x86-64
micro-architecture level (``x86-64-v2``: SSE4.2; ``-v3``: AVX2, FMA, F16C, BMI; ``-v4``:
AVX-512 F/BW/CD/DQ/VL) or any CPU name the C compiler knows (``znver3``, ``skylake-avx512``,
``sapphirerapids``...). The compiler itself is asked which instruction sets a name enables (its
predefined macros, ``-march=X -E -dM``), so the list of names and their features is always the
one of the compiler that builds the code. Features are spelled as Linux spells them in
``/proc/cpuinfo`` (``avx2``, ``avx512f``, ``amx_tile``), so that the features an executable
needs can be checked against the CPU that loads it.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess

from ..ir.errors import KilnError
from .c_compiler import find_compiler

#: The CPU name meaning "the CPU kiln runs on".
NATIVE = "native"

#: GCC/Clang predefined macro (without its underscores) -> the /proc/cpuinfo flag of the same
#: instruction set. Macros without an entry (tuning-only or system instructions) are not
#: required of the CPU that runs the code: generated kernels use none of them.
X86_MACRO_FEATURES: dict[str, str] = {
    "SSE": "sse", "SSE2": "sse2", "SSE3": "pni", "SSSE3": "ssse3", "SSE4_1": "sse4_1",
    "SSE4_2": "sse4_2", "SSE4A": "sse4a", "POPCNT": "popcnt", "LZCNT": "abm", "ABM": "abm",
    "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "FMA4": "fma4", "F16C": "f16c", "BMI": "bmi1",
    "BMI2": "bmi2", "MOVBE": "movbe", "AES": "aes", "PCLMUL": "pclmulqdq", "SHA": "sha_ni",
    "ADX": "adx", "GFNI": "gfni", "VAES": "vaes", "VPCLMULQDQ": "vpclmulqdq",
    "AVX512F": "avx512f", "AVX512CD": "avx512cd", "AVX512VL": "avx512vl",
    "AVX512BW": "avx512bw", "AVX512DQ": "avx512dq", "AVX512IFMA": "avx512ifma",
    "AVX512VBMI": "avx512vbmi", "AVX512VBMI2": "avx512_vbmi2", "AVX512VNNI": "avx512_vnni",
    "AVX512BITALG": "avx512_bitalg", "AVX512VPOPCNTDQ": "avx512_vpopcntdq",
    "AVX512BF16": "avx512_bf16", "AVX512FP16": "avx512fp16", "AVX512ER": "avx512er",
    "AVX512PF": "avx512pf", "AVX5124FMAPS": "avx512_4fmaps", "AVX5124VNNIW": "avx512_4vnniw",
    "AVXVNNI": "avx_vnni", "AMX_TILE": "amx_tile", "AMX_BF16": "amx_bf16",
    "AMX_INT8": "amx_int8", "AMX_FP16": "amx_fp16",
}


@functools.lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """The flags of this CPU (``/proc/cpuinfo``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_machine() -> str:
    """This machine's architecture as executables record it (``x86_64``, ``aarch64``)."""
    return {"AMD64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())


def normalize_mcpu(mcpu: str) -> str:
    """``mcpu`` as kiln keeps it: stripped, lower case (GCC's CPU names are)."""
    if not isinstance(mcpu, str) or not mcpu.strip():
        raise KilnError(f"target CPU must be a non-empty string, got {mcpu!r}")
    return mcpu.strip().lower()


def mcpu_features(mcpu: str) -> frozenset[str]:
    """The instruction sets code compiled with ``-march=<mcpu>`` may use, as /proc/cpuinfo
    flags (see the module docstring). Raises KilnError listing the valid names when the C
    compiler does not know ``mcpu``."""
    return _probe(normalize_mcpu(mcpu))


@functools.lru_cache(maxsize=32)
def _probe(mcpu: str) -> frozenset[str]:
    if host_machine() != "x86_64":
        # the instruction-set table is x86's; elsewhere the architecture alone is recorded
        if mcpu != NATIVE:
            raise KilnError(f"target CPU {mcpu!r}: naming a CPU is supported on x86-64 only "
                            f"(this machine is {host_machine()}); use 'native'")
        return frozenset()
    cc = find_compiler()
    cmd = [*cc.command, f"-march={mcpu}", "-E", "-dM", "-x", "c", os.devnull]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError) as err:
        raise KilnError(f"cannot ask the C compiler about CPU {mcpu!r}: {err}") from err
    if out.returncode != 0:
        raise KilnError(_unknown_cpu_message(mcpu, out.stderr))
    macros = set(re.findall(r"^#define __(\w+?)__ 1$", out.stdout, flags=re.M))
    return frozenset(X86_MACRO_FEATURES[m] for m in macros if m in X86_MACRO_FEATURES)


def _unknown_cpu_message(mcpu: str, stderr: str) -> str:
    listed = re.search(r"valid arguments to '-march=' switch are: ([^;\n]*)", stderr)
    if listed is None:
        detail = stderr.strip().splitlines()[0] if stderr.strip() else "no diagnostics"
        return f"the C compiler does not accept target CPU {mcpu!r} ({detail})"
    names = listed.group(1).split()
    levels = [n for n in names if n.startswith("x86-64")]
    others = [n for n in names if n not in levels]
    return (f"unknown target CPU {mcpu!r}; the C compiler knows: "
            f"{', '.join(levels + others)}")
