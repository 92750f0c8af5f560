"""Shape and data-movement ONNX operators.

Shape-determining inputs (Reshape's shape, Slice's starts, Pad's pads, ...) are folded when
known at import time; otherwise Reshape, Expand, ConstantOfShape, Range, Tile, Slice and Pad
compute their output shape at run time (``converters/dynamic.py``). Inputs that set the output
*rank* (Squeeze's axes, Slice's axes, ...) must be constant. When every input is a known
constant the result is computed with numpy so that shape arithmetic chains (Shape -> Gather ->
Concat -> Reshape) fold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx.numpy_helper as nh

from .... import graph as g
from .... import op
from ....ir.errors import StructInfoError
from ..registry import converter
from . import dynamic as rt
from . import shape_values as sv
from .common import ints, ndim_of, norm_axis, prod, reshape, shape_of, static_int


def _all_const(node: Any) -> list[np.ndarray] | None:
    vals = [node.const_value(i) for i in range(node.num_inputs) if node.has_input(i)]
    return None if any(v is None for v in vals) else vals


@converter("Constant")
def constant(ctx: Any, node: Any) -> Any:
    a = node.attrs
    if "value" in a:
        return nh.to_array(a["value"])
    if "value_float" in a:
        return np.array(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.array(list(a["value_floats"]), dtype=np.float32)
    if "value_int" in a:
        return np.array(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.array(list(a["value_ints"]), dtype=np.int64)
    raise node.error(f"unsupported Constant attribute(s) {sorted(a)} (sparse or string values)")


@converter("ConstantOfShape", since=9)
def constant_of_shape(ctx: Any, node: Any) -> Any:
    value = node.attrs.get("value")
    fill = nh.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    if fill.size != 1:
        raise node.error(f"value must hold one element, got {fill.size}")
    if not node.is_const(0):
        return rt.constant_of_shape_rt(ctx, node, node.input(0), fill)
    shape = ints(node.const_input(0, "shape"))
    if any(d < 0 for d in shape):
        raise node.error(f"negative dimension in the shape {shape}")
    if int(np.prod(shape, dtype=np.float64)) > FOLD_LIMIT:  # made while the model runs
        return op.broadcast_to(g.const(fill.reshape(())), tuple(shape))
    return np.full(shape, fill[0], dtype=fill.dtype)


@converter("Shape")
def shape(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    dims = x.struct_info.shape  # None: only the rank is known
    static = None if dims is None else ctx.static_shape(x)
    start, end = (node.attr("start", 0), node.attr("end", None)) if node.opset >= 15 else (0, None)
    if static is not None:
        return np.array(static, dtype=np.int64)[start:end]
    # symbolic dims: a kernel writes them (bound from its argument) at run time
    begin, stop, _ = slice(start, end).indices(ndim_of(x))
    if dims is not None:
        sv.track(ctx, node, list(dims)[begin:max(stop, begin)])
    out = op.dynamic_shape_of(x)
    if (begin, stop) == (0, ndim_of(x)):
        return out
    return op.strided_slice(out, (begin,), (max(stop, begin),))


@converter("Size")
def size(ctx: Any, node: Any) -> Any:
    static = ctx.static_shape(node.input(0))
    if static is None:
        return op.prod(op.dynamic_shape_of(node.input(0)))
    return np.array(int(np.prod(static)), dtype=np.int64)


@converter("Reshape", since=5)
def reshape_(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    allowzero = bool(node.attr("allowzero", 0))
    if not node.is_const(1):
        known = _reshape_to_entries(ctx, node, x, allowzero)
        if known is not None:
            return known
        return rt.reshape_rt(ctx, node, x, node.input(1), allowzero)
    target = ints(node.const_input(1, "shape"))
    in_shape = shape_of(x)
    dims = [in_shape[i] if (d == 0 and not allowzero) else d for i, d in enumerate(target)]
    const = node.const_value(0)
    if const is not None:
        to = [d if isinstance(d, int) else const.shape[i] for i, d in enumerate(dims)]
        known = int(np.prod([d for d in to if d != -1]))
        if to.count(-1) > 1 or (-1 in to and (known == 0 or const.size % known)) or \
                (-1 not in to and known != const.size) or any(d < -1 for d in to):
            raise node.error(f"cannot reshape a constant of shape {list(const.shape)} to "
                             f"{target}")
        return const.reshape(to)
    try:
        return ctx.emit(reshape(x, dims), node.name)
    except StructInfoError:
        # the element count is not provable (dims bound at run time): checked when it runs
        return rt.reshape_rt(ctx, node, x, g.const(np.array(target, np.int64)), allowzero)


def _reshape_to_entries(ctx: Any, node: Any, x: Any, allowzero: bool) -> Any | None:
    """Reshape to a computed shape whose entries are known at import (``shape_values``): a
    reshape to those dims, so the result keeps a (symbolic) shape. None when the entries are
    unknown or the element count is not provably kept (then checked at run time)."""
    target = sv.entries(ctx, node, 1)
    in_shape = x.struct_info.shape
    if target is None or in_shape is None:
        return None
    dims = []
    for i, d in enumerate(target):
        if isinstance(d, int) and d == 0 and not allowzero:
            if i >= len(in_shape):
                return None
            d = in_shape[i]
        elif isinstance(d, int) and d < -1:
            return None
        dims.append(d)
    try:
        return ctx.emit(reshape(x, dims), node.name)
    except StructInfoError:
        return None


@converter("Flatten")
def flatten(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    s = shape_of(x)
    axis = norm_axis(int(node.attr("axis", 1)), len(s))
    return reshape(x, (prod(s[:axis]), prod(s[axis:])))


@converter("Transpose")
def transpose(ctx: Any, node: Any) -> Any:
    perm = node.attr("perm", None)
    return op.transpose(node.input(0), None if perm is None else tuple(int(p) for p in perm))


@converter("Concat")
def concat(ctx: Any, node: Any) -> Any:
    axis = int(node.attr("axis", 0))
    consts = _all_const(node)
    if consts is not None:
        shapes = [np.shape(c) for c in consts]
        nd = len(shapes[0])
        if any(len(sh) != nd for sh in shapes) or not -nd <= axis < nd or \
                len({sh[:axis % nd] + sh[axis % nd + 1:] for sh in shapes}) > 1:
            raise node.error(f"cannot concatenate constant inputs of shapes {shapes} along "
                             f"axis {axis}")
        return np.concatenate(consts, axis=axis)
    parts = [sv.entries(ctx, node, i) for i in range(node.num_inputs)]
    if all(p is not None for p in parts):
        sv.track(ctx, node, [v for p in parts for v in p])
    return op.concat([x for x in node.inputs() if x is not None], axis=axis)


def _split_sizes(ctx: Any, node: Any, x: Any, axis: int) -> list[int]:
    if node.opset >= 13:
        value = node.const_input(1, "split")
        sizes = None if value is None else ints(value)
    else:
        sizes = node.attr("split", None)
    dim = static_int(shape_of(x)[axis])
    if sizes:
        sizes = [int(s) for s in sizes]
        if len(sizes) != node.num_outputs or min(sizes) < 0 or (
                dim is not None and sum(sizes) != dim):
            raise node.error(f"split sizes {sizes} must be {node.num_outputs} non-negative "
                             f"sizes adding up to the axis length {dim}")
        return sizes
    n = int(node.attr("num_outputs", 0)) or node.num_outputs
    if n != node.num_outputs:
        raise node.error(f"num_outputs is {n} but the node has {node.num_outputs} outputs")
    if dim is None:
        raise node.error("an even split of a symbolic axis is not supported yet")
    chunk = -(-dim // n)
    if (n - 1) * chunk > dim:  # an empty last part is one (onnxruntime, onnx.reference)
        raise node.error(f"an axis of length {dim} cannot be split into {n} parts of "
                         f"{chunk} (the last would be negative)")
    return [min(chunk, dim - i * chunk) for i in range(n)]


@converter("Split")
def split(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    axis = norm_axis(int(node.attr("axis", 0)), ndim_of(x))
    if node.opset >= 13 and node.has_input(1) and not node.is_const(1):
        return rt.split_rt(ctx, node, x, node.input(1), axis)
    sizes = _split_sizes(ctx, node, x, axis)
    indices = tuple(int(v) for v in np.cumsum(sizes)[:-1])
    if len(sizes) == 1:
        return [x]
    return op.split(x, indices, axis=axis)


@converter("Squeeze")
def squeeze(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    if node.opset >= 13 and node.has_input(1) and not node.is_const(1):
        return rt.squeeze_rt(ctx, node, x, node.input(1))
    if node.opset >= 13:
        value = node.const_input(1, "axes")
        axes = None if value is None else ints(value)
    else:
        axes = node.attr("axes", None)
    if ndim_of(x) <= 1:
        sv.forward(ctx, node)
    if axes is None:
        return op.squeeze(x)
    nd = ndim_of(x)
    return op.squeeze(x, axis=tuple(sorted(norm_axis(int(a), nd) for a in axes)))


@converter("Unsqueeze")
def unsqueeze(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    if node.opset >= 13 and not node.is_const(1):
        return rt.unsqueeze_rt(ctx, node, x, node.input(1))
    axes = ints(node.const_input(1, "axes")) if node.opset >= 13 else node.attr("axes")
    in_shape = list(shape_of(x))
    rank = len(in_shape) + len(axes)
    pos = {norm_axis(int(a), rank) for a in axes}
    it = iter(in_shape)
    out = [1 if i in pos else next(it) for i in range(rank)]
    const = node.const_value(0)
    if const is not None:
        return np.expand_dims(const, tuple(sorted(pos)))
    if rank <= 1:
        sv.forward(ctx, node)
    return reshape(x, out)


@converter("Expand", since=8)
def expand(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    if not node.is_const(1):
        return rt.expand_rt(ctx, node, x, node.input(1))
    target = ints(node.const_input(1, "shape"))
    in_shape = list(shape_of(x))
    rank = max(len(in_shape), len(target))
    a = [1] * (rank - len(in_shape)) + in_shape
    b = [1] * (rank - len(target)) + target
    out = [da if (isinstance(db, int) and db == 1) else db for da, db in zip(a, b)]
    return op.broadcast_to(x, tuple(out))


def _slice(node: Any, x: Any, starts: list[int], ends: list[int], axes: list[int] | None,
           steps: list[int] | None) -> Any:
    nd = ndim_of(x)
    axes = list(range(len(starts))) if axes is None else [norm_axis(a, nd) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    const = node.const_value(0)
    if const is not None:
        idx = [slice(None)] * nd
        for a, s, e, st in zip(axes, starts, ends, steps):
            idx[a] = slice(s, e, st)
        return const[tuple(idx)]
    return op.strided_slice(x, tuple(starts), tuple(ends), tuple(steps), tuple(axes))


@converter("Slice", since=1)
def slice_v1(ctx: Any, node: Any) -> Any:
    axes = node.attr("axes", None)
    return _slice(node, node.input(0), list(node.attr("starts")), list(node.attr("ends")),
                  None if axes is None else list(axes), None)


@converter("Slice", since=10)
def slice_v10(ctx: Any, node: Any) -> Any:
    if not all(node.is_const(i) for i in (1, 2, 3, 4) if node.has_input(i)):
        axes = node.const_value(3)
        axes = node.input(3) if axes is None else ints(axes)
        return rt.slice_rt(ctx, node, node.input(0), node.input(1), node.input(2), axes,
                           node.input(4))
    axes, steps = node.const_input(3, "axes"), node.const_input(4, "steps")
    return _slice(node, node.input(0), ints(node.const_input(1, "starts")),
                  ints(node.const_input(2, "ends")), None if axes is None else ints(axes),
                  None if steps is None else ints(steps))


@converter("Gather")
def gather(ctx: Any, node: Any) -> Any:
    x, indices = node.input(0), node.input(1)
    axis = norm_axis(int(node.attr("axis", 0)), ndim_of(x))
    consts = _all_const(node)
    if consts is not None:
        length, idx = np.shape(consts[0])[axis], np.asarray(consts[1])
        bad = idx[(idx < -length) | (idx >= length)]
        if bad.size:
            raise node.error(f"index {int(bad.flat[0])} is out of range for axis {axis} of "
                             f"length {length}")
        return np.take(consts[0], consts[1], axis=axis)
    picked = _shape_entries(ctx, node)
    if picked is not None:
        static = sv.static_entries(picked)
        if static is not None:
            return np.array(static, dtype=np.int64).reshape(np.shape(node.const_value(1)))
        sv.track(ctx, node, picked)
    # negative indices count from the end; one outside [-n, n) fails the run, as in onnxruntime
    return op.take(x, indices, axis=axis, mode="raise")


def _shape_entries(ctx: Any, node: Any) -> list[Any] | None:
    """Gather of constant indices from a tracked shape value: the picked entries. All static
    (a model exported with a dynamic batch reads its sequence length this way), the Gather
    folds to a constant; else its entries are tracked (the batch, for a reshape target)."""
    dims = sv.entries(ctx, node, 0)
    index = node.const_value(1)
    if dims is None or index is None or np.ndim(index) > 1:
        return None
    picked = []
    for i in np.asarray(index).reshape(-1):
        if not -len(dims) <= int(i) < len(dims):
            return None
        picked.append(dims[int(i) % len(dims)])
    return picked


@converter("Pad", since=2)
def pad_v2(ctx: Any, node: Any) -> Any:
    return _pad(ctx, node, node.input(0), list(node.attr("pads")), float(node.attr("value", 0.0)),
                None)


@converter("Pad", since=11)
def pad_v11(ctx: Any, node: Any) -> Any:
    if not all(node.is_const(i) for i in (1, 2, 3) if node.has_input(i)):
        axes = node.const_value(3)
        axes = node.input(3) if axes is None and node.has_input(3) else (
            None if axes is None else ints(axes))
        return rt.pad_rt(ctx, node, node.input(0), node.input(1), node.input(2), axes,
                         node.attr("mode", "constant"))
    axes = node.const_input(3, "axes")
    value = node.const_input(2, "constant_value")
    fill = 0.0 if value is None else np.asarray(value).reshape(()).item()
    return _pad(ctx, node, node.input(0), ints(node.const_input(1, "pads")), fill,
                None if axes is None else ints(axes))


def _pad(ctx: Any, node: Any, x: Any, pads: list[int], fill: Any, axes: list[int] | None
         ) -> Any:
    nd = ndim_of(x)
    axes = list(range(nd)) if axes is None else [norm_axis(a, nd) for a in axes]
    if len(pads) != 2 * len(axes):
        raise node.error(f"pads has {len(pads)} entries, 2 per padded axis ({len(axes)}) "
                         "expected")
    width = [[0, 0] for _ in range(nd)]
    for k, a in enumerate(axes):
        width[a] = [pads[k], pads[k + len(axes)]]
    crop = [a for a in range(nd) if min(width[a]) < 0]
    if crop:  # negative pads remove elements: that slice first, then the padding (onnxruntime)
        x = ctx.emit(op.strided_slice(x, tuple(max(-width[a][0], 0) for a in crop),
                                      tuple(width[a][1] if width[a][1] < 0 else None
                                            for a in crop), axes=tuple(crop)),
                     f"{node.name}_cropped")
        width = [[max(b, 0), max(e, 0)] for b, e in width]
    mode = node.attr("mode", "constant")
    if mode == "wrap":
        return _wrap_pad(node, x, width)
    if mode not in ("constant", "edge", "reflect"):
        raise node.error(f"pad mode {mode!r} is not supported")
    return op.pad(x, tuple(tuple(w) for w in width), pad_value=fill, mode=mode)


def _wrap_pad(node: Any, x: Any, width: list[list[int]]) -> Any:
    """Pad mode 'wrap' (numpy ``wrap``): one gather per padded axis of the positions
    ``(i - before) mod dim``; exact for any pad size, and differentiable through ``take``."""
    dims = shape_of(x)  # padding one axis leaves the others' sizes
    for axis, (b, e) in enumerate(width):
        if not (b or e):
            continue
        dim = static_int(dims[axis])
        if not dim:
            raise node.error("pad mode 'wrap' needs static, non-empty padded dimensions")
        idx = np.arange(-b, dim + e, dtype=np.int64) % dim
        x = op.take(x, g.const(idx), axis=axis)
    return x


@converter("Tile", since=6)
def tile(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    if not node.is_const(1):
        return rt.tile_rt(ctx, node, x, node.input(1))
    reps = ints(node.const_input(1, "repeats"))
    s = list(shape_of(x))
    if len(reps) != len(s):
        raise node.error(f"repeats {reps} must have one entry per input axis ({len(s)})")
    # (d0, d1, ..) -> (1, d0, 1, d1, ..) -> broadcast (r0, d0, r1, d1, ..) -> (r0*d0, ..)
    inter = [v for d in s for v in (1, d)]
    wide = [v for r, d in zip(reps, s) for v in (r, d)]
    out = op.broadcast_to(reshape(x, inter), tuple(wide))
    return reshape(out, [r * d for r, d in zip(reps, s)])


@converter("DepthToSpace")
def depth_to_space(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    bs = int(node.attr("blocksize"))
    n, c, h, w = shape_of(x)
    cs = c // (bs * bs)
    if node.attr("mode", "DCR") == "DCR":
        t = op.transpose(reshape(x, (n, bs, bs, cs, h, w)), (0, 3, 4, 1, 5, 2))
    else:
        t = op.transpose(reshape(x, (n, cs, bs, bs, h, w)), (0, 1, 4, 2, 5, 3))
    return reshape(t, (n, cs, h * bs, w * bs))


@converter("SpaceToDepth")
def space_to_depth(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    bs = int(node.attr("blocksize"))
    n, c, h, w = shape_of(x)
    # DCR puts the block offsets before the channels, CRD after them
    perm = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    t = op.transpose(reshape(x, (n, c, h // bs, bs, w // bs, bs)), perm)
    return reshape(t, (n, c * bs * bs, h // bs, w // bs))


#: The most elements an import-time constant (a folded Range, ConstantOfShape...) may have:
#: larger ones are made by a kernel while the model runs.
FOLD_LIMIT = 1 << 24


@converter("Range", since=11)
def range_(ctx: Any, node: Any) -> Any:
    if not all(node.is_const(i) for i in range(3)):
        return rt.range_rt(ctx, node, node.input(0), node.input(1), node.input(2))
    start, limit, delta = (np.asarray(node.const_input(i, n)) for i, n in
                           enumerate(("start", "limit", "delta")))
    if any(v.size != 1 for v in (start, limit, delta)):
        raise node.error(f"start, limit and delta must be scalars, got shapes {start.shape}, "
                         f"{limit.shape} and {delta.shape}")
    if delta.item() == 0 or not all(np.isfinite(v.item()) for v in (start, limit, delta)):
        raise node.error(f"Range({start.item()}, {limit.item()}, {delta.item()}) has no "
                         "length (delta 0 or a bound not finite)")
    count = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)
    if count > FOLD_LIMIT:  # made while the model runs, within its memory limit
        return rt.range_rt(ctx, node, node.input(0), node.input(1), node.input(2))
    return np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)


