"""Signal-processing ONNX operators: DFT, STFT, window functions, MelWeightMatrix.

A DFT of static length is real arithmetic: two matmuls with cos/sin matrices computed in
float64 at import (``_dft_matrices``), applied to the real and imaginary parts with the
transformed axis moved last. Zero-padding/truncation to ``dft_length``, the one-sided output
and the Hermitian completion of an inverse one-sided transform (irfft) are folded into those
matrices, so the graph is a few transposes and matmuls whatever the options. This is O(N^2) per
transform (no FFT), fine for the frame sizes models use.

Windows and MelWeightMatrix are computed with numpy when their inputs are known at import
time; a window of run-time size is built from a run-time ``arange`` (``dynamic.range_rt``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ....ir import KilnError
from ....ir.errors import MemoryLimitError
from ....runtime.memory_plan import memory_limit
from ..importer import onnx_dtype
from ..registry import converter
from .common import dtype_of, ndim_of, scalar, shape_of, static_int
from .dynamic import range_rt, select_shaped


def _angles(rows: int, cols: int, n: int) -> np.ndarray:
    """2*pi*(r*c mod n)/n for r < rows, c < cols (the modulo keeps large products exact)."""
    rc = np.outer(np.arange(rows, dtype=np.int64), np.arange(cols, dtype=np.int64)) % n
    return 2.0 * np.pi * rc / n


def _dft_matrices(n_in: int, length: int, inverse: bool, onesided: bool
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """(C, S, K) with ``y = x @ C`` and ``x @ S`` the cos/sin products of a length-``length``
    transform of an ``n_in``-long input (zero-padded/truncated), K outputs.

    Forward/standard inverse: ``C[n, k] = cos(2 pi k n / N)``, ``S`` likewise with sin.
    Inverse one-sided (irfft): rows index the half spectrum; the mirrored half is folded in,
    ``C``/``S`` give ``Re(ifft)`` from the real/imag parts directly (already scaled by 1/N).
    """
    if inverse and onesided:
        m = length // 2 + 1
        cos = np.zeros((n_in, length))
        sin = np.zeros((n_in, length))
        ang = _angles(length, length, length)  # [k, n]
        for k in range(length):
            src, sign = (k, 1.0) if k < m else (length - k, -1.0)
            if src < n_in:
                cos[src] += np.cos(ang[k])
                sin[src] -= sign * np.sin(ang[k])
        return cos / length, sin / length, length
    k_out = length // 2 + 1 if onesided else length
    rows = min(n_in, length)
    ang = _angles(rows, k_out, length)
    cos = np.zeros((n_in, k_out))
    sin = np.zeros((n_in, k_out))
    cos[:rows], sin[:rows] = np.cos(ang), np.sin(ang)
    return cos, sin, k_out


def _last_part(x: Any, i: int) -> Any:
    """Component ``i`` of the trailing real/imag axis, that axis dropped."""
    nd = len(shape_of(x))
    return op.squeeze(op.strided_slice(x, (i,), (i + 1,), None, (nd - 1,)), axis=(nd - 1,))


def _dft(ctx: Any, node: Any, x: Any, axis: int, length: int | None, inverse: bool,
         onesided: bool) -> Any:
    """DFT of ``x`` ([..., 1 or 2]) along ``axis`` (non-negative, not the last)."""
    shape = shape_of(x)
    nd = len(shape)
    n_in = static_int(shape[axis])
    if n_in is None:
        raise node.error("the transformed axis has a symbolic length; the DFT matrix needs "
                         "a static one")
    if length is None:
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    if length <= 0:
        raise node.error(f"dft_length must be positive, got {length}")
    comps = static_int(shape[-1])
    if comps not in (1, 2):
        raise node.error(f"the last axis must have 1 (real) or 2 (complex) entries, got "
                         f"{shape[-1]}")
    # accumulate in float64 like numpy's FFT: an inverse of a forward transform must give
    # imaginary parts of ~1e-16, not float32 round-off (ONNX tests check with atol 1e-7)
    out_dt = dtype_of(x)
    dt = "float64"
    if out_dt != dt:
        x = ctx.emit(op.cast(x, dt))
    need = 2 * 8 * n_in * (length // 2 + 1 if onesided and not inverse else length)
    if need > memory_limit():
        raise MemoryLimitError(f"{node}: the DFT's cos/sin matrices ({n_in} inputs, length "
                               f"{length}) need {need} bytes, over the memory limit "
                               f"{memory_limit()} (KILN_MEMORY_LIMIT)")
    cos, sin, _ = _dft_matrices(n_in, length, inverse, onesided)
    cos_c, sin_c = _const(cos), _const(sin)
    # move the transformed axis last (of the rank nd-1 parts)
    perm = [a for a in range(nd - 1) if a != axis] + [axis]
    inv = list(np.argsort(perm))
    parts = [_last_part(x, i) for i in range(comps)]
    if perm != list(range(nd - 1)):
        parts = [op.transpose(p, tuple(perm)) for p in parts]
    parts = [ctx.emit(p) for p in parts]
    xr, xi = parts[0], (parts[1] if comps == 2 else None)

    def mm(a: Any, m: Any) -> Any:
        return ctx.emit(op.matmul(a, m))

    if inverse and onesided:
        yr = mm(xr, cos_c)
        if xi is not None:
            yr = op.add(yr, mm(xi, sin_c))
        outs = [yr]
    else:
        s = 1.0 if inverse else -1.0  # e^{s 2 pi i k n / N}
        xr_c, xr_s = mm(xr, cos_c), mm(xr, sin_c)
        yr, yi = xr_c, op.multiply(xr_s, scalar(s, dt))
        if xi is not None:
            yr = op.subtract(yr, op.multiply(mm(xi, sin_c), scalar(s, dt)))
            yi = op.add(yi, mm(xi, cos_c))
        if inverse:
            yr = op.divide(yr, scalar(length, dt))
            yi = op.divide(yi, scalar(length, dt))
        outs = [yr, yi]
    if perm != list(range(nd - 1)):
        outs = [op.transpose(o, tuple(int(i) for i in inv)) for o in outs]
    y = op.concat([op.expand_dims(ctx.emit(o), (nd - 1,)) for o in outs], axis=nd - 1)
    return y if out_dt == dt else op.cast(ctx.emit(y), out_dt)


def _const(arr: np.ndarray) -> Any:
    return g.const(np.asarray(arr))


def _dft_length(node: Any) -> int | None:
    v = node.const_input(1, "dft_length")
    return None if v is None else int(np.asarray(v).reshape(()))


@converter("DFT", since=17)
def dft_v17(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    nd = len(shape_of(x))
    axis = int(node.attr("axis", 1)) % nd
    return _dft(ctx, node, x, axis, _dft_length(node), bool(node.attr("inverse", 0)),
                bool(node.attr("onesided", 0)))


@converter("DFT", since=20)
def dft_v20(ctx: Any, node: Any) -> Any:
    """Opset 20: ``axis`` is an input. When it is only known at run time, the DFT is computed
    along every candidate axis and the result selected; when the candidates differ in shape
    (one-sided), the output dims are bound at run time. An axis outside ``[-r, r - 2]`` (``r``
    the input's rank: the last axis holds the real and imaginary parts) fails the call with a
    RuntimeCheckError (as one known at import is a KilnError), and so does an axis the
    transform cannot be built along (a symbolic length: the DFT matrix needs a static one; a
    one-sided inverse of a length-1 axis: no output)."""
    x = node.input(0)
    nd = len(shape_of(x))
    length = _dft_length(node)
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if not node.has_input(2):
        return _dft(ctx, node, x, nd - 2, length, inverse, onesided)
    const = node.const_value(2)
    if const is not None:
        axis = int(np.asarray(const).reshape(()))
        if not (-nd <= axis <= nd - 2):
            raise node.error(f"axis {axis} out of range for a rank-{nd} input")
        return _dft(ctx, node, x, axis % nd, length, inverse, onesided)
    axis_t = op.cast(op.reshape(node.input(2), ()), "int64")
    axis_t = ctx.emit(op.where(op.less(axis_t, scalar(0, "int64")),
                               op.add(axis_t, scalar(nd, "int64")), axis_t))
    cands, refused = [], []
    for a in range(nd - 1):
        try:
            cands.append((a, ctx.emit(_dft(ctx, node, x, a, length, inverse, onesided))))
        except KilnError as err:  # e.g. a symbolic length, or no output along this axis
            refused.append(f"axis {a}: {str(err).split(': ', 1)[-1]}")
    if not cands:
        raise node.error(f"no axis of the input {x.struct_info} can be transformed")
    ok = op.equal(axis_t, scalar(cands[0][0], "int64"))
    for a, _ in cands[1:]:
        ok = op.logical_or(ok, op.equal(axis_t, scalar(a, "int64")))
    what = (f"axis out of range [{-nd}, {nd - 2}] for a rank-{nd} input (the last axis holds "
            "the real and imaginary parts)" + "".join(f"; {r}" for r in refused))
    out = cands[0][1]  # the default of the selection: any other axis fails the check below
    choices = [(op.equal(axis_t, scalar(a, "int64")), c) for a, c in cands[1:]]
    if len({tuple(str(d) for d in shape_of(c)) for _, c in cands}) != 1:
        # a one-sided output halves the transformed axis: the shape depends on the axis
        out = select_shaped(ctx, node, out, choices)
    else:
        for flag, c in choices:
            out = op.where(flag, c, out)
    return op.check_info(ctx.emit(out), ctx.emit(op.cast(op.logical_not(ok), "int64")),
                         what=what)


# ---- windows --------------------------------------------------------------------------------
_WINDOWS = {
    "HannWindow": (0.5, 0.5, 0.0),
    "HammingWindow": (25.0 / 46.0, 21.0 / 46.0, 0.0),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}


def _window(ctx: Any, node: Any) -> Any:
    a0, a1, a2 = _WINDOWS[node.op_type]
    periodic = bool(node.attr("periodic", 1))
    out_dt = onnx_dtype(int(node.attr("output_datatype", 1)), str(node))
    size = node.const_value(0)
    if size is not None:
        n = int(np.asarray(size).reshape(()))
        denom = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        ang = 2.0 * np.pi * k / denom if denom > 0 else np.zeros(n)
        w = a0 - a1 * np.cos(ang) + a2 * np.cos(2.0 * ang)
        return w.astype(out_dt)
    # run-time size: w = a0 - a1 cos(2 pi k / N) + a2 cos(4 pi k / N) on an arange
    work = "float64" if out_dt == "float64" else "float32"
    size_t = op.cast(op.reshape(node.input(0), ()), "int64")
    size_t = ctx.emit(size_t)
    k = range_rt(ctx, node, _const(np.array(0, np.int64)), size_t, _const(np.array(1, np.int64)))
    k = ctx.emit(op.cast(k, work))
    denom = op.cast(size_t, work)
    if not periodic:
        denom = op.subtract(denom, scalar(1, work))
    ang = ctx.emit(op.divide(op.multiply(k, scalar(2.0 * np.pi, work)), denom))
    w = op.subtract(scalar(a0, work), op.multiply(scalar(a1, work), op.cos(ang)))
    if a2:
        w = op.add(w, op.multiply(scalar(a2, work), op.cos(op.multiply(ang, scalar(2, work)))))
    return op.cast(w, out_dt) if out_dt != work else w


for _name in _WINDOWS:
    converter(_name, since=17)(_window)


# ---- MelWeightMatrix ------------------------------------------------------------------------
def mel_weight_matrix(num_mel_bins: int, dft_length: int, sample_rate: int, lower_hz: float,
                      upper_hz: float) -> np.ndarray:
    """The ONNX MelWeightMatrix ([dft_length // 2 + 1, num_mel_bins] triangular filters)."""
    bins = np.arange(num_mel_bins + 2)
    low = 2595 * np.log1p(lower_hz / 700) / np.log(10)
    high = 2595 * np.log1p(upper_hz / 700) / np.log(10)
    step = (high - low) / bins.shape[0]
    freqs = 700 * np.expm1((bins * step + low) / 2595 * np.log(10))
    points = (((dft_length + 1) * freqs) // sample_rate).astype(np.int64)
    out = np.zeros((dft_length // 2 + 1, num_mel_bins))
    for i in range(num_mel_bins):
        left, center, right = points[i], points[i + 1], points[i + 2]
        if center == left:
            out[center, i] = 1.0
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        if right > center:
            for j in range(center, right):
                out[j, i] = (right - j) / (right - center)
    return out


@converter("MelWeightMatrix", since=17)
def mel(ctx: Any, node: Any) -> Any:
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
             "upper_edge_hertz")
    out_dt = onnx_dtype(int(node.attr("output_datatype", 1)), str(node))
    if not all(node.is_const(i) for i in range(5)):
        return _mel_runtime(ctx, node, out_dt)
    vals = [np.asarray(node.const_input(i, n)).reshape(()) for i, n in enumerate(names)]
    m = mel_weight_matrix(int(vals[0]), int(vals[1]), int(vals[2]), float(vals[3]),
                          float(vals[4]))
    return m.astype(out_dt)


def _mel_runtime(ctx: Any, node: Any, out_dt: str) -> Any:
    """MelWeightMatrix of inputs known at run time: the same triangles as
    ``mel_weight_matrix``, written elementwise over run-time aranges of the spectrogram bins
    ``j`` and the mel bins ``i`` (float64, like the reference)."""
    f64 = "float64"

    def s(v: float) -> Any:
        return scalar(v, f64)

    def arg(i: int, dt: str) -> Any:
        return ctx.emit(op.cast(op.reshape(node.input(i), ()), dt))

    mels, dft, rate = arg(0, "int64"), arg(1, "int64"), arg(2, f64)
    lo, hi = arg(3, f64), arg(4, f64)
    spec = ctx.emit(op.add(op.floor_divide(dft, _i64(2)), _i64(1)))
    i = ctx.emit(op.cast(range_rt(ctx, node, _i64(0), mels, _i64(1)), f64))  # [M]
    j = ctx.emit(op.cast(range_rt(ctx, node, _i64(0), spec, _i64(1)), f64))  # [S]

    def to_mel(hz: Any) -> Any:
        return op.divide(op.multiply(s(2595.0), op.log(op.add(s(1.0), op.divide(hz, s(700.0))))),
                         s(np.log(10.0)))

    low = ctx.emit(to_mel(lo))
    step = ctx.emit(op.divide(op.subtract(to_mel(hi), low),
                              op.add(op.cast(mels, f64), s(2.0))))
    dft1 = ctx.emit(op.add(op.cast(dft, f64), s(1.0)))

    def point(offset: float) -> Any:
        mel = op.add(op.multiply(op.add(i, s(offset)), step), low)
        hz = op.multiply(s(700.0), op.subtract(op.exp(op.multiply(
            op.divide(mel, s(2595.0)), s(np.log(10.0)))), s(1.0)))
        return ctx.emit(op.expand_dims(op.floor(op.divide(op.multiply(dft1, hz), rate)), (0,)))

    left, center, right = point(0.0), point(1.0), point(2.0)  # [1, M]
    jj = ctx.emit(op.expand_dims(j, (1,)))  # [S, 1]
    zero, one = s(0.0), s(1.0)
    rising = op.where(op.logical_and(op.less_equal(left, jj), op.less_equal(jj, center)),
                      op.divide(op.subtract(jj, left), op.subtract(center, left)), zero)
    up = op.where(op.equal(center, left), op.where(op.equal(jj, center), one, zero), rising)
    falling = op.logical_and(op.less_equal(center, jj), op.less(jj, right))
    down = op.divide(op.subtract(right, jj), op.subtract(right, center))
    out = op.where(falling, down, up)
    return op.cast(out, out_dt) if out_dt != f64 else out


# ---- STFT -----------------------------------------------------------------------------------
@converter("STFT", since=17)
def stft(ctx: Any, node: Any) -> Any:
    """Frames ``[batch, frames, frame_length, 1|2]`` gathered from the signal (frame starts
    are an arange, so a run-time ``frame_step`` works), windowed, then a DFT of each frame."""
    x = node.input(0)
    if ndim_of(x) != 3:
        raise node.error(f"the signal must be [batch, length, 1 or 2], got rank {ndim_of(x)}")
    batch, sig_len, comps = shape_of(x)
    sig_len = static_int(sig_len)
    if sig_len is None:
        raise node.error("the signal length is symbolic")
    window = node.input(2)
    if window is None and node.has_input(3) and not node.is_const(3):
        return _stft_runtime_length(ctx, node, x, sig_len)
    flen_v = node.const_input(3, "frame_length")
    if flen_v is not None:
        flen = int(np.asarray(flen_v).reshape(()))
    elif window is not None:
        flen = static_int(shape_of(window)[0])
    else:
        flen = sig_len
    if flen is None or not 0 < flen <= sig_len:
        raise node.error(f"frame_length {flen} must be static and in [1, {sig_len}]")
    onesided = bool(node.attr("onesided", 1))
    step_v = node.const_value(1)
    if step_v is not None:
        step = int(np.asarray(step_v).reshape(()))
        starts: Any = _const(np.arange(0, sig_len - flen + 1, step, dtype=np.int64))
    else:
        step_t = ctx.emit(op.cast(op.reshape(node.input(1), ()), "int64"))
        starts = ctx.emit(range_rt(ctx, node, _const(np.array(0, np.int64)),
                                   _const(np.array(sig_len - flen + 1, np.int64)), step_t))
    offs = _const(np.arange(flen, dtype=np.int64).reshape(1, flen))
    idx = ctx.emit(op.add(op.expand_dims(starts, (1,)), offs))  # [frames, flen]
    frames = ctx.emit(op.take(x, idx, axis=1))  # [batch, frames, flen, comps]
    if window is not None:
        frames = ctx.emit(op.multiply(frames, op.reshape(window, (1, 1, flen, 1))))
    return _dft(ctx, node, frames, 2, flen, False, onesided)


def _i64(v: int) -> Any:
    return _const(np.array(v, np.int64))


def _stft_runtime_length(ctx: Any, node: Any, x: Any, sig_len: int) -> Any:
    """STFT whose ``frame_length`` (the DFT size N) is only known at run time: the frame
    offsets, frequencies and the cos/sin matrix are built from run-time aranges, so their
    symbolic lengths match by construction."""
    work = "float64"
    n_t = ctx.emit(op.cast(op.reshape(node.input(3), ()), "int64"))
    onesided = bool(node.attr("onesided", 1))
    k_t = op.add(op.floor_divide(n_t, _i64(2)), _i64(1)) if onesided else n_t
    n = ctx.emit(range_rt(ctx, node, _i64(0), n_t, _i64(1)))  # [N]
    k = ctx.emit(range_rt(ctx, node, _i64(0), ctx.emit(k_t), _i64(1)))  # [K]
    step_t = ctx.emit(op.cast(op.reshape(node.input(1), ()), "int64"))
    last = ctx.emit(op.add(op.subtract(_i64(sig_len), n_t), _i64(1)))
    starts = ctx.emit(range_rt(ctx, node, _i64(0), last, step_t))  # [F]
    idx = ctx.emit(op.add(op.expand_dims(starts, (1,)), op.expand_dims(n, (0,))))
    frames = ctx.emit(op.cast(op.take(x, idx, axis=1), work))  # [B, F, N, C]
    comps = static_int(shape_of(x)[2])
    # angle[n, k] = 2 pi ((n k) mod N) / N
    nk = op.mod(op.multiply(op.expand_dims(n, (1,)), op.expand_dims(k, (0,))), n_t)
    ang = ctx.emit(op.divide(op.multiply(op.cast(nk, work), scalar(2.0 * np.pi, work)),
                             op.cast(n_t, work)))
    cos_m, sin_m = ctx.emit(op.cos(ang)), ctx.emit(op.sin(ang))
    xr = ctx.emit(_last_part(frames, 0))
    yr = ctx.emit(op.matmul(xr, cos_m))
    yi = ctx.emit(op.negative(op.matmul(xr, sin_m)))
    if comps == 2:
        xi = ctx.emit(_last_part(frames, 1))
        yr = ctx.emit(op.add(yr, op.matmul(xi, sin_m)))
        yi = ctx.emit(op.add(yi, op.matmul(xi, cos_m)))
    y = op.concat([op.expand_dims(yr, (3,)), op.expand_dims(yi, (3,))], axis=3)
    return op.cast(ctx.emit(y), dtype_of(x))
