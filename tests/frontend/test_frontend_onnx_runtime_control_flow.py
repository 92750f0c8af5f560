"""Control flow decided while the model runs (``kiln.runtime.control_flow``): Loops with
data-dependent trip counts, run-time Ifs, Scans over symbolic lengths, nested control flow,
models built in the tests and checked against onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.graph import well_formed
from kiln.ir import KilnError
from kiln.testing.onnx_graphs import (
    constant_node,
    onnx_model,
    pad_amounts_chain,
    squeeze_if_last_dim_is_one,
)
from kiln.testing.onnx_graphs import value_info as _vi

ort = pytest.importorskip("onnxruntime")

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(0)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _check(model, feed_sets, exe=None, rtol=1e-5, atol=1e-5, **kw):
    """kiln vs onnxruntime on each feed dict; returns the executable."""
    if exe is None:
        mod, params = from_onnx(model, **kw)
        well_formed(mod)
        exe = kiln.build(mod, params=params)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in feed_sets:
        got = exe(**feeds)
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        ref = sess.run(None, feeds)
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return exe


def _growing_sequence_model():
    """Loop(M) appending to a sequence whose length changes every iteration; a nested If on
    the iteration's parity picks how the next entry is made; stops once the sum passes a
    run-time limit; the new entries are the scan output."""
    then_b = helper.make_graph([helper.make_node("Mul", ["last", "two"], ["t"])], "then", [],
                               [_vi("t", None)])
    else_b = helper.make_graph([helper.make_node("Add", ["last", "one"], ["e"])], "else", [],
                               [_vi("e", None)])
    body = helper.make_graph(
        [helper.make_node("Gather", ["seq_in", "m1"], ["last0"], axis=0),
         helper.make_node("Unsqueeze", ["last0", "ax0"], ["last"]),
         helper.make_node("Mod", ["i", "two_i"], ["par"]),
         helper.make_node("Equal", ["par", "zero_i"], ["even"]),
         helper.make_node("If", ["even"], ["nxt"], then_branch=then_b, else_branch=else_b),
         helper.make_node("Concat", ["seq_in", "nxt"], ["seq_out"], axis=0),
         helper.make_node("ReduceSum", ["seq_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "limit"], ["c_out"]),
         helper.make_node("Identity", ["nxt"], ["entry"])],
        "body", [_vi("i", [], I64), _vi("c_in", [], B), _vi("seq_in", None)],
        [_vi("c_out", [], B), _vi("seq_out", None), _vi("entry", None)],
        [_init("m1", np.int64(-1)), _init("ax0", np.array([0], np.int64)),
         _init("two_i", np.int64(2)), _init("zero_i", np.int64(0))])
    node = helper.make_node("Loop", ["M", "", "seq0"], ["seq", "entries"], body=body)
    return onnx_model([node], [_vi("M", [], I64), _vi("seq0", [1]), _vi("limit", [])],
                      [_vi("seq", None), _vi("entries", None)],
                      [_init("two", np.float32(2)), _init("one", np.float32(1))], opset=17)


def test_loop_with_changing_shapes_and_nested_if_saves_and_loads(tmp_path):
    model = _growing_sequence_model()
    mod, params = from_onnx(model)
    assert {"seq_body", "nxt_then", "nxt_else"} <= set(mod.functions)
    exe = kiln.build(mod, params=params)
    feeds = [{"M": np.array(m, np.int64), "seq0": np.array([1.0], np.float32),
              "limit": np.array(lim, np.float32)} for m, lim in [(5, 1e9), (20, 100.0),
                                                                 (1, 1e9), (64, 1e30)]]
    _check(model, feeds, exe=exe)
    path = os.path.join(tmp_path, "loop.kiln")
    exe.save(path)
    _check(model, feeds, exe=kiln.load(path))


def test_scan_over_a_symbolic_length_runs_at_run_time():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "w"], ["y_t"])],
        "body", [_vi("s_in", [2]), _vi("x_t", [2])], [_vi("s_out", [2]), _vi("y_t", [2])])
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[1], scan_output_axes=[1])
    model = onnx_model([node], [_vi("s0", [2]), _vi("x", ["T", 2]), _vi("w", [2])],
                       [_vi("s", [2]), _vi("ys", [2, "T"])], opset=17)
    _check(model, [{"s0": RNG.standard_normal(2).astype(np.float32),
                    "x": RNG.standard_normal((t, 2)).astype(np.float32),
                    "w": RNG.standard_normal(2).astype(np.float32)} for t in (1, 5, 40)])


def test_if_whose_branches_differ_in_rank_names_the_node():
    then_b = helper.make_graph([helper.make_node("Squeeze", ["x", "ax"], ["t"])], "then", [],
                               [_vi("t", None)])
    else_b = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [_vi("e", None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b,
                            name="rank_if")
    model = onnx_model([node], [_vi("c", [], B), _vi("x", [3, 1])], [_vi("y", None)],
                       [_init("ax", np.array([1], np.int64))])
    with pytest.raises(KilnError, match="rank_if.*differs in rank"):
        from_onnx(model)


def _mm(a, w, out):
    return helper.make_node("MatMul", [a, w], [out])


def _decoder_model(vocab=16, d=8, ff=16, max_len=32, prompt=3):
    """Greedy decoding: Loop(max_new) runs a one-layer causal transformer decoder over the
    tokens so far, appends the argmax of the last position's logits, stops at ``eos``."""
    r = np.random.default_rng(1)

    def w(*shape):
        return (r.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    inits = [_init("E", w(vocab, d) * 3), _init("P", w(max_len, d)), _init("Wq", w(d, d)),
             _init("Wk", w(d, d)), _init("Wv", w(d, d)), _init("Wo", w(d, d)),
             _init("W1", w(d, ff)), _init("W2", w(ff, d)), _init("Wout", w(d, vocab) * 4),
             _init("ln_s", np.ones(d, np.float32)), _init("ln_b", np.zeros(d, np.float32)),
             _init("scale", np.float32(1 / np.sqrt(d))), _init("neg", np.float32(-1e9)),
             _init("zero_f", np.float32(0))]
    body_inits = [_init("b_zero", np.array([0], np.int64)),
                  _init("b_one", np.array([1], np.int64)), _init("b_two", np.array([2], np.int64)),
                  _init("s_zero", np.int64(0)), _init("s_one", np.int64(1))]
    nodes = [
        helper.make_node("Gather", ["E", "tok_in"], ["emb"], axis=0),  # [1, L, d]
        helper.make_node("Shape", ["tok_in"], ["tshape"]),
        helper.make_node("Slice", ["tshape", "b_one", "b_two"], ["L1"]),  # [L]
        helper.make_node("Slice", ["P", "b_zero", "L1", "b_zero"], ["pos"]),  # [L, d]
        helper.make_node("Add", ["emb", "pos"], ["h0"]),
        helper.make_node("LayerNormalization", ["h0", "ln_s", "ln_b"], ["h"], axis=-1),
        _mm("h", "Wq", "q"), _mm("h", "Wk", "k"), _mm("h", "Wv", "v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        _mm("q", "kt", "qk"), helper.make_node("Mul", ["qk", "scale"], ["sc"]),
        helper.make_node("Squeeze", ["L1"], ["L"]),
        helper.make_node("Range", ["s_zero", "L", "s_one"], ["idx"]),
        helper.make_node("Unsqueeze", ["idx", "b_one"], ["rows"]),  # [L, 1]
        helper.make_node("Less", ["rows", "idx"], ["above"]),  # [L, L]: key after query
        helper.make_node("Where", ["above", "neg", "zero_f"], ["mask"]),
        helper.make_node("Add", ["sc", "mask"], ["scm"]),
        helper.make_node("Softmax", ["scm"], ["att"], axis=-1),
        _mm("att", "v", "ctx"), _mm("ctx", "Wo", "proj"),
        helper.make_node("Add", ["h", "proj"], ["h2"]),
        _mm("h2", "W1", "f1"), helper.make_node("Relu", ["f1"], ["f1r"]), _mm("f1r", "W2", "f2"),
        helper.make_node("Add", ["h2", "f2"], ["h3"]),
        helper.make_node("Sub", ["L1", "b_one"], ["lastpos"]),
        helper.make_node("Gather", ["h3", "lastpos"], ["hl"], axis=1),  # [1, 1, d]
        _mm("hl", "Wout", "logits"),  # [1, 1, vocab]
        helper.make_node("ArgMax", ["logits"], ["nxt3"], axis=-1, keepdims=0),  # [1, 1]
        helper.make_node("Concat", ["tok_in", "nxt3"], ["tok_out"], axis=1),
        helper.make_node("Reshape", ["nxt3", "b_one"], ["nxt"]),  # [1]
        helper.make_node("Equal", ["nxt", "eos"], ["is_eos"]),
        helper.make_node("Not", ["is_eos"], ["go1"]),
        helper.make_node("Squeeze", ["go1"], ["c_out"]),
    ]
    body = helper.make_graph(nodes, "decode", [_vi("i", [], I64), _vi("c_in", [], B),
                                               _vi("tok_in", [1, None], I64)],
                             [_vi("c_out", [], B), _vi("tok_out", [1, None], I64),
                              _vi("nxt", [1], I64)], body_inits)
    loop = helper.make_node("Loop", ["max_new", "", "prompt"], ["tokens", "new"], body=body,
                            name="greedy")
    return onnx_model([loop], [_vi("prompt", [1, prompt], I64), _vi("max_new", [], I64),
                               _vi("eos", [1], I64)],
                      [_vi("tokens", [1, None], I64), _vi("new", [None, 1], I64)], inits,
                      opset=17)


def test_greedy_decoding_loop_over_a_tiny_transformer_decoder():
    model = _decoder_model()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prompt = np.array([[3, 1, 4]], np.int64)
    free = sess.run(None, {"prompt": prompt, "max_new": np.array(12, np.int64),
                           "eos": np.array([-1], np.int64)})[1]
    assert len(np.unique(free)) > 1  # the decoder really depends on its input
    eos = free[4]  # stops after five new tokens (or earlier, if it came up before)
    _check(model, [{"prompt": prompt, "max_new": np.array(m, np.int64), "eos": e}
                   for m, e in [(12, np.array([-1])), (12, eos), (1, np.array([-1]))]])


def _nms_model():
    """Greedy NMS as a Loop whose trip count is the data: pick the best box, drop the boxes
    overlapping it by more than the threshold (Compress: the carried boxes shrink), until none
    are left."""
    split = [helper.make_node("Split", [src], [f"{src}_{c}" for c in ("x1", "y1", "x2", "y2")],
                              axis=1, num_outputs=4) for src in ("best", "bx_in")]
    nodes = [
        helper.make_node("ArgMax", ["sc_in"], ["bi"], axis=0, keepdims=1),  # [1]
        helper.make_node("Gather", ["bx_in", "bi"], ["best"], axis=0),  # [1, 4]
        helper.make_node("Gather", ["sc_in", "bi"], ["best_score"], axis=0),  # [1]
        *split,
        helper.make_node("Max", ["best_x1", "bx_in_x1"], ["ix1"]),
        helper.make_node("Max", ["best_y1", "bx_in_y1"], ["iy1"]),
        helper.make_node("Min", ["best_x2", "bx_in_x2"], ["ix2"]),
        helper.make_node("Min", ["best_y2", "bx_in_y2"], ["iy2"]),
        helper.make_node("Sub", ["ix2", "ix1"], ["iw0"]),
        helper.make_node("Sub", ["iy2", "iy1"], ["ih0"]),
        helper.make_node("Relu", ["iw0"], ["iw"]), helper.make_node("Relu", ["ih0"], ["ih"]),
        helper.make_node("Mul", ["iw", "ih"], ["inter"]),
        helper.make_node("Sub", ["bx_in_x2", "bx_in_x1"], ["w_all"]),
        helper.make_node("Sub", ["bx_in_y2", "bx_in_y1"], ["h_all"]),
        helper.make_node("Mul", ["w_all", "h_all"], ["area_all"]),
        helper.make_node("Sub", ["best_x2", "best_x1"], ["w_b"]),
        helper.make_node("Sub", ["best_y2", "best_y1"], ["h_b"]),
        helper.make_node("Mul", ["w_b", "h_b"], ["area_b"]),
        helper.make_node("Add", ["area_all", "area_b"], ["area_sum"]),
        helper.make_node("Sub", ["area_sum", "inter"], ["union"]),
        helper.make_node("Div", ["inter", "union"], ["iou2"]),
        helper.make_node("Squeeze", ["iou2", "ax1"], ["iou"]),  # [n]
        helper.make_node("Less", ["iou", "thr"], ["keep"]),
        helper.make_node("Compress", ["bx_in", "keep"], ["bx_out"], axis=0),
        helper.make_node("Compress", ["sc_in", "keep"], ["sc_out"], axis=0),
        helper.make_node("Shape", ["sc_out"], ["n_left"]),
        helper.make_node("Greater", ["n_left", "zero"], ["more"]),
        helper.make_node("Squeeze", ["more"], ["c_out"]),
        helper.make_node("Squeeze", ["best", "ax0"], ["picked"]),  # [4]
    ]
    body = helper.make_graph(nodes, "nms", [_vi("i", [], I64), _vi("c_in", [], B),
                                            _vi("bx_in", [None, 4]), _vi("sc_in", [None])],
                             [_vi("c_out", [], B), _vi("bx_out", [None, 4]),
                              _vi("sc_out", [None]), _vi("picked", [4]),
                              _vi("best_score", [1])])
    outer = [helper.make_node("Shape", ["scores"], ["n0"]),
             helper.make_node("Greater", ["n0", "zero"], ["any0"]),
             helper.make_node("Squeeze", ["any0"], ["c0"]),
             helper.make_node("Loop", ["", "c0", "boxes", "scores"],
                              ["bx_left", "sc_left", "kept", "kept_scores"], body=body,
                              name="nms_loop")]
    inits = [_init("zero", np.array([0], np.int64)), _init("ax0", np.array([0], np.int64)),
             _init("ax1", np.array([1], np.int64))]
    return onnx_model(outer, [_vi("boxes", ["N", 4]), _vi("scores", ["N"]), _vi("thr", [])],
                      [_vi("kept", None), _vi("kept_scores", None)], inits, opset=18)


def _boxes(n):
    xy = RNG.uniform(0, 10, (n, 2)).astype(np.float32)
    wh = RNG.uniform(1, 4, (n, 2)).astype(np.float32)
    return np.concatenate([xy, xy + wh], axis=1)


def test_nms_loop_with_a_data_dependent_trip_count():
    model = _nms_model()
    mod, _ = from_onnx(model)
    assert "nms_loop_body" in mod.functions
    _check(model, [{"boxes": _boxes(n), "scores": RNG.permutation(n).astype(np.float32),
                    "thr": np.array(t, np.float32)} for n, t in [(1, 0.5), (12, 0.3),
                                                                 (40, 0.5), (40, 0.95)]])


def _vad_branch(p: str, n_fft: int, hop: int, hidden: int) -> tuple:
    """One sample rate's front end and classifier: reflect pad (amounts computed from
    constants as torch exports them), a strided conv STFT, the If that squeezes a last dim of
    1, magnitudes, an LSTM from the carried state, a sigmoid. Returns (graph, initializers)."""
    r = np.random.default_rng(n_fft)
    bins = n_fft // 2 + 1
    t = np.arange(n_fft)
    k = np.arange(bins)[:, None]
    window = np.hanning(n_fft + 1)[:n_fft]
    basis = np.concatenate([np.cos(2 * np.pi * k * t / n_fft), -np.sin(2 * np.pi * k * t / n_fft)])
    inits = [_init(p + "K", (basis * window)[:, None, :].astype(np.float32)),
             _init(p + "W", (r.standard_normal((1, 4 * hidden, bins)) * 0.3).astype(np.float32)),
             _init(p + "R", (r.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32)),
             _init(p + "B", (r.standard_normal((1, 8 * hidden)) * 0.1).astype(np.float32)),
             _init(p + "Wp", r.standard_normal((hidden, 1)).astype(np.float32))]
    nodes = [
        constant_node(p + "ax1", np.array([1], np.int64)),
        helper.make_node("Unsqueeze", ["x", p + "ax1"], [p + "xu"]),
        *pad_amounts_chain(n_fft // 2, 3, p + "pads", prefix=p),
        helper.make_node("Pad", [p + "xu", p + "pads"], [p + "xp"], mode="reflect"),
        helper.make_node("Conv", [p + "xp", p + "K"], [p + "spec"], strides=[hop]),
        *squeeze_if_last_dim_is_one(p + "spec", p + "spec2"),
        constant_node(p + "s0", np.array([0], np.int64)),
        constant_node(p + "s1", np.array([bins], np.int64)),
        constant_node(p + "s2", np.array([2 * bins], np.int64)),
        helper.make_node("Slice", [p + "spec2", p + "s0", p + "s1", p + "ax1"], [p + "re"]),
        helper.make_node("Slice", [p + "spec2", p + "s1", p + "s2", p + "ax1"], [p + "im"]),
        helper.make_node("Mul", [p + "re", p + "re"], [p + "re2"]),
        helper.make_node("Mul", [p + "im", p + "im"], [p + "im2"]),
        helper.make_node("Add", [p + "re2", p + "im2"], [p + "pow"]),
        helper.make_node("Sqrt", [p + "pow"], [p + "mag"]),
        helper.make_node("Transpose", [p + "mag"], [p + "seq"], perm=[2, 0, 1]),
        helper.make_node("LSTM", [p + "seq", p + "W", p + "R", p + "B", "", "h", "c"],
                         [p + "Y", p + "h_out", p + "c_out"], hidden_size=hidden),
        helper.make_node("MatMul", [p + "h_out", p + "Wp"], [p + "logit"]),
        helper.make_node("Sigmoid", [p + "logit"], [p + "prob"]),
    ]
    graph = helper.make_graph(nodes, p + "branch", [],
                              [_vi(p + "prob", None), _vi(p + "h_out", None),
                               _vi(p + "c_out", None)])
    return graph, inits


def test_vad_model_with_stft_under_if_and_lstm_state_carried_between_calls():
    hidden = 4
    b16, i16 = _vad_branch("a_", 16, 8, hidden)
    b8, i8 = _vad_branch("b_", 8, 4, hidden)
    nodes = [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["prob", "h_next", "c_next"], then_branch=b16,
                              else_branch=b8, name="by_rate")]
    model = onnx_model(nodes, [_vi("x", [1, 64]), _vi("sr", [], I64), _vi("h", [1, 1, hidden]),
                               _vi("c", [1, 1, hidden])],
                       [_vi("prob", None), _vi("h_next", None), _vi("c_next", None)],
                       [_init("sr16k", np.int64(16000)), *i16, *i8], opset=17)
    mod, params = from_onnx(model)
    assert {"by_rate_then", "by_rate_else"} <= set(mod.functions)
    exe = kiln.build(mod, params=params)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for sr in (16000, 8000):
        zeros = np.zeros((1, 1, hidden), np.float32)
        state, ref_state = (zeros, zeros), (zeros, zeros)
        for _ in range(3):  # a stream of chunks: the state of one call feeds the next
            x = RNG.standard_normal((1, 64)).astype(np.float32)
            sr_a = np.array(sr, np.int64)
            got = exe(x, sr_a, *state)
            ref = sess.run(None, {"x": x, "sr": sr_a, "h": ref_state[0], "c": ref_state[1]})
            for a, b in zip(got, ref):
                assert a.shape == b.shape
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
            state, ref_state = tuple(got[1:]), tuple(ref[1:])
