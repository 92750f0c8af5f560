"""The KilnError hierarchy.

Every error a user can provoke (a bad model, a bad argument, an illegal schedule request, a
failed compile) is a subclass of :class:`KilnError` whose message names the culprit. Internal
invariant violations are :class:`InternalError` so they are never mistaken for user mistakes.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Iterator
from contextlib import contextmanager


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


class TargetError(KilnError):
    """A target kiln cannot build for yet, or code built for a CPU (or architecture) this
    machine does not have."""


class MemoryLimitError(KilnError):
    """A model needs more memory than the limit allows (the message gives both sizes; the
    limit is ``kiln.runtime.memory_limit()``, set with ``KILN_MEMORY_LIMIT``)."""


def with_prefix(err: KilnError, prefix: str) -> KilnError:
    """A copy of ``err`` (same class and attributes) whose message starts with ``prefix``."""
    new = copy.copy(err)
    new.args = (f"{prefix}: {err}",) + tuple(err.args[1:])
    return new


def _kiln_frame(err: BaseException) -> str:
    """Where in kiln an exception was raised: ``kiln/op/nn.py:123``."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if "/kiln/" in frame.filename:
            return f"kiln/{frame.filename.split('/kiln/')[-1]}:{frame.lineno}"
    return "outside kiln"


def internal_error(where: str, err: BaseException) -> InternalError:
    """The InternalError for an unexpected ``err`` raised while working on ``where``: it names
    the place and the kind of failure, not Python's own wording (the original is chained)."""
    kind = "out of memory" if isinstance(err, MemoryError) else type(err).__name__
    return InternalError(f"{where}: internal error in kiln ({kind} at {_kiln_frame(err)}); "
                         "this is a bug, please report it with the model")


@contextmanager
def error_context(where: str, prefix: bool = True) -> Iterator[None]:
    """Errors escaping the block name ``where`` (an ONNX node, a pass, a kernel): a KilnError
    that does not mention it gets it as a prefix (same class; not with ``prefix=False``), any
    other exception becomes an :class:`InternalError` naming it, the original chained as its
    cause."""
    try:
        yield
    except KilnError as err:
        if prefix and where and where not in str(err):
            raise with_prefix(err, where) from err
        raise
    except Exception as err:  # noqa: BLE001 - exactly what this turns into a KilnError
        raise internal_error(where or "kiln", err) from err
