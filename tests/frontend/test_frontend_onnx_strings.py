"""ONNX string tensors (``kiln.op.strings``): StringNormalizer, StringConcat, StringSplit,
RegexFullMatch, Equal on strings, Cast to and from STRING, ai.onnx.ml LabelEncoder and
CategoryMapper; string graph inputs, outputs and initializers. Checked against onnxruntime
(onnx.reference for Cast to STRING, whose text onnxruntime writes differently) on random text,
and in a tokenizer-like model that feeds strings into ordinary tensor ops.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.errors import ArgumentError, KilnError

S = TensorProto.STRING
ML = "ai.onnx.ml"
WORDS = ["Monday", "tuesday", "the", "THE", "a", "zebra", "éclair", "naïve", "", "x y  z"]


def _model(nodes, inputs, outputs, initializers=(), opset=20):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid(ML, 4)])


def _words(rng, shape):
    return np.array(rng.choice(WORDS, size=shape), dtype=object)


def _kiln(model, feeds):
    mod, params = from_onnx(model)
    out = kiln.build(mod, params=params)(**feeds)
    return list(out) if isinstance(out, tuple) else [out]


def _same(got, want, what):
    want = np.asarray(want)
    assert got.shape == want.shape, what
    if want.dtype.kind in "OUS":
        assert got.dtype == object, what
        assert got.tolist() == want.astype(object).tolist(), what
    else:
        assert got.dtype == want.dtype, what
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=what)


def _check(model, feeds, reference="ort"):
    got = _kiln(model, feeds)
    if reference == "ort":
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
    else:
        want = ReferenceEvaluator(model).run(None, feeds)
    for o, a, b in zip(model.graph.output, got, want):
        _same(a, b, o.name)
    return got


def test_concat_split_regex_equal():
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("StringConcat", ["a", "b"], ["ab"]),
             n("StringConcat", ["a", "sep"], ["asep"]),
             n("StringSplit", ["a"], ["words", "nwords"]),
             n("RegexFullMatch", ["a"], ["caps"], pattern=r"[A-Z][a-z]+"),
             n("Equal", ["a", "b"], ["eq"])]
    sep = numpy_helper.from_array(np.array(["-"], dtype=object), "sep")
    model = _model(nodes, [("a", S, (3, 4)), ("b", S, (4,))],
                   [("ab", S), ("asep", S), ("words", S), ("nwords", TensorProto.INT64),
                    ("caps", TensorProto.BOOL), ("eq", TensorProto.BOOL)], [sep])
    for seed in range(3):
        rng = np.random.default_rng(seed)
        feeds = {"a": _words(rng, (3, 4)), "b": _words(rng, (4,))}
        feeds["b"][0] = feeds["a"][1, 0]  # some equal pairs
        _check(model, feeds)


def test_string_split_with_delimiter():
    """An explicit delimiter: consecutive ones delimit empty strings; an empty string is one
    empty substring (the ONNX reference, Python's str.split; onnxruntime counts 0)."""
    n = helper.make_node
    model = _model([n("StringSplit", ["a"], ["parts", "counts"], delimiter="e", maxsplit=2),
                    n("StringSplit", ["a"], ["all", "nall"], delimiter="ee")],
                   [("a", S, (2, 5))], [("parts", S), ("counts", TensorProto.INT64),
                                        ("all", S), ("nall", TensorProto.INT64)])
    text = np.array([["eeeleven", "", "tree", "e", "none"],
                     ["beekeeper", "see", "x", "eee", "tree house"]], dtype=object)
    _check(model, {"a": text}, reference="onnx")
    for seed in range(2):
        _check(model, {"a": _words(np.random.default_rng(seed), (2, 5))}, reference="onnx")


@pytest.mark.parametrize("action,sensitive", [("LOWER", 0), ("UPPER", 1), ("NONE", 0)])
def test_string_normalizer(action, sensitive):
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("StringNormalizer", ["x"], ["y"], case_change_action=action,
               is_case_sensitive=sensitive, stopwords=["the", "a"], locale="C"),
             n("StringNormalizer", ["x2"], ["y2"], case_change_action=action, locale="C")]
    model = _model(nodes, [("x", S, (6,)), ("x2", S, (1, 5))], [("y", S), ("y2", S)])
    # onnxruntime here has only the "C" locale, which changes the case of ASCII letters only
    ascii_words = [w for w in WORDS if w.isascii()]
    _check(model, {"x": np.array(rng.choice(ascii_words, 6), dtype=object),
                   "x2": np.array(rng.choice(ascii_words, (1, 5)), dtype=object)})
    # kiln changes case as Unicode does (what a UTF-8 locale gives)
    got = _kiln(model, {"x": np.array(["naïve", "Éclair"] * 3, dtype=object),
                        "x2": np.array([["ß"] * 5], dtype=object)})[0]
    want = {"LOWER": ["naïve", "éclair"], "UPPER": ["NAÏVE", "ÉCLAIR"],
            "NONE": ["naïve", "Éclair"]}[action]
    assert got.tolist() == want * 3
    # everything dropped: one empty string
    _check(model, {"x": np.array(["the", "A", "a"] * 2, dtype=object),
                   "x2": _words(rng, (1, 5))})


def test_tokenizer_like_model_feeds_tensor_ops():
    """Normalize words, map them to ids (unknown -> 0), embed and average: strings in,
    floats out, the ids also an output."""
    rng = np.random.default_rng(2)
    vocab = ["monday", "tuesday", "zebra", "naïve", "x y  z"]
    emb = numpy_helper.from_array(rng.standard_normal((len(vocab) + 1, 8)).astype("float32"),
                                  "emb")
    n = helper.make_node
    nodes = [n("StringNormalizer", ["text"], ["norm"], case_change_action="LOWER", locale="C"),
             n("LabelEncoder", ["norm"], ["ids"], domain=ML, keys_strings=vocab,
               values_int64s=list(range(1, len(vocab) + 1)), default_int64=0),
             n("Gather", ["emb", "ids"], ["vecs"]),
             n("ReduceMean", ["vecs"], ["mean"], keepdims=0, axes=[0]),
             n("Tanh", ["mean"], ["out"])]
    model = _model(nodes, [("text", S, (7,))], [("out", TensorProto.FLOAT),
                                                ("ids", TensorProto.INT64)], [emb], opset=17)
    _check(model, {"text": _words(rng, (7,))})


def test_label_encoder_and_category_mapper():
    rng = np.random.default_rng(3)
    n = helper.make_node
    keys_t = numpy_helper.from_array(np.array([1.5, np.nan, -2.0], np.float32), "kt")
    vals_t = numpy_helper.from_array(np.array(["one", "nan", "minus"], dtype=object), "vt")
    dflt_t = numpy_helper.from_array(np.array(["?"], dtype=object), "dt")
    nodes = [n("LabelEncoder", ["s"], ["s2i"], domain=ML, keys_strings=["a", "the", "zebra"],
               values_int64s=[7, 8, 9]),
             n("LabelEncoder", ["i"], ["i2s"], domain=ML, keys_int64s=[0, 1, 2],
               values_strings=["zero", "one", "two"], default_string="many"),
             n("LabelEncoder", ["f"], ["f2s"], domain=ML, keys_tensor=keys_t, values_tensor=vals_t,
               default_tensor=dflt_t),
             n("CategoryMapper", ["s"], ["cat"], domain=ML, cats_strings=["a", "zebra"],
               cats_int64s=[10, 20], default_int64=-5),
             n("CategoryMapper", ["i"], ["cat_s"], domain=ML, cats_strings=["a", "zebra"],
               cats_int64s=[1, 2], default_string="none")]
    model = _model(nodes, [("s", S, (2, 5)), ("i", TensorProto.INT64, (6,)),
                           ("f", TensorProto.FLOAT, (5,))],
                   [("s2i", TensorProto.INT64), ("i2s", S), ("f2s", S), ("cat", TensorProto.INT64),
                    ("cat_s", S)], opset=17)
    feeds = {"s": _words(rng, (2, 5)), "i": rng.integers(-1, 4, 6).astype(np.int64),
             "f": np.array([1.5, np.nan, 3.0, -2.0, 0.0], np.float32)}
    _check(model, feeds)


def test_cast_to_and_from_string():
    rng = np.random.default_rng(4)
    n = helper.make_node
    nodes = [n("Cast", ["x"], ["xs"], to=S), n("Cast", ["k"], ["ks"], to=S),
             n("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
             n("Cast", ["t"], ["td"], to=TensorProto.DOUBLE),
             n("Cast", ["ti"], ["ti64"], to=TensorProto.INT64),
             n("Mul", ["tf", "x"], ["prod"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, (4,)), ("k", TensorProto.INT32, (3,)),
                           ("t", S, (4,)), ("ti", S, (2,))],
                   [("xs", S), ("ks", S), ("tf", TensorProto.FLOAT), ("td", TensorProto.DOUBLE),
                    ("ti64", TensorProto.INT64), ("prod", TensorProto.FLOAT)], opset=19)
    feeds = {"x": rng.standard_normal(4).astype("float32"),
             "k": rng.integers(-100, 100, 3).astype("int32"),
             "t": np.array(["1.5", "-2e3", "NaN", "INF"], dtype=object),
             "ti": np.array(["42", "-7"], dtype=object)}
    got = _check(model, feeds, reference="onnx")
    assert np.isnan(got[2][2]) and np.isposinf(got[2][3])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    with pytest.raises(ArgumentError, match="cannot read the strings as float32"):
        exe(**{**feeds, "t": np.array(["1", "2", "three", "4"], dtype=object)})


def test_string_inputs_are_checked():
    model = _model([helper.make_node("RegexFullMatch", ["x"], ["m"], pattern="a+")],
                   [("x", S, (2,))], [("m", TensorProto.BOOL)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    np.testing.assert_array_equal(exe(x=np.array(["aaa", "ab"])), [True, False])  # numpy str
    with pytest.raises(ArgumentError, match="expected strings, got int"):
        exe(x=np.array([1, "a"], dtype=object))
    with pytest.raises(ArgumentError, match="expected shape"):
        exe(x=np.array(["a", "b", "c"], dtype=object))
    bad = _model([helper.make_node("RegexFullMatch", ["x"], ["m"], pattern="(a")],
                 [("x", S, (2,))], [("m", TensorProto.BOOL)])
    with pytest.raises(KilnError, match="RegexFullMatch node 'm'.*invalid pattern"):
        from_onnx(bad)
