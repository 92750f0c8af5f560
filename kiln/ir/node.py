"""Node base class with structural equality and hashing.

IR nodes are immutable dataclasses (``@node``). ``==`` on nodes is identity (variables are used
as dictionary keys); structural comparison is :func:`structural_equal`, which compares two trees
field by field and treats *variables up to consistent renaming*: the first time a variable-like
node (``_is_var = True``: TIR vars, buffers, graph vars) is met on each side the two are paired,
provided their type fields agree, and from then on each may only match its partner. Variable
names and source spans never matter. :func:`structural_hash` is consistent with it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, ClassVar

import numpy as np

from .dtype import DataType

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names_of(cls: type) -> tuple[str, ...]:
    """Field names of a node class, computed once per class: ``dataclasses.fields`` rebuilds its
    tuple on every call, and the generic visitors ask for every node they walk (it was the
    largest single cost of lowering a model)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def node_field_names(n: Node) -> tuple[str, ...]:
    """Field names of a node. Use this, not ``n.fields()``, in generic code: a node may have a
    field called ``fields`` (graph ``Tuple``, ``TupleStructInfo``) that hides the method."""
    return field_names_of(type(n))


class Node:
    """Base of all IR nodes.

    Class attributes:
      ``_is_var``: instances are compared up to renaming (see module docstring).
      ``_type_fields``: for var-like nodes, the fields that must agree when pairing two vars.
      ``_ignore_fields``: fields never compared (names, spans).
    """

    __slots__ = ()
    _is_var: ClassVar[bool] = False
    _type_fields: ClassVar[tuple[str, ...]] = ()
    _ignore_fields: ClassVar[tuple[str, ...]] = ("span",)

    def fields(self) -> tuple[str, ...]:
        return node_field_names(self)

    def replace(self, **changes: Any):
        """A copy of this node with some fields changed (IR is immutable)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def same_as(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        try:
            return self.script()
        except Exception:  # noqa: BLE001 - repr must never fail
            return f"<{type(self).__name__} at {id(self):#x}>"

    __str__ = __repr__

    def script(self) -> str:
        """Readable text of this node (each IR layer registers its printer)."""
        printer = _PRINTERS.get(_layer_of(type(self)))
        if printer is None:
            return f"<{type(self).__name__}>"
        return printer(self)


_PRINTERS: dict[str, Any] = {}


def _layer_of(cls: type) -> str:
    mod = cls.__module__
    for layer in ("kiln.tir", "kiln.graph", "kiln.te"):
        if mod.startswith(layer):
            return layer
    return mod


def register_printer(layer: str, printer) -> None:
    """Register the text printer of an IR layer ('kiln.tir', 'kiln.graph', ...)."""
    _PRINTERS[layer] = printer


def printer_of(layer: str) -> Any:
    """The text printer registered for an IR layer, or None."""
    return _PRINTERS.get(layer)


def node(cls=None, /, **kwargs):
    """Decorator: make ``cls`` an immutable IR node (a frozen dataclass with identity ``==``)."""

    def wrap(c):
        return dataclasses.dataclass(frozen=True, eq=False, repr=False, **kwargs)(c)

    return wrap if cls is None else wrap(cls)


def set_field(obj: Node, name: str, value: Any) -> None:
    """Set a field while constructing a frozen node (for use in ``__post_init__`` only)."""
    object.__setattr__(obj, name, value)


# ---------------------------------------------------------------------------------------------
# structural equality
# ---------------------------------------------------------------------------------------------
class StructuralMismatch(Exception):
    """Raised internally with the path to the first difference."""

    def __init__(self, path: str, lhs: Any, rhs: Any, reason: str = ""):
        self.path, self.lhs, self.rhs, self.reason = path, lhs, rhs, reason
        super().__init__(path)


class _Equal:
    def __init__(self, map_free_vars: bool):
        self.map_free_vars = map_free_vars
        self.lmap: dict[int, Any] = {}
        self.rmap: dict[int, Any] = {}

    def eq(self, a: Any, b: Any, path: str) -> None:
        if a is b:
            if isinstance(a, Node) and a._is_var:
                # The same variable on both sides: fine unless already paired elsewhere.
                pa, pb = self.lmap.get(id(a)), self.rmap.get(id(b))
                if (pa is not None and pa is not b) or (pb is not None and pb is not a):
                    raise StructuralMismatch(path, a, b, "variable paired with another")
                self.lmap[id(a)], self.rmap[id(b)] = b, a
            return
        if isinstance(a, Node) or isinstance(b, Node):
            if type(a) is not type(b):
                raise StructuralMismatch(path, a, b, f"{type(a).__name__} vs {type(b).__name__}")
            if a._is_var:
                self._eq_var(a, b, path)
                return
            for name in node_field_names(a):
                if name in a._ignore_fields:
                    continue
                self.eq(getattr(a, name), getattr(b, name), f"{path}.{name}")
            return
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                raise StructuralMismatch(path, a, b, f"length {len(a)} vs {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                self.eq(x, y, f"{path}[{i}]")
            return
        if isinstance(a, dict) and isinstance(b, dict):
            if len(a) != len(b):
                raise StructuralMismatch(path, a, b, "dict size")
            for i, ((ka, va), (kb, vb)) in enumerate(zip(a.items(), b.items())):
                self.eq(ka, kb, f"{path}.key{i}")
                self.eq(va, vb, f"{path}[{ka!r}]")
            return
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                raise StructuralMismatch(path, a, b, "array vs non-array")
            if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(
                a, b, equal_nan=a.dtype.kind == "f"
            ):
                raise StructuralMismatch(path, a, b, "array contents")
            return
        if isinstance(a, float) and isinstance(b, float):
            if a == b or (math.isnan(a) and math.isnan(b)):
                return
            raise StructuralMismatch(path, a, b)
        if type(a) is not type(b) and not (isinstance(a, DataType) or isinstance(b, DataType)):
            if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
                raise StructuralMismatch(path, a, b, "type")
        if a != b:
            raise StructuralMismatch(path, a, b)

    def _eq_var(self, a: Node, b: Node, path: str) -> None:
        pa, pb = self.lmap.get(id(a)), self.rmap.get(id(b))
        if pa is not None or pb is not None:
            if pa is b and pb is a:
                return
            raise StructuralMismatch(path, a, b, "variables bound differently")
        if not self.map_free_vars:
            raise StructuralMismatch(path, a, b, "different free variables")
        # Pair first (so recursive references inside type fields are consistent), then check.
        self.lmap[id(a)], self.rmap[id(b)] = b, a
        for name in a._type_fields:
            self.eq(getattr(a, name), getattr(b, name), f"{path}.{name}")


def structural_equal(a: Any, b: Any, map_free_vars: bool = True) -> bool:
    """True when ``a`` and ``b`` are the same IR up to consistent renaming of variables."""
    try:
        _Equal(map_free_vars).eq(a, b, "root")
    except StructuralMismatch:
        return False
    return True


def assert_structural_equal(a: Any, b: Any, map_free_vars: bool = True) -> None:
    """Raise AssertionError naming the path of the first difference and showing both sides."""
    try:
        _Equal(map_free_vars).eq(a, b, "root")
    except StructuralMismatch as m:
        raise AssertionError(
            f"structural mismatch at {m.path} ({m.reason}):\n  lhs: {_short(m.lhs)}\n"
            f"  rhs: {_short(m.rhs)}\n--- lhs ---\n{a}\n--- rhs ---\n{b}"
        ) from None


def _short(x: Any) -> str:
    text = str(x)
    return text if len(text) < 300 else text[:300] + "..."


# ---------------------------------------------------------------------------------------------
# structural hash
# ---------------------------------------------------------------------------------------------
class _Hasher:
    def __init__(self):
        self.var_index: dict[int, int] = {}

    def h(self, x: Any) -> int:
        if isinstance(x, Node):
            if x._is_var:
                idx = self.var_index.get(id(x))
                if idx is not None:
                    return hash(("var-ref", idx))
                self.var_index[id(x)] = idx = len(self.var_index)
                return hash(
                    ("var", type(x).__name__, tuple(self.h(getattr(x, f)) for f in x._type_fields))
                )
            return hash(
                (
                    type(x).__name__,
                    tuple(
                        self.h(getattr(x, f))
                        for f in node_field_names(x)
                        if f not in x._ignore_fields
                    ),
                )
            )
        if isinstance(x, (list, tuple)):
            return hash(("seq", tuple(self.h(e) for e in x)))
        if isinstance(x, dict):
            return hash(("map", tuple((self.h(k), self.h(v)) for k, v in x.items())))
        if isinstance(x, np.ndarray):
            return hash(("nd", x.shape, str(x.dtype), x.tobytes()))
        if isinstance(x, float) and math.isnan(x):
            return hash("nan")
        try:
            return hash(x)
        except TypeError:
            return hash(repr(x))


def structural_hash(x: Any) -> int:
    """A hash consistent with :func:`structural_equal` (variables hashed by binding order)."""
    return _Hasher().h(x)


def _stable(value: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "big")


class _StableHasher(_Hasher):
    """:class:`_Hasher` with a digest of the text instead of Python's ``hash`` (which differs
    between processes for strings)."""

    def h(self, x: Any) -> int:
        if isinstance(x, Node) or isinstance(x, (list, tuple, dict, np.ndarray)):
            return _stable(self._parts(x))
        if isinstance(x, float) and math.isnan(x):
            return _stable("nan")
        return _stable((type(x).__name__, repr(x)))

    def _parts(self, x: Any) -> Any:
        if isinstance(x, Node):
            if x._is_var:
                idx = self.var_index.get(id(x))
                if idx is not None:
                    return ("var-ref", idx)
                self.var_index[id(x)] = idx = len(self.var_index)
                return ("var", type(x).__name__, tuple(self.h(getattr(x, f))
                                                       for f in x._type_fields))
            return (type(x).__name__, tuple(self.h(getattr(x, f)) for f in node_field_names(x)
                                            if f not in x._ignore_fields))
        if isinstance(x, (list, tuple)):
            return ("seq", tuple(self.h(e) for e in x))
        if isinstance(x, dict):
            return ("map", tuple((self.h(k), self.h(v)) for k, v in x.items()))
        return ("nd", x.shape, str(x.dtype), hashlib.blake2b(x.tobytes()).hexdigest())


def stable_structural_hash(x: Any) -> str:
    """:func:`structural_hash` that is the same in every process and on every run (a hex
    digest): the key of a kernel in a tuning database."""
    return f"{_StableHasher().h(x):016x}"
