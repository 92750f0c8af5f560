"""Host shape functions: run-time shapes computed from tensor values.

A graph value whose shape depends on a tensor's *values* (ONNX Reshape with a shape computed
by the model, Expand, Range, ...) is written in the graph IR as TVM Relax does::

    s = call(ExternFunc("kiln.shape_func.reshape"), ShapeExpr(x.shape), shape_t, PrimValue(0),
             sinfo_args=ShapeStructInfo(ndim=2))        # a shape value of 2 unknown dims
    s1 = match_cast(s, ShapeStructInfo((d0, d1)))      # binds fresh symbolic dims d0, d1
    y = dynamic.reshape(x, shape=(d0, d1))             # kernels compiled with symbolic dims

The executor runs the shape function on the host once ``shape_t`` exists (it is small: a shape
or a few scalars), binds ``d0``/``d1`` and allocates later tensors from their encoded shapes.
Each function here takes its arguments in graph order -- numpy arrays for tensors, tuples of
ints for ``ShapeExpr`` arguments, ints for ``PrimValue`` ones -- and returns the shape as a
tuple of ints, raising ``ValueError`` with a plain message for values the operator rejects (the
executor names the step). Functions are looked up by name, so executables that use them stay
loadable without the compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: Prefix of the ``ExternFunc`` symbol of a shape function in the graph IR.
PREFIX = "kiln.shape_func."

SHAPE_FUNCS: dict[str, Callable[..., tuple[int, ...]]] = {}


def shape_func(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        SHAPE_FUNCS[name] = fn
        return fn

    return register


def _ints(arr: Any) -> list[int]:
    return [int(v) for v in np.asarray(arr).reshape(-1)]


@shape_func("values")
def values(t: np.ndarray) -> tuple[int, ...]:
    """The values of a 1-d int tensor as a shape (ConstantOfShape, Tile's repeats)."""
    out = tuple(_ints(t))
    if any(v < 0 for v in out):
        raise ValueError(f"negative dimension in {list(out)}")
    return out


@shape_func("reshape")
def reshape(in_shape: Sequence[int], target: np.ndarray, allowzero: int) -> tuple[int, ...]:
    """ONNX Reshape: 0 copies the input dimension (unless ``allowzero``), -1 is inferred."""
    dims = _ints(target)
    out = [in_shape[i] if (d == 0 and not allowzero and i < len(in_shape)) else d
           for i, d in enumerate(dims)]
    if sum(1 for d in out if d == -1) > 1 or any(d < -1 for d in out):
        raise ValueError(f"bad target shape {dims}")
    total = int(np.prod(in_shape, dtype=np.int64))
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {tuple(in_shape)} into {dims}")
        out[out.index(-1)] = total // known
    if int(np.prod(out, dtype=np.int64)) != total:
        raise ValueError(f"cannot reshape {tuple(in_shape)} ({total} elements) into {dims}")
    return tuple(out)


@shape_func("expand")
def expand(in_shape: Sequence[int], target: np.ndarray) -> tuple[int, ...]:
    """ONNX Expand: numpy broadcasting of the input shape with the target shape."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(tuple(in_shape), tuple(_ints(target))))
    except ValueError:
        raise ValueError(f"cannot expand {tuple(in_shape)} to {_ints(target)}") from None


@shape_func("range")
def range_(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> tuple[int, ...]:
    """ONNX Range: ``max(ceil((limit - start) / delta), 0)`` elements."""
    s, lim, d = (np.asarray(v).reshape(()).item() for v in (start, limit, delta))
    if d == 0:
        raise ValueError("delta must not be 0")
    return (max(int(np.ceil((lim - s) / d)), 0),)


def slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """(normalized start, length) of ``x[start:end:step]`` on an axis of ``dim`` (ONNX rules;
    the kernel ``dynamic.strided_slice`` normalizes ``start`` the same way)."""
    if step == 0:
        raise ValueError("slice step must not be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return start, max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, max(0, -(-(start - end) // -step))


@shape_func("slice")
def slice_(in_shape: Sequence[int], starts: np.ndarray, ends: np.ndarray, axes: Sequence[int],
           steps: np.ndarray) -> tuple[int, ...]:
    """ONNX Slice output shape; ``axes`` are normalized (constant), ``steps`` may be empty."""
    st, en, sp = _ints(starts), _ints(ends), _ints(steps) or [1] * len(axes)
    if not len(st) == len(en) == len(sp) == len(axes):
        raise ValueError(f"starts {st}, ends {en}, steps {sp} and axes {list(axes)} differ in "
                         "length")
    out = list(in_shape)
    for a, s, e, k in zip(axes, st, en, sp):
        out[a] = slice_bounds(int(in_shape[a]), s, e, k)[1]
    return tuple(out)


@shape_func("pad")
def pad(in_shape: Sequence[int], pads: np.ndarray, axes: Sequence[int]) -> tuple[int, ...]:
    """ONNX Pad output shape (``pads``: all begins then all ends, for ``axes``)."""
    p = _ints(pads)
    if len(p) != 2 * len(axes):
        raise ValueError(f"pads {p} must have 2 entries per padded axis ({len(axes)})")
    out = list(in_shape)
    for k, a in enumerate(axes):
        out[a] = in_shape[a] + p[k] + p[k + len(axes)]
        if out[a] < 0:
            raise ValueError(f"pads {p} remove more than axis {a} holds")
    return tuple(out)


def _norm_axes(axes: Any, rank: int) -> list[int]:
    out = [a + rank if a < 0 else a for a in _ints(axes)]
    if any(not 0 <= a < rank for a in out) or len(set(out)) != len(out):
        raise ValueError(f"bad axes {_ints(axes)} for rank {rank}")
    return out


@shape_func("unsqueeze")
def unsqueeze(in_shape: Sequence[int], axes: np.ndarray) -> tuple[int, ...]:
    """ONNX Unsqueeze: a 1 at each of ``axes`` (of the output rank)."""
    rank = len(in_shape) + np.asarray(axes).size
    ones = set(_norm_axes(axes, rank))
    it = iter(in_shape)
    return tuple(1 if i in ones else int(next(it)) for i in range(rank))


@shape_func("squeeze")
def squeeze(in_shape: Sequence[int], axes: np.ndarray) -> tuple[int, ...]:
    """ONNX Squeeze: drop ``axes``, each of which must have length 1."""
    drop = set(_norm_axes(axes, len(in_shape)))
    if any(in_shape[a] != 1 for a in drop):
        raise ValueError(f"cannot squeeze axes {sorted(drop)} of {tuple(in_shape)}")
    return tuple(int(d) for i, d in enumerate(in_shape) if i not in drop)


@shape_func("split")
def split(in_shape: Sequence[int], sizes: np.ndarray, axis: int) -> tuple[int, ...]:
    """ONNX Split sizes, checked to be non-negative and to cover the axis exactly."""
    out = tuple(_ints(sizes))
    if any(v < 0 for v in out) or sum(out) != in_shape[axis]:
        raise ValueError(f"split sizes {list(out)} do not add up to axis {axis} of "
                         f"{tuple(in_shape)}")
    return out


#: ONNX Resize keep_aspect_ratio_policy values, by the int the graph passes (a PrimValue).
RESIZE_POLICIES = ("stretch", "not_larger", "not_smaller")


def resize_factors(in_shape: Sequence[int], given: np.ndarray, axes: Sequence[int],
                   use_sizes: int, policy: int) -> tuple[list[float], list[int]]:
    """(scale, output length) of each of ``axes`` for ONNX Resize given scales or sizes, as the
    reference computes them: ``floor(in * scale)``; sizes give ``scale = out / in``, or with
    ``keep_aspect_ratio_policy`` one scale (the min or max) and ``round_half_up(scale * in)``."""
    vals = np.asarray(given).reshape(-1)
    if vals.size != len(axes):
        raise ValueError(f"{'sizes' if use_sizes else 'scales'} has {vals.size} entries for "
                         f"{len(axes)} resized axes")
    dims = [int(in_shape[a]) for a in axes]
    if not use_sizes:
        scales = [float(v) for v in vals.astype(np.float64)]
        if any(not 0 < s < float("inf") for s in scales):
            raise ValueError(f"scales must be positive and finite, got {scales}")
        lengths = [s * d for s, d in zip(scales, dims)]
        if any(v >= 2.0 ** 63 for v in lengths):
            raise ValueError(f"scales {scales} make output lengths {lengths} of input lengths "
                             f"{dims}, past any tensor's size")
        return scales, [int(v) for v in lengths]
    out = [int(v) for v in vals]
    if any(v <= 0 for v in out) or any(d == 0 for d in dims):
        raise ValueError(f"sizes {out} must be positive for input lengths {dims}")
    scales = [o / d for o, d in zip(out, dims)]
    if RESIZE_POLICIES[policy] != "stretch":
        s = min(scales) if RESIZE_POLICIES[policy] == "not_larger" else max(scales)
        scales, out = [s] * len(dims), [int(s * d + 0.5) for d in dims]
    return scales, out


@shape_func("resize")
def resize(in_shape: Sequence[int], given: np.ndarray, axes: Sequence[int], use_sizes: int,
           policy: int) -> tuple[int, ...]:
    """ONNX Resize output shape (``given``: the scales or, with ``use_sizes``, the sizes of
    ``axes``; ``policy`` indexes ``RESIZE_POLICIES``)."""
    _, lengths = resize_factors(in_shape, given, axes, use_sizes, policy)
    if any(v <= 0 for v in lengths):
        raise ValueError(f"resized lengths {lengths} of axes {list(axes)} must be positive "
                         f"(input shape {tuple(in_shape)})")
    out = list(in_shape)
    for a, v in zip(axes, lengths):
        out[a] = v
    return tuple(out)



@shape_func("resize_taps")
def resize_taps(in_shape: Sequence[int], given: np.ndarray, axes: Sequence[int], use_sizes: int,
                policy: int, support: int) -> tuple[int, ...]:
    """Tap count of each of ``axes`` for an antialiased Resize: ``2 - 2 * start`` with ``start
    = floor(-support / min(scale, 1)) + 1`` (support 1: linear, 2: cubic), as the reference."""
    scales, _ = resize_factors(in_shape, given, axes, use_sizes, policy)
    return tuple(2 - 2 * (int(np.floor(-support / min(s, 1.0))) + 1) for s in scales)

@shape_func("col2im")
def col2im(in_shape: Sequence[int], image: np.ndarray, block: np.ndarray,
           strides: Sequence[int], dilations: Sequence[int],
           pads: Sequence[int]) -> tuple[int, ...]:
    """ONNX Col2Im output (N, C, *image_shape), checking that the (N, C*K, L) input holds
    ``K = prod(block_shape)`` column channels per channel and one column per block position."""
    img, blk = _ints(image), _ints(block)
    nsp = len(img)
    if len(blk) != nsp or any(v <= 0 for v in img + blk):
        raise ValueError(f"image_shape {img} and block_shape {blk} must be positive and of "
                         "equal length")
    counts = [(img[i] + pads[i] + pads[nsp + i] - (blk[i] - 1) * dilations[i] - 1)
              // strides[i] + 1 for i in range(nsp)]
    k = int(np.prod(blk, dtype=np.int64))
    n, ck, length = (int(v) for v in in_shape)
    if ck % k or any(c <= 0 for c in counts) or length != int(np.prod(counts, dtype=np.int64)):
        raise ValueError(f"input {tuple(in_shape)} does not hold {counts} blocks of {blk} per "
                         f"channel for image_shape {img}")
    return (n, ck // k, *img)


def run(name: str, inputs: Sequence[Any]) -> tuple[int, ...]:
    """Run shape function ``name`` (KeyError when the runtime does not know it)."""
    return tuple(int(v) for v in SHAPE_FUNCS[name](*inputs))
