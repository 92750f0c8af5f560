"""RNN / GRU / LSTM import (unrolled per time step) checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _run_both(op_type: str, *, seq=3, batch=3, inp=2, hidden=3, direction="forward",
              layout=0, bias=True, seq_lens=None, init=False, peep=False, outputs=None,
              seed=0, **attrs):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op_type]
    xshape = [seq, batch, inp] if layout == 0 else [batch, seq, inp]
    hshape = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    feeds = {
        "X": rng.standard_normal(xshape).astype("float32"),
        "W": (rng.standard_normal([dirs, g * hidden, inp]) * 0.7).astype("float32"),
        "R": (rng.standard_normal([dirs, g * hidden, hidden]) * 0.7).astype("float32"),
    }
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        feeds["B"] = rng.standard_normal([dirs, 2 * g * hidden]).astype("float32")
        names[3] = "B"
    if seq_lens is not None:
        feeds["L"] = np.array(seq_lens, dtype="int32")
        names[4] = "L"
    if init:
        feeds["H0"] = rng.standard_normal(hshape).astype("float32")
        names[5] = "H0"
        if op_type == "LSTM":
            feeds["C0"] = rng.standard_normal(hshape).astype("float32")
            names[6] = "C0"
    if peep:
        feeds["P"] = rng.standard_normal([dirs, 3 * hidden]).astype("float32")
        names[7] = "P"
    while names and names[-1] == "":
        names.pop()
    outs = outputs or (["Y", "Y_h", "Y_c"] if op_type == "LSTM" else ["Y", "Y_h"])
    model = _model(op_type, names, outs, feeds, hidden_size=hidden, direction=direction,
                   layout=layout, **attrs)
    # onnxruntime runs only layout 0: the reference is the time-major model on transposed data
    ref_feeds = {n: (np.swapaxes(v, 0, 1) if layout and n in ("X", "H0", "C0") else v)
                 for n, v in feeds.items()}
    ref_model = _model(op_type, names, outs, ref_feeds, hidden_size=hidden, direction=direction,
                       **attrs)
    sess = ort.InferenceSession(ref_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, ref_feeds)
    if layout:
        ref = [np.transpose(r, (2, 0, 1, 3)) if r.ndim == 4 else np.swapaxes(r, 0, 1)
               for r in ref]
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _model(op_type, names, outs, feeds, **attrs):
    node = helper.make_node(op_type, names, outs, **attrs)
    elem = {"L": TensorProto.INT32}
    ins = [helper.make_tensor_value_info(n, elem.get(n, F), list(v.shape))
           for n, v in feeds.items()]
    outs_vi = [helper.make_tensor_value_info(o, F, None) for o in outs if o]
    graph = helper.make_graph([node], "g", ins, outs_vi)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_rnn_directions_and_initial_state(direction):
    _run_both("RNN", direction=direction, init=True)


def test_rnn_activation_attrs_and_clip():
    _run_both("RNN", activations=["Affine"], activation_alpha=[0.5], activation_beta=[0.25],
              clip=1.5, bias=False)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset_bidirectional(lbr):
    _run_both("GRU", direction="bidirectional", linear_before_reset=lbr, init=True)


def test_gru_layout_batch_major_with_seq_lens():
    _run_both("GRU", layout=1, seq_lens=[3, 2, 1], init=True)


def test_gru_custom_activations():
    _run_both("GRU", activations=["HardSigmoid", "LeakyRelu"], activation_alpha=[0.3, 0.1],
              activation_beta=[0.4], clip=2.0)


def test_lstm_peepholes_initial_state_bidirectional():
    _run_both("LSTM", direction="bidirectional", init=True, peep=True)


def test_lstm_seq_lens_bidirectional():
    _run_both("LSTM", direction="bidirectional", seq_lens=[2, 3, 1], init=True)


def test_lstm_input_forget_clip_only_y_c():
    _run_both("LSTM", input_forget=1, clip=0.8, outputs=["", "", "Y_c"])


def test_lstm_symbolic_sequence_length_errors():
    node = helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=2, name="lstm0")
    ins = [helper.make_tensor_value_info("X", F, ["T", 1, 2]),
           helper.make_tensor_value_info("W", F, [1, 8, 2]),
           helper.make_tensor_value_info("R", F, [1, 8, 2])]
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("Y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    with pytest.raises(KilnError, match="lstm0.*static sequence length"):
        from_onnx(onnx.ModelProto.FromString(model.SerializeToString()))
