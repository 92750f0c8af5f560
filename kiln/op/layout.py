"""Tensor layouts and the ``layout_transform`` operator.

A layout names the axes of a tensor in TVM's notation: an upper-case letter is a *primal* axis
(``N``, ``C``, ``H``, ``W`` for images; ``O``, ``I`` for convolution weights), and a lower-case
letter with a factor is a *sub-axis* split off the primal axis of the same letter. ``NCHW8c``
is an image whose channels are stored in blocks of 8: shape ``[N, C/8, H, W, 8]``, element
``(n, c, h, w)`` at ``[n, c // 8, h, w, c % 8]``. ``OIHW8i8o`` is a convolution weight blocked
in both channel dimensions.

Layouts are plain strings wherever they appear in IR (op attributes), so they print and compare
simply; :class:`Layout` is the parsed form. Two layouts with the same primal axes describe the
same logical tensor, so a value can be moved between them (``layout_transform``) and transforms
compose: ``A -> B -> C`` is ``A -> C``. Layout rewriting passes (ConvertLayout, AlterOpLayout)
rely on that.

``layout_transform`` requires every split to be exact (the primal axis length divisible by the
factor): padding a channel count up to the block size would change what the following ops see,
so it is refused with a StructInfoError naming the axis instead.

:class:`LayoutRewrite` is what an operator's per-target ``alter_layout`` hook (declared with the
op, see ``kiln.op.nn.conv2d``) returns to ask for its inputs in other layouts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import te, tir
from ..graph.struct_info import TensorStructInfo
from ..ir.dtype import DataType
from ..ir.errors import KilnError, StructInfoError
from .linalg import const_int, fmt_dim, fmt_shape, simplify, tensor_arg
from .registry import MixedPrecision, OpPattern, register_op

__all__ = ["Layout", "LayoutRewrite", "layout_transform"]

I64 = DataType("int64")
_TOKEN = re.compile(r"(\d*)([A-Za-z])")


class Layout:
    """A parsed layout string (see the module docstring).

    ``axes`` is a tuple of ``(letter, factor)`` in storage order; ``factor`` is None for
    primal axes and the block size for sub-axes.
    """

    __slots__ = ("axes", "name")

    def __init__(self, name: str | Layout):
        if isinstance(name, Layout):
            name = name.name
        if not isinstance(name, str) or not name:
            raise KilnError(f"a layout must be a non-empty string like 'NCHW', got {name!r}")
        axes: list[tuple[str, int | None]] = []
        pos = 0
        for m in _TOKEN.finditer(name):
            if m.start() != pos:
                break
            pos = m.end()
            digits, letter = m.groups()
            if letter.isupper():
                if digits:
                    raise KilnError(
                        f"layout {name!r}: primal axis {letter!r} cannot have a factor "
                        f"({digits}); sub-axes are lower case, as in 'NCHW8c'"
                    )
                axes.append((letter, None))
            else:
                if not digits or int(digits) < 1:
                    raise KilnError(
                        f"layout {name!r}: sub-axis {letter!r} needs a positive factor, as in "
                        f"'NCHW8c'"
                    )
                axes.append((letter, int(digits)))
        if pos != len(name):
            raise KilnError(f"layout {name!r}: cannot parse {name[pos:]!r} (expected letters "
                            f"with optional factors, like 'NCHW8c')")
        letters = [a for a, _ in axes]
        for a in letters:
            if letters.count(a) > 1:
                raise KilnError(f"layout {name!r}: axis {a!r} appears more than once")
            if a.islower() and a.upper() not in letters:
                raise KilnError(f"layout {name!r}: sub-axis {a!r} has no primal axis "
                                f"{a.upper()!r}")
        self.axes: tuple[tuple[str, int | None], ...] = tuple(axes)
        self.name = name

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @property
    def primal(self) -> str:
        """The primal axes in storage order (``"NCHW"`` for ``NCHW8c``)."""
        return "".join(a for a, _ in self.axes if a.isupper())

    def index(self, letter: str) -> int:
        """Position of axis ``letter`` (primal or sub-axis), or -1."""
        for i, (a, _) in enumerate(self.axes):
            if a == letter:
                return i
        return -1

    def factor(self, primal: str) -> int | None:
        """The block size of ``primal``'s sub-axis (None when it is not split)."""
        for a, f in self.axes:
            if a == primal.lower():
                return f
        return None

    def is_split(self) -> bool:
        return any(f is not None for _, f in self.axes)

    def same_axes(self, other: Layout) -> bool:
        """Whether both describe the same logical tensor (same primal axes)."""
        return sorted(self.primal) == sorted(other.primal)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Layout({self.name!r})"


def as_layout(value: Any, op: str = "layout", what: str = "layout") -> Layout:
    """``value`` parsed as a Layout; errors name ``op`` and ``what``."""
    try:
        return Layout(value)
    except KilnError as err:
        raise KilnError(f"{op}: {what}: {err}") from None


def check_transform(src: Layout, dst: Layout, op: str = "layout_transform") -> None:
    """Raise KilnError unless ``src`` and ``dst`` describe the same logical tensor."""
    if not src.same_axes(dst):
        raise KilnError(
            f"{op}: layouts {src.name!r} and {dst.name!r} have different primal axes "
            f"({src.primal!r} vs {dst.primal!r}); a layout transform only reorders and splits "
            "axes"
        )


# =============================================================================================
# shapes, indices and arrays
# =============================================================================================
def primal_sizes(shape: Sequence[Any], layout: Layout) -> dict[str, Any]:
    """The length of every primal axis of a tensor of ``shape`` stored in ``layout``."""
    sizes: dict[str, Any] = {}
    for (a, _), d in zip(layout.axes, shape):
        if a.isupper():
            f = layout.factor(a)
            sizes[a] = d if f is None else simplify(_dim(d) * f)
    return sizes


def _dim(d: Any) -> Any:
    return tir.const(I64, d) if isinstance(d, int) else d


def transform_shape(shape: Sequence[Any], src: Layout | str, dst: Layout | str,
                    op: str = "layout_transform") -> tuple[Any, ...]:
    """The shape of a ``src``-layout tensor of ``shape`` after moving it to ``dst``.

    Raises StructInfoError when a primal axis is split by a factor that does not (provably)
    divide its length.
    """
    src, dst = Layout(src), Layout(dst)
    check_transform(src, dst, op)
    if len(shape) != src.ndim:
        raise StructInfoError(
            f"{op}: a tensor of shape {fmt_shape(shape)} has {len(shape)} dimensions but "
            f"layout {src.name!r} has {src.ndim}"
        )
    sizes = primal_sizes(shape, src)
    out: list[Any] = []
    for a, f in dst.axes:
        if f is not None:
            out.append(tir.const(I64, f))
            continue
        size = sizes[a]
        split = dst.factor(a)
        if split is None:
            out.append(size)
            continue
        n = const_int(size)
        if n is not None:
            if n % split:
                raise StructInfoError(
                    f"{op}: axis {a!r} of length {n} cannot be split into blocks of {split} "
                    f"({src.name!r} -> {dst.name!r}, shape {fmt_shape(shape)})"
                )
            out.append(tir.const(I64, n // split))
            continue
        rem = simplify(tir.floormod(_dim(size), split))
        if const_int(rem) != 0:
            raise StructInfoError(
                f"{op}: axis {a!r} of length {fmt_dim(size)} is not provably divisible by the "
                f"block size {split} ({src.name!r} -> {dst.name!r})"
            )
        out.append(simplify(tir.floordiv(_dim(size), split)))
    return tuple(out)


def source_index(dst_index: Sequence[Any], src: Layout, dst: Layout) -> tuple[Any, ...]:
    """Index into the ``src`` tensor of the element at ``dst_index`` of the ``dst`` tensor."""
    primal: dict[str, Any] = {}
    for (a, _), i in zip(dst.axes, dst_index):
        if a.isupper():
            f = dst.factor(a)
            inner = dst_index[dst.index(a.lower())] if f is not None else None
            primal[a] = i if f is None else i * f + inner
    out: list[Any] = []
    for a, f in src.axes:
        if f is not None:
            out.append(tir.floormod(primal[a.upper()], f))
        elif src.factor(a) is not None:
            out.append(tir.floordiv(primal[a], src.factor(a)))
        else:
            out.append(primal[a])
    return tuple(simplify(i) if not isinstance(i, tir.Var) else i for i in out)


def transform_array(arr: np.ndarray, src: Layout | str, dst: Layout | str) -> np.ndarray:
    """Move a numpy array from layout ``src`` to ``dst`` (what ``layout_transform`` computes).

    Broadcastable arrays are accepted: an array of lower rank is right-aligned to ``src`` (as
    numpy broadcasting would align it), and a primal axis of length 1 stays length 1 in every
    piece it is split into, so the result broadcasts against the transformed tensor exactly as
    ``arr`` broadcast against the original.
    """
    src, dst = Layout(src), Layout(dst)
    check_transform(src, dst)
    arr = np.asarray(arr)
    if arr.ndim > src.ndim:
        raise KilnError(f"transform_array: a {arr.ndim}-d array cannot be in layout {src.name!r}")
    arr = arr.reshape((1,) * (src.ndim - arr.ndim) + arr.shape)
    # 1. to the primal form: every sub-axis right after its primal axis, then merged
    order, prim = [], []
    for i, (a, _) in enumerate(src.axes):
        if a.isupper():
            order.append(i)
            sub = src.index(a.lower())
            if sub >= 0:
                order.append(sub)
            prim.append(a)
    arr = arr.transpose(order)
    merged: list[int] = []
    k = 0
    for a in prim:
        if src.factor(a) is not None:
            merged.append(arr.shape[k] * arr.shape[k + 1])
            k += 2
        else:
            merged.append(arr.shape[k])
            k += 1
    arr = arr.reshape(merged)
    # 2. split for dst: primal axis -> (outer, inner); a broadcast axis (length 1) -> (1, 1)
    split_shape: list[int] = []
    pos: dict[str, int] = {}
    for a, n in zip(prim, merged):
        f = dst.factor(a)
        pos[a] = len(split_shape)
        if f is None:
            split_shape.append(n)
        elif n == 1:
            split_shape += [1, 1]
        elif n % f:
            raise KilnError(f"transform_array: axis {a!r} of length {n} cannot be split into "
                            f"blocks of {f} ({src.name!r} -> {dst.name!r})")
        else:
            split_shape += [n // f, f]
    arr = arr.reshape(split_shape)
    perm = [pos[a.upper()] + (1 if a.islower() else 0) for a, _ in dst.axes]
    return np.ascontiguousarray(arr.transpose(perm))


# =============================================================================================
# layout_transform
# =============================================================================================
@dataclass(frozen=True)
class LayoutTransformAttrs:
    """``src_layout``: the input's layout; ``dst_layout``: the result's (same primal axes)."""

    src_layout: str = "NCHW"
    dst_layout: str = "NCHW"

    def __post_init__(self):
        src = as_layout(self.src_layout, "layout_transform", "src_layout")
        dst = as_layout(self.dst_layout, "layout_transform", "dst_layout")
        check_transform(src, dst)
        object.__setattr__(self, "src_layout", src.name)
        object.__setattr__(self, "dst_layout", dst.name)


def _infer_layout_transform(call: Any) -> Any:
    op = "layout_transform"
    attrs: LayoutTransformAttrs = call.attrs
    src, dst = Layout(attrs.src_layout), Layout(attrs.dst_layout)
    x = tensor_arg(call, 0, op, "data")
    if x.ndim >= 0 and x.ndim != src.ndim:
        raise StructInfoError(
            f"{op}: data has {x.ndim} dimensions but src_layout {src.name!r} has {src.ndim}"
        )
    if x.shape is None:
        return TensorStructInfo(None, x.dtype, dst.ndim)
    for (a, f), d in zip(src.axes, x.shape):
        if f is not None and const_int(d) is not None and const_int(d) != f:
            raise StructInfoError(
                f"{op}: data {fmt_shape(x.shape)} has {const_int(d)} elements on sub-axis "
                f"{a!r}, but src_layout {src.name!r} says {f}"
            )
    return TensorStructInfo(transform_shape(x.shape, src, dst, op), x.dtype)


def _layout_transform_compute(x: Any, *, attrs: LayoutTransformAttrs) -> Any:
    """``out[dst index] = x[src index of the same logical element]``."""
    src, dst = Layout(attrs.src_layout), Layout(attrs.dst_layout)
    shape = transform_shape(x.shape, src, dst)
    return te.compute(shape, lambda *i: x[source_index(i, src, dst)], name="layout_transform")


def _layout_transform_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """A layout transform moves every element once: its adjoint is the inverse transform."""
    attrs: LayoutTransformAttrs = call.attrs
    return [layout_transform(output_grad, attrs.dst_layout, attrs.src_layout)]


layout_transform = register_op(
    "layout_transform",
    inputs=("data",),
    attrs=LayoutTransformAttrs,
    infer=_infer_layout_transform,
    pattern=OpPattern.INJECTIVE,
    compute=_layout_transform_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_layout_transform_grad,
    doc="Move a tensor from ``src_layout`` to ``dst_layout`` (e.g. 'NCHW' -> 'NCHW8c'); "
    "splits must divide their axis exactly.",
)


# =============================================================================================
# what an alter-layout hook returns
# =============================================================================================
@dataclass(frozen=True)
class LayoutRewrite:
    """A request to compute an op call in other layouts.

    ``inputs[i]`` is ``(layout the call reads argument i in, layout the new call needs)``, or
    None to pass the argument unchanged; ``output`` is ``(layout of the call's result, layout
    of the new call's result)``; ``build(*args)`` makes the new call from the arguments in the
    requested layouts. The layout passes insert the ``layout_transform``\\ s (or transform
    constants at compile time) and let later element-wise ops follow the new layout.
    """

    inputs: tuple[tuple[str, str] | None, ...]
    output: tuple[str, str]
    build: Callable[..., Any]
