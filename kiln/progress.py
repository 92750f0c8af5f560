"""Progress of long operations (import, graph passes, kernels scheduled and generated, the C
compile), reported through :mod:`logging`.

Compiling a large model takes seconds to tens of seconds; the stages log under the ``"kiln"``
logger at INFO level, which ``kiln --verbose`` prints (a program can do the same:
``logging.basicConfig(level=logging.INFO)`` or a handler on ``logging.getLogger("kiln")``).
A counting stage ("scheduling kernels: 40/118") logs at most every :data:`INTERVAL` seconds
while it runs and once at its end; nothing is formatted while INFO is off. Work nested in
other work (the small builds FoldConstant makes to evaluate constants) reports nothing: see
:func:`scope`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

LOGGER = logging.getLogger("kiln")
#: Seconds between two messages of one counting stage.
INTERVAL = 0.5


class _Depth(threading.local):
    value = 0
    quiet = 0


_DEPTH = _Depth()


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Mark a unit of work (``kiln.build``); stages of a unit nested in another stay quiet."""
    _DEPTH.value += 1
    try:
        yield
    finally:
        _DEPTH.value -= 1


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Work done on behalf of another step (FoldConstant's little builds, at import time or
    inside a build) reports nothing, at any depth."""
    _DEPTH.quiet += 1
    try:
        yield
    finally:
        _DEPTH.quiet -= 1


def _reporting() -> bool:
    return _DEPTH.value <= 1 and not _DEPTH.quiet


class Stage:
    """One stage of work: ``step(done)`` while counting, ``finish(detail)`` at its end."""

    def __init__(self, name: str, total: int | None = None):
        self.name = name
        self.total = total
        self.start = time.perf_counter()
        self._last = self.start
        self._on = LOGGER.isEnabledFor(logging.INFO) and _reporting()
        if self._on and total is None:
            LOGGER.info("%s ...", name)

    def step(self, done: int) -> None:
        """``done`` of ``total`` items are finished."""
        if not self._on:
            return
        now = time.perf_counter()
        if now - self._last >= INTERVAL and done != self.total:
            self._last = now
            LOGGER.info("%s: %d/%s (%.1f s)", self.name, done,
                        "?" if self.total is None else self.total, now - self.start)

    def finish(self, detail: str = "") -> float:
        """Log the stage's end (with ``detail``) and return its seconds."""
        seconds = time.perf_counter() - self.start
        if self._on:
            count = "" if self.total is None else f"{self.total}/{self.total} "
            LOGGER.info("%s: %sdone in %.2f s%s", self.name, count, seconds,
                        f" ({detail})" if detail else "")
        return seconds


def info(message: str, *args: object) -> None:
    """Log one progress message (unless nested, see :func:`scope`)."""
    if _reporting():
        LOGGER.info(message, *args)
