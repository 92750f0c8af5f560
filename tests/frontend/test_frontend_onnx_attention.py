"""Attention and normalization ONNX operators, checked against onnx.reference on random inputs
with shapes and attribute combinations the backend node suite does not cover."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError

_ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
         "bfloat16": TensorProto.BFLOAT16,
         "float64": TensorProto.DOUBLE, "bool": TensorProto.BOOL, "int64": TensorProto.INT64}


def _model(op_type: str, feeds: dict, outputs: list[str], opset: int, names: list[str] | None
           = None, domain: str = "", **attrs):
    names = list(feeds) if names is None else names
    node = helper.make_node(op_type, names, outputs, domain=domain, **attrs)
    inputs = [helper.make_tensor_value_info(n, _ELEM[str(v.dtype)], v.shape)
              for n, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
            for o in outputs if o]
    graph = helper.make_graph([node], op_type.lower(), inputs, outs)
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports)


def _check(model, feeds: dict, rtol: float = 1e-5, atol: float = 1e-5, ref=None):
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(**feeds)
    got = got if isinstance(got, (list, tuple)) else [got]
    want = ref if ref is not None else ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for g_, w in zip(got, want):
        g_ = np.asarray(g_)
        assert g_.dtype == w.dtype and g_.shape == w.shape
        np.testing.assert_allclose(g_.astype("float64"), w.astype("float64"), rtol=rtol,
                                   atol=atol)


def _rand(rng, *shape, dtype="float32", scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---- Attention ------------------------------------------------------------------------------
def test_attention_3d_gqa_causal_past_float_mask_mode2():
    rng = np.random.default_rng(0)
    feeds = {"Q": _rand(rng, 2, 3, 8 * 4), "K": _rand(rng, 2, 3, 2 * 4),
             "V": _rand(rng, 2, 3, 2 * 5), "M": _rand(rng, 1, 3, 5),
             "PK": _rand(rng, 2, 2, 4, 4), "PV": _rand(rng, 2, 2, 4, 5)}
    model = _model("Attention", feeds, ["Y", "PKo", "PVo", "QK"], 23, q_num_heads=8,
                   kv_num_heads=2, is_causal=1, qk_matmul_output_mode=2, scale=0.3)
    _check(model, feeds)


def test_attention_4d_bool_mask_softcap_mode3_fully_masked_row():
    rng = np.random.default_rng(1)
    mask = rng.random((2, 1, 4, 6)) > 0.4
    mask[0, 0, 1, :] = False  # a query row with no attendable key gives zeros, not NaN
    feeds = {"Q": _rand(rng, 2, 3, 4, 8), "K": _rand(rng, 2, 3, 6, 8),
             "V": _rand(rng, 2, 3, 6, 8), "M": mask}
    model = _model("Attention", feeds, ["Y", "", "", "QK"], 23, softcap=1.5,
                   qk_matmul_output_mode=3)
    _check(model, feeds)


def test_attention_nonpad_causal_window_opset25():
    rng = np.random.default_rng(2)
    feeds = {"Q": _rand(rng, 2, 2, 3, 4), "K": _rand(rng, 2, 2, 7, 4),
             "V": _rand(rng, 2, 2, 7, 4), "M": _rand(rng, 3, 7),
             "N": np.array([5, 7], dtype="int64")}
    model = _model("Attention", feeds, ["Y"], 25, names=["Q", "K", "V", "M", "", "", "N"],
                   is_causal=1, left_window_size=1)
    _check(model, feeds)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("precision", [None, TensorProto.FLOAT])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_half_precision_follows_the_definition(dtype, precision, causal):
    """A 16-bit Attention computes every step of its definition in its input type and the
    softmax in softmax_precision (default: the input type): bit for bit what onnx.reference
    gives, on GQA heads with a float mask, rows of 6, 13 and 40 keys (sequential sums), Y and
    the mode-3 probabilities. (Without softcap: the reference promotes a half-precision
    softcap to float32, the definition's function body computes it in the input type.)"""
    rng = np.random.default_rng(4)
    for kv in (6, 13, 40):
        feeds = {"Q": _rand(rng, 2, 4, 5, 8, dtype=dtype), "K": _rand(rng, 2, 2, kv, 8,
                                                                       dtype=dtype),
                 "V": _rand(rng, 2, 2, kv, 8, dtype=dtype), "M": _rand(rng, 5, kv, dtype=dtype)}
        attrs = {} if precision is None else {"softmax_precision": precision}
        model = _model("Attention", feeds, ["Y", "", "", "QK"], 23, is_causal=causal,
                       qk_matmul_output_mode=3, **attrs)
        _check(model, feeds, rtol=0, atol=0)


def test_attention_bfloat16_softmax_precision_float_is_accurate_on_long_rows():
    """The bfloat16 default (a bfloat16 softmax, its row sum rounded after every add) drifts
    on long rows; softmax_precision=FLOAT keeps the probabilities within two bfloat16 ulps of
    the exact ones."""
    rng = np.random.default_rng(5)
    feeds = {"Q": _rand(rng, 1, 1, 2, 16, dtype="bfloat16", scale=0.1),
             "K": _rand(rng, 1, 1, 1024, 16, dtype="bfloat16", scale=0.1),
             "V": _rand(rng, 1, 1, 1024, 16, dtype="bfloat16")}
    exact = {}
    for precision in (None, TensorProto.FLOAT):
        attrs = {} if precision is None else {"softmax_precision": precision}
        model = _model("Attention", feeds, ["Y", "", "", "QK"], 23, qk_matmul_output_mode=3,
                       **attrs)
        mod, params = from_onnx(model)
        exact[precision] = np.asarray(kiln.build(mod, params=params)(**feeds)[1], "float64")
    q, k = (feeds[n].astype("float64") for n in "QK")
    root = float(np.asarray(np.sqrt(0.25), "bfloat16"))
    qs, ks = (np.asarray(x * root, "bfloat16").astype("float64") for x in (q, k))
    logits = np.asarray(qs @ ks.transpose(0, 1, 3, 2), "bfloat16").astype("float64")
    e = np.exp(logits - logits.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(exact[TensorProto.FLOAT], probs, rtol=2 ** -7)
    assert np.abs(exact[None] / probs - 1).max() > 2 ** -7


def test_attention_errors_name_the_node():
    feeds = {n: np.zeros((1, 2, 8), "float32") for n in ("Q", "K", "V")}
    with pytest.raises(KilnError, match="Attention node.*q_num_heads"):
        from_onnx(_model("Attention", feeds, ["Y"], 23))
    with pytest.raises(KilnError, match="multiple of kv heads"):
        from_onnx(_model("Attention", feeds, ["Y"], 23, q_num_heads=2, kv_num_heads=4))


# ---- normalizations -------------------------------------------------------------------------
def test_rms_normalization_float16_and_axis():
    rng = np.random.default_rng(4)
    feeds = {"X": _rand(rng, 2, 3, 6), "W": _rand(rng, 3, 6)}
    _check(_model("RMSNormalization", feeds, ["Y"], 23, axis=-2, epsilon=1e-3), feeds)
    half = {"X": _rand(rng, 2, 6, dtype="float16"), "W": _rand(rng, 6, dtype="float16")}
    _check(_model("RMSNormalization", half, ["Y"], 23), half, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_per_group_and_per_channel_affine(opset):
    rng = np.random.default_rng(5)
    groups = 3
    n_affine = groups if opset == 18 else 6
    feeds = {"X": _rand(rng, 2, 6, 2, 3), "S": _rand(rng, n_affine), "B": _rand(rng, n_affine)}
    model = _model("GroupNormalization", feeds, ["Y"], opset, num_groups=groups)
    x = feeds["X"].reshape(2, groups, -1)
    y = ((x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5))
    rep = 1 if opset == 21 else 2
    s = np.repeat(feeds["S"], rep).reshape(1, 6, 1, 1)
    b = np.repeat(feeds["B"], rep).reshape(1, 6, 1, 1)
    _check(model, feeds, ref=[(y.reshape(2, 6, 2, 3) * s + b).astype("float32")])


def test_instance_lrn_mvn_normalizations():
    rng = np.random.default_rng(6)
    feeds = {"X": _rand(rng, 2, 3, 4, 5), "S": _rand(rng, 3), "B": _rand(rng, 3)}
    _check(_model("InstanceNormalization", feeds, ["Y"], 22, epsilon=1e-3), feeds)
    x = {"X": _rand(rng, 2, 5, 3, 3)}
    # the spec's window [c - floor((size-1)/2), c + ceil((size-1)/2)] (onnx.reference's LRN
    # loops over the batch axis instead of the channels, so it is only right for N == C)
    sq = np.pad(x["X"] ** 2, ((0, 0), (1, 2), (0, 0), (0, 0)))
    total = sum(sq[:, j:j + 5] for j in range(4))
    want = (x["X"] / (1.5 + 0.01 / 4 * total) ** 0.6).astype("float32")
    _check(_model("LRN", x, ["Y"], 13, size=4, alpha=0.01, beta=0.6, bias=1.5), x,
           ref=[want])
    _check(_model("MeanVarianceNormalization", x, ["Y"], 13, axes=[1, 3]), x, atol=1e-4)


def test_lp_normalization_zero_lines_and_l1():
    rng = np.random.default_rng(7)
    x = _rand(rng, 3, 4)
    x[1] = 0.0  # an all-zero line normalizes to zeros
    feeds = {"X": x}
    _check(_model("LpNormalization", feeds, ["Y"], 22, axis=1, p=2), feeds)
    norm = np.abs(x).sum(1, keepdims=True)  # the L1 norm (onnx.reference sums signed values)
    want = np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype("float32")
    _check(_model("LpNormalization", feeds, ["Y"], 22, axis=1, p=1), feeds, ref=[want])


# ---- rotary embedding, recurrent and flex attention -----------------------------------------
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_3d_partial(interleaved):
    rng = np.random.default_rng(8)
    feeds = {"X": _rand(rng, 2, 3, 2 * 8), "C": _rand(rng, 10, 3), "S": _rand(rng, 10, 3),
             "P": rng.integers(0, 10, (2, 3)).astype("int64")}
    model = _model("RotaryEmbedding", feeds, ["Y"], 23, num_heads=2, rotary_embedding_dim=6,
                   interleaved=interleaved)
    _check(model, feeds)


def test_linear_attention_gated_delta_gqa_with_past():
    rng = np.random.default_rng(9)
    feeds = {"Q": _rand(rng, 1, 3, 4 * 4), "K": _rand(rng, 1, 3, 2 * 4, scale=0.5),
             "V": _rand(rng, 1, 3, 2 * 3), "P": _rand(rng, 1, 2, 4, 3),
             "D": _rand(rng, 1, 3, 2, scale=0.1), "B": rng.random((1, 3, 2)).astype("float32")}
    model = _model("LinearAttention", feeds, ["Y", "S"], 27, q_num_heads=4, kv_num_heads=2)
    _check(model, feeds)


def test_causal_conv_with_state_silu_past():
    rng = np.random.default_rng(10)
    feeds = {"X": _rand(rng, 2, 3, 5), "W": _rand(rng, 3, 1, 3), "B": _rand(rng, 3),
             "P": _rand(rng, 2, 3, 2)}
    _check(_model("CausalConvWithState", feeds, ["Y", "S"], 27, activation="silu"), feeds)


def test_flex_attention_score_mod_gqa():
    rng = np.random.default_rng(11)
    bias = numpy_helper.from_array(np.float32(0.5).reshape(()), "half")
    body = helper.make_graph(
        [helper.make_node("Mul", ["s", "half"], ["o"])], "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)], [bias])
    feeds = {"Q": _rand(rng, 1, 4, 3, 8), "K": _rand(rng, 1, 2, 5, 8),
             "V": _rand(rng, 1, 2, 5, 6)}
    model = _model("FlexAttention", feeds, ["Y"], 26, domain="ai.onnx.preview",
                   score_mod=body)
    _check(model, feeds)


def test_linear_attention_long_sequence_is_rejected_by_name():
    feeds = {n: np.zeros((1, 65, 8), "float32") for n in ("Q", "K", "V")}
    model = _model("LinearAttention", feeds, ["Y", "S"], 27, q_num_heads=2, kv_num_heads=2,
                   update_rule="linear")
    with pytest.raises(KilnError, match="LinearAttention node.*unrolled"):
        from_onnx(model)
