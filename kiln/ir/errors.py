"""The KilnError hierarchy.

Every error a user can provoke (a bad model, a bad argument, an illegal schedule request, a
failed compile) is a subclass of :class:`KilnError` whose message names the culprit. Internal
invariant violations are :class:`InternalError` so they are never mistaken for user mistakes.
"""

from __future__ import annotations


class KilnError(Exception):
    """Base class of every error kiln raises on purpose."""


class InternalError(KilnError):
    """An invariant of kiln itself was violated (a bug in kiln, not in the user's input)."""


class DTypeError(KilnError, TypeError):
    """A data type string or object could not be understood or is not allowed here."""


class StructInfoError(KilnError):
    """Shape/dtype inference failed for a graph expression (names the op and the argument)."""


class WellFormedError(KilnError):
    """The IR violates a well-formedness rule (scoping, StructInfo, call_tir/callee agreement)."""


class ScheduleError(KilnError):
    """A schedule primitive was asked for an illegal transformation; the message says why."""


class LoweringError(KilnError):
    """A TIR function could not be lowered to codegen-ready form."""


class CodegenError(KilnError):
    """Source code could not be generated for a function."""


class CompileError(KilnError):
    """The native compiler failed; carries its diagnostics and the path of the source."""

    def __init__(self, message: str, source_path: str | None = None, diagnostics: str = ""):
        super().__init__(message)
        self.source_path = source_path
        self.diagnostics = diagnostics


class CompilerNotFoundError(CompileError):
    """No usable C compiler was found (set CC or install gcc)."""


class ArgumentError(KilnError, ValueError):
    """A runtime argument (an input array) has the wrong dtype, rank, shape or device."""


class RuntimeCheckError(ArgumentError):
    """A check inside a compiled kernel failed while it ran: an index value out of range, or
    symbolic dimensions that do not fit together (the message names the model node)."""


class UnsupportedOperatorError(KilnError):
    """A model uses operators kiln does not implement (lists every op type and node name)."""


class ModelFormatError(KilnError):
    """A model or executable file is malformed, truncated or of an unknown version."""
