"""Attention-family and normalization ONNX operators.

Attention (23-25), FlexAttention (ai.onnx.preview), LinearAttention and CausalConvWithState
(27), RotaryEmbedding and RMSNormalization (23), Group/Instance/MeanVariance/Lp normalization
and LRN. Every operator is decomposed into existing kiln graph ops (matmul, softmax, conv2d,
where, reshape, reductions, ...): operator fusion merges the element-wise parts into the
matmuls and reductions, so no dedicated kernel is needed.

Masks that depend only on static shapes (the causal triangle, sliding windows) are built with
numpy at import time and enter the graph as constants; only what depends on run-time values
(``attn_mask``, ``nonpad_kv_seqlen``) is computed in the graph. Half-precision Attention
computes each step of its definition in its input type, the softmax in ``softmax_precision``
(default: the input type; see ``_Steps``); half-precision statistics and convolutions are
computed in float32 and rounded once at the end (see ``_WIDEN``). LinearAttention's
recurrence is unrolled per token at import (``MAX_UNROLLED_STEPS``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..importer import convert_subgraph, onnx_dtype
from ..registry import converter
from .common import dtype_of, ndim_of, node_axis, reshape, scalar, shape_of, static_int

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _static_shape(node: Any, x: Any, what: str) -> tuple[int, ...]:
    """``x``'s shape as ints; attention masks and head splits need static dimensions."""
    dims = []
    for d in shape_of(x):
        v = static_int(d)
        if v is None:
            raise node.error(f"{what} needs static dimensions, got shape {shape_of(x)}")
        dims.append(v)
    return tuple(dims)


def _const(arr: Any) -> Any:
    return g.const(np.asarray(arr))


def _neg_inf_bias(allowed: Any, dt: str) -> Any:
    """0 where ``allowed`` (a bool Expr), -inf elsewhere, in ``dt`` (select, not multiply:
    ``0 * -inf`` would be NaN)."""
    return op.where(allowed, scalar(0, dt), scalar(-np.inf, dt))


def _np_bias(allowed: np.ndarray, dt: str) -> Any:
    """The additive bias of a static bool mask, as a constant of ``dt``."""
    return _const(np.where(allowed, 0.0, -np.inf).astype(dt))


# ---------------------------------------------------------------------------------------------
# Attention (opset 23; 24 adds nonpad_kv_seqlen; 25 adds the sliding window)
# ---------------------------------------------------------------------------------------------


def _heads_4d(node: Any, x: Any, heads: int | None, what: str) -> Any:
    """(B, S, H*D) -> (B, H, S, D) for 3-D inputs; 4-D inputs pass through."""
    if ndim_of(x) == 4:
        return x
    if ndim_of(x) != 3:
        raise node.error(f"{what} must be 3-D or 4-D, got rank {ndim_of(x)}")
    if heads is None:
        raise node.error("3-D inputs need the q_num_heads and kv_num_heads attributes")
    b, s, hidden = _static_shape(node, x, what)
    if hidden % heads:
        raise node.error(f"{what} hidden size {hidden} is not divisible by {heads} heads")
    return op.transpose(reshape(x, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def _attention_bias(node: Any, in_dt: str, dt: str, batch: int, q_len: int, kv_len: int,
                    past_len: int) -> Any | None:
    """The additive bias in ``dt`` (broadcastable to (B, H, q, kv)) from attn_mask (of dtype
    ``in_dt`` when float), is_causal, the sliding window and nonpad_kv_seqlen, composed as
    onnx.reference does; None when there is no bias at all."""
    mask = node.input(3)
    nonpad = node.input(6) if node.opset >= 24 else None
    causal = bool(node.attr("is_causal", 0))
    left = int(node.attr("left_window_size", -1)) if node.opset >= 25 else -1
    right = int(node.attr("right_window_size", -1)) if node.opset >= 25 else -1
    if left < -1 or right < -1:
        raise node.error("left_window_size/right_window_size must be -1 or nonnegative")
    if nonpad is not None and past_len:
        raise node.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    windowed = left >= 0 or right >= 0

    bias = None
    if mask is not None:
        mshape = _static_shape(node, mask, "attn_mask")
        pad = kv_len - mshape[-1]
        if pad < 0:
            raise node.error(f"attn_mask's last dimension {mshape[-1]} exceeds the total "
                             f"sequence length {kv_len}")
        if dtype_of(mask) == "bool":
            if pad:
                fill = _const(np.zeros((*mshape[:-1], pad), dtype=bool))
                mask = op.concat([mask, fill], axis=-1)
            bias = _neg_inf_bias(mask, dt)
        else:
            if dtype_of(mask) != in_dt:
                raise node.error(f"a float attn_mask must have the dtype of Q ({in_dt}), "
                                 f"got {dtype_of(mask)}")
            bias = mask if in_dt == dt else op.cast(mask, dt)
            if pad:
                fill = _const(np.full((*mshape[:-1], pad), -np.inf, dtype=dt))
                bias = op.concat([bias, fill], axis=-1)

    # the causal / window frontier: query i (absolute position i + offset) against key j
    i_idx = np.arange(q_len).reshape(q_len, 1)
    j_idx = np.arange(kv_len).reshape(1, kv_len)
    if nonpad is not None:
        # external cache: offset = nonpad_kv_seqlen[b] - q_len, known at run time
        offset = op.subtract(reshape(op.cast(nonpad, "int64"), (batch, 1, 1, 1)),
                             scalar(q_len, "int64"))
        diff = op.subtract(op.add(_const(i_idx.reshape(1, 1, q_len, 1)), offset),
                           _const(j_idx.reshape(1, 1, 1, kv_len)))  # (B, 1, q, kv)
        zero = scalar(0, "int64")
        if causal:
            frontier = _neg_inf_bias(op.greater_equal(diff, zero), dt)
            bias = frontier if bias is None else op.add(bias, frontier)
        if windowed:
            ok = None
            if left >= 0:
                ok = op.less_equal(diff, scalar(left, "int64"))
            if right >= 0:
                r = op.greater_equal(diff, scalar(-right, "int64"))
                ok = r if ok is None else op.logical_and(ok, r)
            frontier = _neg_inf_bias(ok, dt)
            bias = frontier if bias is None else op.add(bias, frontier)
        padding = op.less(_const(j_idx.reshape(1, 1, 1, kv_len)),
                          reshape(op.cast(nonpad, "int64"), (batch, 1, 1, 1)))
        padding_bias = _neg_inf_bias(padding, dt)
        return padding_bias if bias is None else op.add(bias, padding_bias)

    diff = i_idx + past_len - j_idx  # (q, kv)
    allowed = np.ones((q_len, kv_len), dtype=bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    if causal or windowed:
        frontier = _np_bias(allowed, dt)
        bias = frontier if bias is None else op.add(bias, frontier)
    return bias


#: The float32 dtype half-precision steps compute in before they round (explicit casts round;
#: a half-precision expression inside a kernel is evaluated in float32 and rounded only when
#: stored). Attention rounds every step to its input type (see ``_Steps``); the normalizations,
#: CausalConvWithState and FlexAttention compute in float32 and round once.
_WIDEN = {"float16": "float32", "bfloat16": "float32"}


class _Steps:
    """Attention's steps in its input type ``t1``, as the operator's definition (its function
    body) computes them: each product, quotient, tanh and sum is rounded to ``t1`` (for
    float16/bfloat16: computed in float32 and cast back), and the MatMuls sum their products in
    float32 and round once, like kiln's MatMul of 16-bit inputs. For float32/float64 inputs
    every step is the plain op."""

    def __init__(self, t1: str):
        self.t1 = t1
        self.wide = _WIDEN.get(t1)

    def __call__(self, fn: Any, *xs: Any) -> Any:
        """``fn(*xs)`` rounded to ``t1`` (``fn`` builds with ops on ``self.dtype`` scalars)."""
        if self.wide is None:
            return fn(*xs)
        return op.cast(fn(*(op.cast(x, self.wide) for x in xs)), self.t1)

    @property
    def dtype(self) -> str:
        """The dtype ``fn`` of a step computes in."""
        return self.wide or self.t1

    def matmul(self, a: Any, b: Any) -> Any:
        if self.wide is None:
            return op.matmul(a, b)
        return op.cast(op.matmul(a, b, out_dtype=self.wide), self.t1)


def _softmax_rows(ctx: Any, steps: _Steps, scores: Any, bias: Any | None, sdt: str) -> Any:
    """Softmax over the last axis of ``scores + bias`` (rounded to the input type), computed in
    ``sdt`` (the softmax precision) and returned in the input type. A row whose bias is -inf
    everywhere (no attendable key) gives zeros, not NaN: the guard lifts such rows' bias to 0
    (``maximum`` with a per-row floor) before the softmax and sets them to 0 after it, so no
    NaN is ever produced. In a 16-bit ``sdt`` every step of the softmax is rounded to it and
    the row sum accumulates in it (``nn.softmax(in_dtype=True)``), as the ONNX definition's
    Softmax in that type computes it."""
    t1 = steps.t1
    masked = None
    logits = scores
    if bias is not None:
        masked = ctx.emit(op.equal(op.max(bias, axis=-1, keepdims=True), scalar(-np.inf, t1)))
        floor = op.where(masked, scalar(0, t1), scalar(-np.inf, t1))
        logits = steps(op.add, scores, op.maximum(bias, floor))
    if sdt != t1:
        logits = op.cast(logits, sdt)
    probs = op.nn.softmax(ctx.emit(logits), axis=-1, in_dtype=True)
    if masked is not None:
        # a select, not a product with 0: such a row is 0 even where its scores are inf or NaN
        probs = op.where(masked, scalar(0, sdt), probs)
    return probs if sdt == t1 else op.cast(probs, t1)


@converter("Attention", since=23)
def attention(ctx: Any, node: Any) -> Any:
    q, k, v = node.input(0), node.input(1), node.input(2)
    t1 = dtype_of(q)
    steps = _Steps(t1)
    rank = ndim_of(q)
    if not (ndim_of(k) == ndim_of(v) == rank):
        raise node.error("Q, K and V must have the same rank")
    q_heads_attr, kv_heads_attr = node.attr("q_num_heads"), node.attr("kv_num_heads")
    if rank == 4 and node.opset >= 25 and (q_heads_attr is not None
                                           or kv_heads_attr is not None):
        raise node.error("q_num_heads and kv_num_heads must not be given for 4-D inputs")
    q = ctx.emit(_heads_4d(node, q, q_heads_attr, "Q"))
    k = ctx.emit(_heads_4d(node, k, kv_heads_attr, "K"))
    v = ctx.emit(_heads_4d(node, v, kv_heads_attr, "V"))
    batch, q_heads, q_len, head = _static_shape(node, q, "Q")
    kv_heads = _static_shape(node, k, "K")[1]

    past_k, past_v = node.input(4), node.input(5)
    if (past_k is None) != (past_v is None):
        raise node.error("past_key and past_value must be given together")
    past_len = 0
    if past_k is not None:
        past_len = _static_shape(node, past_k, "past_key")[2]
        k = ctx.emit(op.concat([past_k, k], axis=2))
        v = ctx.emit(op.concat([past_v, v], axis=2))
    present_k, present_v = k, v
    kv_len = _static_shape(node, k, "K")[2]
    v_head = _static_shape(node, v, "V")[3]
    if q_heads % kv_heads:
        raise node.error(f"q heads ({q_heads}) must be a multiple of kv heads ({kv_heads})")
    reps = q_heads // kv_heads

    # Q*sqrt(scale) @ (K*sqrt(scale))^T, the scale rounded to the input dtype like ONNX's
    scale = node.attr("scale")
    scale = 1.0 / np.sqrt(head) if scale is None else float(scale)
    cdt = steps.dtype
    root = scalar(np.asarray(np.sqrt(scale), dtype=t1).astype(cdt), cdt)
    qs = steps(lambda x: op.multiply(x, root), q)
    ks = steps(lambda x: op.multiply(x, root), k)
    # GQA: query heads r*reps .. r*reps+reps-1 share kv head r, so a (B, Hkv, reps*q, D) view
    # of Q multiplies K once per kv head instead of repeating K and V
    qs = reshape(qs, (batch, kv_heads, reps * q_len, head))
    scores = steps.matmul(qs, op.transpose(ks, (0, 1, 3, 2)))
    scores = ctx.emit(reshape(scores, (batch, q_heads, q_len, kv_len)))
    softcap = float(node.attr("softcap", 0.0))
    if softcap > 0:
        cap = scalar(softcap, cdt)
        scores = steps(lambda x: op.divide(x, cap), scores)
        scores = steps(op.tanh, scores)
        scores = ctx.emit(steps(lambda x: op.multiply(x, cap), scores))

    bias = _attention_bias(node, t1, t1, batch, q_len, kv_len, past_len)
    if bias is not None and not isinstance(bias, (g.Var, g.Constant)):
        bias = ctx.emit(bias)
    mode = int(node.attr("qk_matmul_output_mode", 0))
    qk_out = scores
    if mode == 2 and bias is not None:
        qk_out = steps(op.add, scores, bias)

    # the softmax in softmax_precision, by default in the input type (the ONNX definition)
    precision = node.attr("softmax_precision")
    sdt = t1 if precision is None else onnx_dtype(int(precision), str(node))
    probs = ctx.emit(_softmax_rows(ctx, steps, scores, bias, sdt))
    if mode == 3:
        qk_out = probs

    out = steps.matmul(reshape(probs, (batch, kv_heads, reps * q_len, kv_len)), v)
    out = reshape(out, (batch, q_heads, q_len, v_head))
    if rank == 3:
        out = reshape(op.transpose(out, (0, 2, 1, 3)), (batch, q_len, q_heads * v_head))
    return [out, present_k, present_v, qk_out][: node.num_outputs]


# ---------------------------------------------------------------------------------------------
# normalizations
# ---------------------------------------------------------------------------------------------


def _stash(ctx: Any, node: Any, x: Any) -> Any:
    """``x`` in the dtype the statistics are computed in: ``stash_type`` (float32 by default)
    for half-precision inputs, else ``x``'s own dtype."""
    dt = dtype_of(x)
    if dt not in _WIDEN:
        return x

    sdt = onnx_dtype(int(node.attr("stash_type", 1)), str(node))
    return x if sdt == dt else ctx.emit(op.cast(x, sdt))


@converter("RMSNormalization", since=23)
def rms_norm(ctx: Any, node: Any) -> Any:
    x, w = node.input(0), node.input(1)
    nd = ndim_of(x)
    axes = tuple(range(node_axis(node, nd), nd))
    xs = _stash(ctx, node, x)
    dt, sdt = dtype_of(x), dtype_of(xs)
    eps = scalar(node.attr("epsilon", 1e-5), sdt)
    ms = op.mean(op.multiply(xs, xs), axis=axes, keepdims=True)
    y = op.multiply(xs, op.rsqrt(op.add(ms, eps)))
    if sdt != dt:
        y = op.cast(y, dt)
    return op.multiply(y, w)


def _normalize(ctx: Any, node: Any, x: Any, axes: tuple[int, ...], eps: float) -> Any:
    """``(x - mean) / sqrt(var + eps)`` over ``axes``, statistics in the ``stash_type`` dtype
    for half-precision inputs; the result has ``x``'s dtype."""
    xs = _stash(ctx, node, x)
    sdt = dtype_of(xs)
    mean = op.mean(xs, axis=axes, keepdims=True)
    centered = ctx.emit(op.subtract(xs, mean))
    var = op.mean(op.multiply(centered, centered), axis=axes, keepdims=True)
    y = op.multiply(centered, op.rsqrt(op.add(var, scalar(eps, sdt))))
    return y if sdt == dtype_of(x) else op.cast(y, dtype_of(x))


def _per_channel(v: Any, nd: int) -> Any:
    """A (C,) vector shaped (1, C, 1, ...) to broadcast over an (N, C, ...) tensor."""
    return reshape(v, (1, -1) + (1,) * (nd - 2))


@converter("InstanceNormalization", since=1)
def instance_norm(ctx: Any, node: Any) -> Any:
    x, scale, bias = node.input(0), node.input(1), node.input(2)
    nd = ndim_of(x)
    if nd < 3:
        raise node.error(f"input must have rank >= 3 (N, C, D1, ...), got rank {nd}")
    y = _normalize(ctx, node, x, tuple(range(2, nd)), float(node.attr("epsilon", 1e-5)))
    return op.add(op.multiply(y, _per_channel(scale, nd)), _per_channel(bias, nd))


def _group_norm(per_group_affine: bool) -> Any:
    """GroupNormalization: opset 18 gives scale/bias per group, opset 21 per channel."""

    def convert(ctx: Any, node: Any) -> Any:
        x, scale, bias = node.input(0), node.input(1), node.input(2)
        nd = ndim_of(x)
        shape = _static_shape(node, x, "input")
        if nd < 3:
            raise node.error(f"input must have rank >= 3 (N, C, D1, ...), got rank {nd}")
        groups = int(node.attr("num_groups"))
        n, c = shape[0], shape[1]
        if groups <= 0 or c % groups:
            raise node.error(f"{c} channels cannot be split into {groups} groups")
        grouped = ctx.emit(reshape(x, (n, groups, -1)))
        y = _normalize(ctx, node, grouped, (2,), float(node.attr("epsilon", 1e-5)))
        y = reshape(y, shape)
        if per_group_affine:  # repeat each group's value for its channels
            scale, bias = (reshape(op.broadcast_to(reshape(v, (groups, 1)),
                                                   (groups, c // groups)), (c,))
                           for v in (scale, bias))
        return op.add(op.multiply(y, _per_channel(scale, nd)), _per_channel(bias, nd))

    return convert


converter("GroupNormalization", since=18)(_group_norm(per_group_affine=True))
converter("GroupNormalization", since=21)(_group_norm(per_group_affine=False))


@converter("MeanVarianceNormalization", since=9)
def mean_variance_norm(ctx: Any, node: Any) -> Any:
    # ONNX's function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)
    x = node.input(0)
    nd, dt = ndim_of(x), dtype_of(x)
    axes = tuple(sorted(int(a) % nd for a in node.attr("axes", [0, 2, 3])))
    mean = ctx.emit(op.mean(x, axis=axes, keepdims=True))
    var = op.subtract(op.mean(op.multiply(x, x), axis=axes, keepdims=True),
                      op.multiply(mean, mean))
    return op.divide(op.subtract(x, mean), op.add(op.sqrt(var), scalar(1e-9, dt)))


@converter("LpNormalization", since=1)
def lp_norm(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    dt = dtype_of(x)
    axis = int(node.attr("axis", -1))
    p = int(node.attr("p", 2))
    if p == 1:
        norm = op.sum(op.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        norm = op.sqrt(op.sum(op.multiply(x, x), axis=axis, keepdims=True))
    else:
        raise node.error(f"p must be 1 or 2, got {p}")
    norm = ctx.emit(norm)
    # an all-zero line gives zeros, not 0/0: its elements are 0, so dividing them by 1 is exact
    safe = op.where(op.equal(norm, scalar(0, dt)), scalar(1, dt), norm)
    return op.divide(x, safe)


@converter("LRN", since=1)
def lrn(ctx: Any, node: Any) -> Any:
    # square_sum[c] = sum of x[i]^2 for i in [c - floor((size-1)/2), c + ceil((size-1)/2)]:
    # the squares zero-padded along the channels, summed over ``size`` shifted slices
    x = node.input(0)
    nd, dt = ndim_of(x), dtype_of(x)
    size = int(node.attr("size"))
    c = _static_shape(node, x, "input")[1]
    if size <= 0:
        raise node.error(f"size must be positive, got {size}")
    before, after = (size - 1) // 2, size // 2
    pad = [(0, 0)] * nd
    pad[1] = (before, after)
    sq = ctx.emit(op.pad(op.multiply(x, x), tuple(pad)))
    total = None
    for k in range(size):
        part = op.strided_slice(sq, (k,), (k + c,), axes=(1,))
        total = part if total is None else op.add(total, part)
    alpha = float(node.attr("alpha", 1e-4)) / size
    base = op.add(scalar(float(node.attr("bias", 1.0)), dt),
                  op.multiply(scalar(alpha, dt), total))
    return op.divide(x, op.power(base, scalar(float(node.attr("beta", 0.75)), dt)))


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding (opset 23)
# ---------------------------------------------------------------------------------------------


def _last(x: Any, begin: int, end: int) -> Any:
    return op.strided_slice(x, (begin,), (end,), axes=(ndim_of(x) - 1,))


@converter("RotaryEmbedding", since=23)
def rotary_embedding(ctx: Any, node: Any) -> Any:
    x, cos, sin, pos = node.input(0), node.input(1), node.input(2), node.input(3)
    rank = ndim_of(x)
    shape = _static_shape(node, x, "input")
    if rank == 4:  # (B, H, S, D): the caches (B, S, half) broadcast as (B, 1, S, half)
        xh = x
        batch, _, seq, head = shape
    elif rank == 3:  # (B, S, H*D) -> (B, S, H, D): caches as (B, S, 1, half)
        heads = node.attr("num_heads")
        if not heads:
            raise node.error("a 3-D input needs the num_heads attribute")
        batch, seq, hidden = shape
        if hidden % heads:
            raise node.error(f"hidden size {hidden} is not divisible by {heads} heads")
        head = hidden // heads
        xh = ctx.emit(reshape(x, (batch, seq, heads, head)))
    else:
        raise node.error(f"input must be 3-D or 4-D, got rank {rank}")
    rot = int(node.attr("rotary_embedding_dim", 0) or head)
    if rot % 2 or rot > head:
        raise node.error(f"rotary_embedding_dim {rot} must be even and at most {head}")
    half = rot // 2
    if pos is not None:
        cos, sin = op.take(cos, pos, axis=0), op.take(sin, pos, axis=0)
    cache_shape = (batch, 1, seq, half) if rank == 4 else (batch, seq, 1, half)
    cos, sin = ctx.emit(reshape(cos, cache_shape)), ctx.emit(reshape(sin, cache_shape))

    x_rot = ctx.emit(_last(xh, 0, rot)) if rot < head else xh
    if node.attr("interleaved", 0):
        pairs = ctx.emit(reshape(x_rot, (*shape_of(xh)[:-1], half, 2)))
        x1 = op.squeeze(_last(pairs, 0, 1), axis=(-1,))
        x2 = op.squeeze(_last(pairs, 1, 2), axis=(-1,))
    else:
        x1, x2 = _last(x_rot, 0, half), _last(x_rot, half, rot)
    x1, x2 = ctx.emit(x1), ctx.emit(x2)
    real = op.subtract(op.multiply(cos, x1), op.multiply(sin, x2))
    imag = op.add(op.multiply(sin, x1), op.multiply(cos, x2))
    if node.attr("interleaved", 0):
        pair = op.concat([op.expand_dims(real, -1), op.expand_dims(imag, -1)], axis=-1)
        rotated = reshape(pair, (*shape_of(xh)[:-1], rot))
    else:
        rotated = op.concat([real, imag], axis=-1)
    out = rotated if rot == head else op.concat([rotated, _last(xh, rot, head)], axis=-1)
    return reshape(out, shape) if rank == 3 else out


# ---------------------------------------------------------------------------------------------
# LinearAttention (opset 27): a recurrence over the sequence, unrolled at import
# ---------------------------------------------------------------------------------------------

#: The recurrence is unrolled step by step at import (a few graph ops per token); longer
#: sequences would need a scan kernel and are rejected with a clear error instead.
MAX_UNROLLED_STEPS = 64
_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _step(x: Any, t: int) -> Any:
    """Position ``t`` of axis 2 (the sequence axis of a (B, H, T, D) tensor), kept as size 1."""
    return op.strided_slice(x, (t,), (t + 1,), axes=(2,))


def _by_heads(ctx: Any, x: Any, heads: int, what: str, node: Any) -> Any:
    """(B, T, H*D) -> (B, H, T, D) in float32 (the recurrence runs in float32)."""
    b, t, hd = _static_shape(node, x, what)
    if hd % heads:
        raise node.error(f"{what}'s last dimension {hd} is not divisible by {heads} heads")
    if dtype_of(x) != "float32":
        x = op.cast(x, "float32")
    return ctx.emit(op.transpose(reshape(x, (b, t, heads, hd // heads)), (0, 2, 1, 3)))


@converter("LinearAttention", since=27)
def linear_attention(ctx: Any, node: Any) -> Any:
    q, k, v = node.input(0), node.input(1), node.input(2)
    past, decay, beta = node.input(3), node.input(4), node.input(5)
    rule = node.attr("update_rule", "gated_delta")
    if rule not in _UPDATE_RULES:
        raise node.error(f"unknown update_rule {rule!r} (expected one of {_UPDATE_RULES})")
    hq, hkv = node.attr("q_num_heads"), node.attr("kv_num_heads")
    if not hq or not hkv or hq % hkv:
        raise node.error("q_num_heads and kv_num_heads are required, q a multiple of kv")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise node.error(f"update_rule {rule!r} needs {'decay' if gating else 'no decay'} and "
                         f"{'beta' if delta else 'no beta'}")
    out_dt = dtype_of(q)
    b, steps, _ = _static_shape(node, q, "query")
    if steps > MAX_UNROLLED_STEPS:
        raise node.error(f"sequence length {steps} > {MAX_UNROLLED_STEPS}: the recurrence is "
                         "unrolled at import, long sequences are not supported yet")
    q4, k4 = _by_heads(ctx, q, hq, "query", node), _by_heads(ctx, k, hkv, "key", node)
    v4 = _by_heads(ctx, v, hkv, "value", node)
    dk, dv, group = shape_of(q4)[3], shape_of(v4)[3], hq // hkv
    dk, dv = static_int(dk), static_int(dv)
    q5 = ctx.emit(reshape(q4, (b, hkv, group, steps, dk)))
    if decay is not None:
        last = _static_shape(node, decay, "decay")[-1]
        if last not in (hkv, hkv * dk):
            raise node.error(f"decay's last dimension {last} must be {hkv} or {hkv * dk}")
        decay4 = _by_heads(ctx, decay, hkv, "decay", node)  # (B, Hkv, T, 1 or dk)
        gain = ctx.emit(op.exp(decay4))
    if beta is not None:
        last = _static_shape(node, beta, "beta")[-1]
        if last not in (hkv, 1):
            raise node.error(f"beta's last dimension {last} must be {hkv} or 1")
        beta4 = _by_heads(ctx, beta, last, "beta", node)  # (B, Hkv or 1, T, 1)

    state_dt = out_dt if past is None else dtype_of(past)
    if past is None:
        state = _const(np.zeros((b, hkv, dk, dv), dtype="float32"))
    else:
        state = past if state_dt == "float32" else ctx.emit(op.cast(past, "float32"))
    scale = node.attr("scale")
    scale = 1.0 / np.sqrt(dk) if not scale else float(scale)
    outs = []
    for t in range(steps):
        k_t = _step(k4, t)  # (B, Hkv, 1, dk)
        v_t = _step(v4, t)  # (B, Hkv, 1, dv)
        if gating:  # state *= exp(g_t), g_t per key row (or per head)
            state = op.multiply(state, reshape(_step(gain, t), (b, hkv, -1, 1)))
        if delta:  # v_t <- beta_t * (v_t - k_t @ state)
            v_t = op.multiply(_step(beta4, t), op.subtract(v_t, op.matmul(k_t, state)))
        state = ctx.emit(op.add(state, op.multiply(reshape(k_t, (b, hkv, dk, 1)), v_t)))
        q_t = reshape(op.strided_slice(q5, (t,), (t + 1,), axes=(3,)), (b, hkv, group, dk))
        outs.append(op.expand_dims(op.matmul(q_t, state), 3))  # (B, Hkv, G, 1, dv)
    out = outs[0] if steps == 1 else op.concat(outs, axis=3)
    out = op.multiply(reshape(out, (b, hq, steps, dv)), scalar(scale, "float32"))
    out = reshape(op.transpose(out, (0, 2, 1, 3)), (b, steps, hq * dv))
    if out_dt != "float32":
        out = op.cast(out, out_dt)
    if state_dt != "float32":
        state = op.cast(state, state_dt)
    return [out, state]


# ---------------------------------------------------------------------------------------------
# CausalConvWithState (opset 27): a depthwise causal conv1d with a carried left context
# ---------------------------------------------------------------------------------------------

_ACTIVATIONS = ("none", "silu", "swish")


@converter("CausalConvWithState", since=27)
def causal_conv_with_state(ctx: Any, node: Any) -> Any:
    x, w, bias, past = node.input(0), node.input(1), node.input(2), node.input(3)
    activation = node.attr("activation", "none")
    if activation not in _ACTIVATIONS:
        raise node.error(f"unknown activation {activation!r} (expected one of {_ACTIVATIONS})")
    if ndim_of(x) != 3 or ndim_of(w) != 3:
        raise node.error("input must be (B, C, L) and weight (C, 1, k)")
    batch, channels, length = _static_shape(node, x, "input")
    k = _static_shape(node, w, "weight")[2]
    dt = dtype_of(x)
    if past is None:
        # zeros broadcast when run, not a constant of the declared size (a batch of 2**32
        # was a 192 GiB array at import: fuzz 3037725)
        past = op.broadcast_to(scalar(0, dt), (batch, channels, k - 1))
    padded = ctx.emit(op.concat([past, x], axis=2)) if k > 1 else x
    # the depthwise conv as a grouped 2-D conv of height 1 (valid padding); half-precision
    # inputs accumulate in float32 and are rounded once, like the reference
    wide = _WIDEN.get(dt, dt)
    xw, ww = (x_ if wide == dt else op.cast(x_, wide) for x_ in (padded, w))
    conv = op.nn.conv2d(op.expand_dims(xw, 2), op.expand_dims(ww, 2), strides=(1, 1),
                        padding=(0, 0, 0, 0), dilation=(1, 1), groups=channels)
    out = op.squeeze(conv, axis=(2,))
    if bias is not None:
        out = op.add(out, reshape(bias if wide == dt else op.cast(bias, wide), (1, -1, 1)))
    if wide != dt:
        out = op.cast(out, dt)
    if activation != "none":  # SiLU in float32 of the rounded conv output
        f = ctx.emit(out if wide == dt else op.cast(out, wide))
        out = op.multiply(f, op.sigmoid(f))
        out = out if wide == dt else op.cast(out, dt)
    if k == 1:  # no left context: an empty state
        state = np.zeros((batch, channels, 0), dtype=dt)
    else:
        total = length + k - 1
        state = op.strided_slice(padded, (total - (k - 1),), (total,), axes=(2,))
    return [out, state]


# ---------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview 1): attention with score_mod / prob_mod subgraphs
# ---------------------------------------------------------------------------------------------


def _apply_mod(ctx: Any, node: Any, name: str, x: Any) -> Any:
    """Import the graph attribute ``name`` (one input, one output) applied to ``x``."""
    graph = node.attrs.get(name)
    if graph is None:
        return x
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise node.error(f"{name} must have exactly one input and one output")
    (out,) = convert_subgraph(ctx, graph, {graph.input[0].name: x})
    if isinstance(out, (np.ndarray, np.generic)):
        out = _const(out)
    if dtype_of(out) != dtype_of(x):
        out = op.cast(out, dtype_of(x))
    return ctx.emit(op.broadcast_to(out, shape_of(x)))


@converter("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(ctx: Any, node: Any) -> Any:
    q, k, v = node.input(0), node.input(1), node.input(2)
    if not (ndim_of(q) == ndim_of(k) == ndim_of(v) == 4):
        raise node.error("Q, K and V must be 4-D (B, H, L, E)")
    dt = dtype_of(q)
    batch, q_heads, q_len, head = _static_shape(node, q, "Q")
    kv_heads, kv_len = _static_shape(node, k, "K")[1:3]
    v_head = _static_shape(node, v, "V")[3]
    if q_heads % kv_heads:
        raise node.error(f"q heads ({q_heads}) must be a multiple of kv heads ({kv_heads})")
    reps = q_heads // kv_heads
    precision = node.attr("softmax_precision")
    if precision is not None:
        cdt = onnx_dtype(int(precision), str(node))
    else:
        cdt = "float32" if dt in _WIDEN else dt
    # Q and K pre-scaled by sqrt(scale) (computed in float32, rounded to the input dtype)
    scale = node.attr("scale")
    scale = 1.0 / np.sqrt(head) if scale is None else float(scale)
    root = scalar(np.asarray(np.sqrt(np.float32(scale)), dtype=dt), dt)
    qs, ks = op.multiply(q, root), op.multiply(k, root)
    if dt != cdt:
        qs, ks, v = op.cast(qs, cdt), op.cast(ks, cdt), op.cast(v, cdt)
    qs = reshape(qs, (batch, kv_heads, reps * q_len, head))
    scores = op.matmul(qs, op.transpose(ks, (0, 1, 3, 2)))
    scores = ctx.emit(reshape(scores, (batch, q_heads, q_len, kv_len)))
    scores = _apply_mod(ctx, node, "score_mod", scores)
    probs = ctx.emit(op.nn.softmax(scores, axis=-1))
    probs = _apply_mod(ctx, node, "prob_mod", probs)
    out = op.matmul(reshape(probs, (batch, kv_heads, reps * q_len, kv_len)), v)
    out = reshape(out, (batch, q_heads, q_len, v_head))
    return out if dt == cdt else op.cast(out, dt)
