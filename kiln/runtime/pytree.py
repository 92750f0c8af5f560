"""Nested inputs and outputs of an executable: the call structure a frontend recorded.

A graph function takes and returns flat tensors. A model from a framework with nested
arguments (``torch.export`` programs take tuples, lists and dicts, ``model(x, {"mask": m})``,
and return them) keeps that structure in its executable's call: the frontend stores a *tree*
for the inputs and one for the outputs in the function's attributes (``kiln.input_tree``,
``kiln.output_tree``), the plan keeps them (saved with the executable), and the executable
flattens what the caller passes and rebuilds what it returns.

A tree is JSON data, so that a saved executable needs no framework to be called:

- ``{"kind": "leaf"}``: one tensor, the next graph input (output);
- ``{"kind": "const", "value": v}``: a non-tensor the program was specialized to (an int
  argument of an exported program); the caller must pass ``v`` again, it is not an input;
- ``{"kind": "none"}``: ``None``;
- ``{"kind": "tuple" | "list", "items": [...]}``;
- ``{"kind": "dict", "keys": [...], "items": [...]}`` (string keys, in order).

The input tree of a whole call is ``{"kind": "tuple", "items": [args, kwargs]}`` with ``args``
a tuple and ``kwargs`` a dict, as the positional and keyword arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..ir.errors import ArgumentError


def flatten(value: Any, tree: dict[str, Any], where: str = "input") -> list[Any]:
    """The tensors (leaves) of ``value`` in tree order; ArgumentError naming the path of the
    first place where ``value`` does not have ``tree``'s structure."""
    out: list[Any] = []
    _flatten(value, tree, where, out)
    return out


def _flatten(value: Any, tree: dict[str, Any], where: str, out: list[Any]) -> None:
    kind = tree["kind"]
    if kind == "leaf":
        out.append(value)
    elif kind == "const":
        if value != tree["value"]:
            raise ArgumentError(f"{where}: the program was compiled for the value "
                                f"{tree['value']!r}, got {value!r}")
    elif kind == "none":
        if value is not None:
            raise ArgumentError(f"{where}: expected None, got {type(value).__name__}")
    elif kind in ("tuple", "list"):
        items = tree["items"]
        if not isinstance(value, (tuple, list)) or len(value) != len(items):
            got = (f"{type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list))
                   else type(value).__name__)
            raise ArgumentError(f"{where}: expected a {kind} of {len(items)}, got {got}")
        for i, (v, t) in enumerate(zip(value, items)):
            _flatten(v, t, f"{where}[{i}]", out)
    elif kind == "dict":
        keys = tree["keys"]
        if not isinstance(value, dict) or set(value) != set(keys):
            got = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
            raise ArgumentError(f"{where}: expected a dict with keys {keys}, got {got}")
        for k, t in zip(keys, tree["items"]):
            _flatten(value[k], t, f"{where}[{k!r}]", out)
    else:
        raise ArgumentError(f"{where}: unknown tree node kind {kind!r}")


def unflatten(leaves: Sequence[Any], tree: dict[str, Any]) -> Any:
    """``tree``'s structure with its leaves taken from ``leaves`` in order."""
    it = iter(leaves)
    result = _unflatten(it, tree)
    if next(it, None) is not None:
        raise ArgumentError("more values than the output tree has leaves")
    return result


def _unflatten(it: Any, tree: dict[str, Any]) -> Any:
    kind = tree["kind"]
    if kind == "leaf":
        return next(it)
    if kind == "const":
        return tree["value"]
    if kind == "none":
        return None
    items = [_unflatten(it, t) for t in tree["items"]]
    if kind == "tuple":
        return tuple(items)
    if kind == "list":
        return items
    return dict(zip(tree["keys"], items))


def num_leaves(tree: dict[str, Any]) -> int:
    """How many tensors the tree holds."""
    if tree["kind"] == "leaf":
        return 1
    return sum(num_leaves(t) for t in tree.get("items", ()))


def flatten_call(args: tuple, kwargs: dict[str, Any], tree: dict[str, Any]) -> list[Any]:
    """The graph inputs of a call ``f(*args, **kwargs)`` with input tree ``tree``."""
    args_tree, kwargs_tree = tree["items"]
    leaves = flatten(tuple(args), args_tree, "positional arguments")
    return leaves + flatten(dict(kwargs), kwargs_tree, "keyword arguments")
