"""The system C compiler: which one kiln uses (``$CC``, else gcc, else cc) and its version.

It lives with the targets, below code generation, because describing a CPU target asks the
compiler too (which instruction-set extensions ``-march=<cpu>`` implies, :mod:`.cpu`), and
the C code generator compiles with it (:mod:`kiln.codegen.c.compiler`).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from ..ir.errors import CompilerNotFoundError

__all__ = ["Compiler", "find_compiler"]


@dataclass(frozen=True)
class Compiler:
    """A usable C compiler: the command (argv prefix) and its version text."""

    command: tuple[str, ...]
    version: str


def find_compiler() -> Compiler:
    """The C compiler to use (``$CC`` or gcc/cc); raises CompilerNotFoundError."""
    env = os.environ.get("CC", "").strip()
    if env:
        argv = shlex.split(env)
        exe = shutil.which(argv[0])
        if exe is None:
            raise CompilerNotFoundError(
                f"the C compiler CC={env!r} was not found; set CC to an installed C compiler "
                f"(e.g. gcc) or unset it"
            )
        return Compiler((exe, *argv[1:]), _version((exe, *argv[1:])))
    for candidate in ("gcc", "cc"):
        exe = shutil.which(candidate)
        if exe is not None:
            return Compiler((exe,), _version((exe,)))
    raise CompilerNotFoundError(
        "no C compiler found: install gcc (e.g. `apt install gcc`) or set CC to a C compiler"
    )


@functools.lru_cache(maxsize=8)
def _version(command: tuple[str, ...]) -> str:
    try:
        out = subprocess.run([*command, "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        raise CompilerNotFoundError(f"cannot run the C compiler {command[0]}: {err}") from err
    text = (out.stdout or out.stderr).strip()
    if out.returncode != 0 or not text:
        raise CompilerNotFoundError(
            f"the C compiler {command[0]} does not work (`--version` exited with "
            f"{out.returncode}): {out.stderr.strip()[:500]}"
        )
    return text.splitlines()[0]
