"""kiln's on-disk cache of compiled libraries: where it is, what is in it, and its size cap.

The cache is ``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``. It holds

- ``c/<key>.so`` and ``c/<key>.c``: a library compiled by ``kiln.codegen.c`` and its source
  (``key`` is the hash of the source, flags and compiler, see ``kiln.codegen.c.compiler``), plus
  ``c/<key>.<i>.c`` pieces kept for the diagnostics of a failed parallel compile;
- ``exe-<digest>.so``: the library of a loaded executable file (``kiln.load``), by content hash;
- ``executables/<key>.kiln``: a whole executable (``kiln.save``'s file format) that
  ``kiln.build`` stored under the key of its input model and build configuration, so that
  building the same model again loads it (the second-level cache, ``kiln.build_cache``).

Every file that belongs to one key is one *entry*. Using an entry (a compile that finds its
library, a load that finds its file) sets its files' modification time to now, so the oldest
modification time is the least recently used entry. After kiln adds an entry it evicts the least
recently used ones until the cache is at most ``KILN_CACHE_MAX_SIZE`` bytes (a number with an
optional K, M or G suffix, powers of 1024; default 2G; ``0`` turns the cap off). Evicting a
library another process has loaded is safe: its mapping stays valid. Files still being written
(``*.tmp`` names, build directories) are never counted nor removed.

``kiln cache info`` and ``kiln cache clear`` show and empty it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..ir.errors import KilnError

#: The folder of the cache holding whole executables (``kiln.build_cache``).
EXECUTABLES = "executables"
#: The suffix of an executable file in that folder.
EXECUTABLE_SUFFIX = ".kiln"

#: The cap when ``KILN_CACHE_MAX_SIZE`` is not set.
DEFAULT_MAX_BYTES = 2 * 1024**3
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def cache_dir() -> Path:
    """Where compiled libraries are cached (see the module docstring)."""
    if os.environ.get("KILN_CACHE_DIR"):
        return Path(os.environ["KILN_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "kiln"
    return Path.home() / ".cache" / "kiln"


def parse_size(text: str, what: str = "KILN_CACHE_MAX_SIZE") -> int:
    """Bytes of a size such as ``"500M"``, ``"2G"``, ``"1048576"`` (KilnError if malformed)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, flags=re.I)
    if m is None:
        raise KilnError(f"{what}={text!r} is not a size (expected a number of bytes with an "
                        "optional K, M, G or T suffix, e.g. 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def max_bytes() -> int:
    """The size cap (0: none), from ``KILN_CACHE_MAX_SIZE``."""
    env = os.environ.get("KILN_CACHE_MAX_SIZE", "").strip()
    return parse_size(env) if env else DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class Entry:
    """The files of one cached library: their key, total bytes and last use (a timestamp)."""

    key: str
    files: tuple[Path, ...]
    nbytes: int
    last_used: float


def _key_of(path: Path, root: Path) -> str | None:
    """The entry a cache file belongs to; None for files kiln is still writing or never wrote."""
    name = path.name
    if name.endswith(".tmp") or ".so.tmp" in name:
        return None
    if path.parent == root and name.startswith("exe-") and name.endswith(".so"):
        return name[:-3]
    if path.parent == root / EXECUTABLES:
        m = re.fullmatch(r"([0-9a-f]{64})" + re.escape(EXECUTABLE_SUFFIX), name)
        return f"{EXECUTABLES}/{m.group(1)}" if m else None
    if path.parent == root / "c":
        m = re.fullmatch(r"([0-9a-f]{64})(?:\.\d+)?\.(?:so|c)", name)
        return "c/" + m.group(1) if m else None
    return None


def entries(root: Path | None = None) -> list[Entry]:
    """Every entry of the cache, least recently used first."""
    root = cache_dir() if root is None else root
    groups: dict[str, list[tuple[Path, os.stat_result]]] = {}
    for folder in (root, root / "c", root / EXECUTABLES):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = folder / name
            key = _key_of(path, root)
            if key is None:
                continue
            try:
                st = path.stat()
            except OSError:
                continue  # removed meanwhile
            groups.setdefault(key, []).append((path, st))
    out = [Entry(key, tuple(p for p, _ in files), sum(st.st_size for _, st in files),
                 max(st.st_mtime for _, st in files)) for key, files in groups.items()]
    return sorted(out, key=lambda e: e.last_used)


def touch(*paths: str | Path) -> None:
    """Mark files as just used (their entry becomes the most recently used). Best effort: a
    read-only cache keeps its times."""
    for p in paths:
        with contextlib.suppress(OSError):
            os.utime(p)


def remove(entry: Entry) -> int:
    """Delete an entry's files; the bytes freed."""
    freed = 0
    for p in entry.files:
        with contextlib.suppress(FileNotFoundError):
            size = p.stat().st_size
            p.unlink()
            freed += size
    return freed


def evict(keep: str | Path | None = None, root: Path | None = None) -> int:
    """Remove least recently used entries until the cache fits ``max_bytes()``; never the
    entry holding file ``keep`` (the one just added). The bytes freed. Errors (a read-only
    cache, a file removed by another process meanwhile) are ignored: the cap is a goal."""
    cap = max_bytes()
    if cap <= 0:
        return 0
    root = cache_dir() if root is None else root
    all_entries = entries(root)
    total = sum(e.nbytes for e in all_entries)
    kept = None if keep is None else _key_of(Path(keep), root)
    freed = 0
    for e in all_entries:
        if total <= cap:
            break
        if e.key == kept:
            continue
        with contextlib.suppress(OSError):
            n = remove(e)
            total -= n
            freed += n
    return freed


def clear(root: Path | None = None) -> tuple[int, int]:
    """Remove every entry and leftovers of interrupted builds older than an hour (temporary
    files: ``*.tmp``, ``*.so.tmp*``, ``*.kiln.tmp<pid>``); returns
    (files removed, bytes freed)."""
    root = cache_dir() if root is None else root
    files = freed = 0
    for e in entries(root):
        freed += remove(e)
        files += len(e.files)
    stale = time.time() - 3600
    for folder in (root, root / "c", root / EXECUTABLES):
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                path = folder / name
                with contextlib.suppress(OSError):
                    st = path.lstat()
                    if path.is_dir() and folder == root / "c" and st.st_mtime < stale:
                        shutil.rmtree(path, ignore_errors=True)
                    elif ".tmp" in name and st.st_mtime < stale:
                        path.unlink()
                        files += 1
                        freed += st.st_size
    return files, freed


def info(root: Path | None = None) -> dict[str, object]:
    """A summary: directory, entries, bytes, the cap, oldest and newest use."""
    root = cache_dir() if root is None else root
    es = entries(root)
    return {
        "directory": str(root),
        "entries": len(es),
        "libraries": sum(1 for e in es for p in e.files if p.suffix == ".so"),
        "executables": sum(1 for e in es if e.key.startswith(EXECUTABLES + "/")),
        "bytes": sum(e.nbytes for e in es),
        "max_bytes": max_bytes(),
        "oldest_use": es[0].last_used if es else None,
        "newest_use": es[-1].last_used if es else None,
        "writable": os.access(root, os.W_OK) if root.exists() else None,
    }


def format_bytes(n: int) -> str:
    """``1.5 MiB``: a byte count for people."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
