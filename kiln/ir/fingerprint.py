"""A stable digest of IR: the same bytes in every process, for keys of on-disk caches.

:func:`kiln.ir.node.structural_hash` is built on Python's ``hash``, which is salted per process
(``PYTHONHASHSEED``) and ignores names and spans, so it cannot name a file that another process
reads back. :func:`fingerprint` feeds a sha256 with everything an IR tree holds: node types and
every field, variable *names* as well as their binding order (an executable's inputs are called
by name), source spans (profiles and errors name the model nodes through them), attribute
dataclasses field by field and the bytes of every constant array. Two trees get the same
digest only when they are the same IR, names included.

A value whose only text is Python's default ``repr`` (``<function f at 0x7f...>``) has no
stable content: :func:`fingerprint` raises :class:`NotFingerprintable` naming it, and a cache
built on it should then not be used.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import struct
from typing import Any

import numpy as np

from .dtype import DataType
from .module import IRModule
from .node import Node, node_field_names

__all__ = ["NotFingerprintable", "fingerprint", "fingerprint_array"]

#: Python's default repr of an object names its address: not the same in another process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class NotFingerprintable(Exception):
    """A value in the IR has no stable content to digest (see the module docstring)."""


def fingerprint_array(a: Any) -> bytes:
    """sha256 of an array's dtype, shape and bytes (anything ``np.asarray`` takes). The
    dtype's name is digested besides its code: ml_dtypes' types (bfloat16, the float8s) share
    the codes ``V2``/``V1``; their bytes are read as uint8 (the buffer protocol refuses them).
    An object array (string tensors) is digested by its elements' reprs, not its pointers."""
    arr = np.ascontiguousarray(np.asarray(a))
    h = hashlib.sha256(f"{arr.dtype.str}{arr.dtype.name}{arr.shape}".encode())
    if arr.dtype == object:
        h.update(repr(arr.reshape(-1).tolist()).encode())
    elif arr.size:
        h.update(arr.reshape(-1).view(np.uint8).data)
    return h.digest()


class _Digest:
    """One traversal: node digests memoized by identity (shared subtrees are walked once),
    variables numbered in the order they are first met."""

    def __init__(self) -> None:
        self.memo: dict[int, bytes] = {}
        self.keep: list[Any] = []  # the memo's objects stay alive, so their ids stay unique
        self.var_index: dict[int, int] = {}

    def node(self, x: Node) -> bytes:
        key = id(x)
        got = self.memo.get(key)
        if got is not None:
            return got
        h = hashlib.sha256(type(x).__qualname__.encode())
        if x._is_var:
            idx = self.var_index.get(key)
            if idx is not None:
                h.update(b"ref" + struct.pack("<q", idx))
                return h.digest()
            self.var_index[key] = len(self.var_index)
            h.update(b"def" + struct.pack("<q", self.var_index[key]))
        for name in node_field_names(x):
            h.update(name.encode() + b"=")
            h.update(self.value(getattr(x, name)))
        out = h.digest()
        if not x._is_var:
            self.memo[key] = out
            self.keep.append(x)
        return out

    def value(self, x: Any) -> bytes:
        if isinstance(x, Node):
            return self.node(x)
        if x is None or isinstance(x, (bool, int, str, bytes)):
            return hashlib.sha256(f"{type(x).__name__}:{x!r}".encode()).digest()
        if isinstance(x, float):
            return hashlib.sha256(b"float:" + struct.pack("<d", x)).digest()
        if isinstance(x, np.ndarray):
            return b"nd" + fingerprint_array(x)
        if isinstance(x, np.generic):
            return b"np" + fingerprint_array(x)
        if isinstance(x, IRModule):
            return hashlib.sha256(b"IRModule" + self.value(list(x.items()))
                                  + self.value(x.attrs)).digest()
        if isinstance(x, DataType):
            return hashlib.sha256(f"dtype:{x}".encode()).digest()
        if isinstance(x, enum.Enum):
            return hashlib.sha256(f"enum:{type(x).__qualname__}.{x.name}".encode()).digest()
        if isinstance(x, (list, tuple, frozenset, set, dict)):
            h = hashlib.sha256(type(x).__name__.encode())
            if isinstance(x, dict):
                for k, v in x.items():
                    h.update(self.value(k) + self.value(v))
            elif isinstance(x, (set, frozenset)):
                for part in sorted(self.value(e) for e in x):
                    h.update(part)
            else:
                for e in x:
                    h.update(self.value(e))
            return h.digest()
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            h = hashlib.sha256(f"dc:{type(x).__module__}.{type(x).__qualname__}".encode())
            for f in dataclasses.fields(x):
                h.update(f.name.encode() + b"=" + self.value(getattr(x, f.name)))
            return h.digest()
        if isinstance(x, type):
            return hashlib.sha256(f"type:{x.__module__}.{x.__qualname__}".encode()).digest()
        text = repr(x)
        if _ADDRESS.search(text):
            raise NotFingerprintable(f"{type(x).__qualname__} value {text[:80]} has no stable "
                                     "content")
        return hashlib.sha256(f"{type(x).__qualname__}:{text}".encode()).digest()


def fingerprint(x: Any) -> str:
    """Hex sha256 of an IR tree (an IRModule, a function, an expression...) or of plain data
    (arrays, tuples, dicts of them): see the module docstring. Raises NotFingerprintable."""
    return _Digest().value(x).hex()
