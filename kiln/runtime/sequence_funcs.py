"""Host functions on sequences and optionals (ONNX ``Sequence*``, ``SplitToSequence``,
``ConcatFromSequence``, ``Optional*``).

A sequence's length is a run-time value (a ``SequenceInsert`` inside a loop, a
``SplitToSequence`` by a run-time split), and its elements may differ in shape, so these are
host steps over the executor's host values (``kiln.runtime.host_values``): a sequence is a
Python list of numpy arrays, an optional None or its value. The functions never modify a list
they are given (a value may be read by several steps): they return new lists holding the same
arrays, which are read only. Positions are ONNX's: negative counts from the back, anything
outside the range is a ``ValueError`` (the executor names the step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .host_funcs import host_func


def _position(pos: np.ndarray | None, length: int, default: int, what: str,
              allow_end: bool = False) -> int:
    """The position tensor ``pos`` (a 0-d or 1-element integer tensor) as an index into a
    sequence of ``length``; ``default`` when absent."""
    if pos is None:
        return default
    arr = np.asarray(pos)
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{what}: position must be one integer, got {arr.dtype} of shape "
                         f"{arr.shape}")
    p = int(arr.reshape(()))
    hi = length if allow_end else length - 1
    if not -length <= p <= hi:
        raise ValueError(f"{what}: position {p} is out of range for a sequence of {length}")
    return p + length if p < 0 else p


@host_func("sequence_construct")
def sequence_construct(*tensors: np.ndarray) -> list[np.ndarray]:
    return list(tensors)


@host_func("sequence_empty")
def sequence_empty(**_type: Any) -> list[np.ndarray]:
    """An empty sequence (the attributes give its tensors' dtype)."""
    return []


@host_func("sequence_insert")
def sequence_insert(seq: list[np.ndarray], value: np.ndarray,
                    position: np.ndarray | None = None) -> list[np.ndarray]:
    if seq and (value.dtype != seq[0].dtype):
        raise ValueError(f"SequenceInsert: a {value.dtype} tensor into a sequence of "
                         f"{seq[0].dtype}")
    p = _position(position, len(seq), len(seq), "SequenceInsert", allow_end=True)
    return [*seq[:p], value, *seq[p:]]


@host_func("sequence_erase")
def sequence_erase(seq: list[np.ndarray], position: np.ndarray | None = None
                   ) -> list[np.ndarray]:
    if not seq:
        raise ValueError("SequenceErase: the sequence is empty")
    p = _position(position, len(seq), len(seq) - 1, "SequenceErase")
    return [*seq[:p], *seq[p + 1:]]


@host_func("sequence_at")
def sequence_at(seq: list[np.ndarray], position: np.ndarray) -> np.ndarray:
    return seq[_position(position, len(seq), 0, "SequenceAt")]


@host_func("sequence_length")
def sequence_length(seq: list[np.ndarray]) -> np.ndarray:
    return np.array(len(seq), dtype=np.int64)


@host_func("split_to_sequence")
def split_to_sequence(x: np.ndarray, split: np.ndarray | None = None, axis: int = 0,
                      keepdims: bool = True) -> list[np.ndarray]:
    """ONNX SplitToSequence: ``split`` absent cuts pieces of 1 (squeezing the axis unless
    ``keepdims``); a scalar ``split`` cuts pieces of that size (the last one shorter); a 1-d
    ``split`` gives the sizes, which must add up to the axis."""
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"SplitToSequence: axis {axis} is out of range for a {x.ndim}-d tensor")
    axis %= x.ndim
    n = x.shape[axis]
    if split is None:
        pieces = np.split(x, n, axis=axis) if n else []
        return [np.squeeze(p, axis) if not keepdims else p for p in pieces]
    s = np.asarray(split)
    if s.dtype.kind not in "iu" or s.ndim > 1:
        raise ValueError(f"SplitToSequence: split must be a scalar or 1-d integer tensor, got "
                         f"{s.dtype} of shape {s.shape}")
    if s.ndim == 0:
        size = int(s)
        if size <= 0:
            raise ValueError(f"SplitToSequence: split must be positive, got {size}")
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
    else:
        sizes = [int(v) for v in s]
        if any(v < 0 for v in sizes) or sum(sizes) != n:
            raise ValueError(f"SplitToSequence: split sizes {sizes} do not add up to the axis "
                             f"length {n}")
    bounds = np.cumsum(sizes)[:-1] if sizes else []
    return [np.ascontiguousarray(p) for p in np.split(x, bounds, axis=axis)]


@host_func("concat_from_sequence")
def concat_from_sequence(seq: list[np.ndarray], axis: int = 0, new_axis: bool = False
                         ) -> np.ndarray:
    """ONNX ConcatFromSequence: concatenate along ``axis``, or stack along a new one."""
    if not seq:
        raise ValueError("ConcatFromSequence: the sequence is empty")
    ndim = seq[0].ndim + (1 if new_axis else 0)
    if not -ndim <= axis < ndim:
        raise ValueError(f"ConcatFromSequence: axis {axis} is out of range for {ndim}-d "
                         "results")
    try:
        out = np.stack(seq, axis=axis) if new_axis else np.concatenate(seq, axis=axis)
    except ValueError as err:
        raise ValueError(f"ConcatFromSequence: {err}") from None
    return out


@host_func("optional_wrap")
def optional_wrap(value: Any) -> Any:
    return value


@host_func("optional_none")
def optional_none(**_type: Any) -> None:
    """An empty optional (the attributes describe the type it would hold)."""
    return None


@host_func("optional_has_element")
def optional_has_element(value: Any) -> np.ndarray:
    return np.array(value is not None)


@host_func("optional_get_element")
def optional_get_element(value: Any) -> Any:
    if value is None:
        raise ValueError("OptionalGetElement: the optional holds no value")
    return value


@host_func("select_value")
def select_value(cond: np.ndarray, a: Any, b: Any) -> Any:
    return a if bool(cond) else b
