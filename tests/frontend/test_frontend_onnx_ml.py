"""ONNX ai.onnx.ml converters (ArrayFeatureExtractor, TreeEnsemble) and TfIdfVectorizer,
checked against ``onnx.reference`` on random inputs, pools and trees (onnxruntime where the
reference cannot run a case, numpy for TreeEnsemble's post_transform, which it ignores).

Several nodes share one model wherever possible, so each test is one kiln build.
"""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError

OPSET = 21
ML = "ai.onnx.ml"


def _model(nodes, inputs, outputs, ml_opset=5, initializers=(), out_type=TensorProto.UNDEFINED):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, out_type, None) for n in outputs],
        initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid(ML, ml_opset)])


def _run(model, feeds):
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(**feeds)
    return [np.asarray(v) for v in (got if isinstance(got, (list, tuple)) else (got,))]


def _check(model, feeds, rtol=1e-6, atol=0.0):
    got = _run(model, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for o, a, b in zip(model.graph.output, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, o.name
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=o.name)


# ---- ArrayFeatureExtractor --------------------------------------------------------------------
def test_array_feature_extractor():
    rng = np.random.default_rng(0)
    const = numpy_helper.from_array(np.array([[3, -1], [0, 2]], np.int64), "ci")
    n = helper.make_node
    nodes = [n("ArrayFeatureExtractor", ["x3", "ci"], ["c3"], domain=ML),
             n("ArrayFeatureExtractor", ["x1", "ci"], ["c1"], domain=ML),
             n("ArrayFeatureExtractor", ["x3", "ri"], ["r3"], domain=ML),
             n("ArrayFeatureExtractor", ["i2", "ri"], ["ri2"], domain=ML)]
    model = _model(nodes, [("x3", TensorProto.FLOAT, (2, 3, 5)), ("x1", TensorProto.FLOAT, (5,)),
                           ("i2", TensorProto.INT32, (3, 5)), ("ri", TensorProto.INT64, (3,))],
                   ["c3", "c1", "r3", "ri2"], ml_opset=1, initializers=[const])
    feeds = {"x3": rng.standard_normal((2, 3, 5)).astype("float32"),
             "x1": rng.standard_normal(5).astype("float32"),
             "i2": rng.integers(-9, 9, (3, 5)).astype("int32"),
             "ri": np.array([4, -5, 1], np.int64)}
    _check(model, feeds)
    # an index outside [-n, n) is an error: at run time for a run-time index ...
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    with pytest.raises(KilnError, match="ArrayFeatureExtractor"):
        exe(**{**feeds, "ri": np.array([0, 5, 1], np.int64)})
    # ... at import time for a constant one
    bad = numpy_helper.from_array(np.array([7], np.int64), "ci")
    model = _model(nodes[:1], [("x3", TensorProto.FLOAT, (2, 3, 5))], ["c3"], ml_opset=1,
                   initializers=[bad])
    with pytest.raises(KilnError, match="out of range"):
        from_onnx(model)


# ---- TfIdfVectorizer ---------------------------------------------------------------------------
def _random_pool(rng, max_n, vocab):
    """Pool n-grams of lengths 1..max_n (some groups empty), as (pool, ngram_counts)."""
    pool, counts = [], []
    for n in range(1, max_n + 1):
        counts.append(len(pool))
        for _ in range(int(rng.integers(0, 4))):
            pool.extend(int(v) for v in rng.integers(0, vocab, n))
    return pool, counts


def _tfidf_nodes(rng, x_name, prefix, vocab):
    nodes = []
    for k, mode in enumerate(["TF", "IDF", "TFIDF", "TF", "IDF", "TFIDF", "TF", "TF"]):
        max_n = int(rng.integers(1, 4))
        min_n = int(rng.integers(1, max_n + 1))
        pool, counts = _random_pool(rng, max_n, vocab)
        if not pool:
            pool, counts = [1], [0]
        n_grams = _count_grams(pool, counts)
        indexes = rng.permutation(n_grams + 2)[:n_grams]
        if k == 7:  # several n-grams in one output column (counts add up)
            indexes = rng.integers(0, max(n_grams // 2, 1), n_grams)
        attrs = dict(max_gram_length=max_n, min_gram_length=min_n, mode=mode,
                     max_skip_count=int(rng.integers(0, 4)), ngram_counts=counts,
                     ngram_indexes=[int(i) for i in indexes], pool_int64s=pool)
        if k % 2 or mode != "TF":  # (the reference needs weights for IDF and TFIDF)
            attrs["weights"] = [float(w) for w in rng.uniform(0.5, 2.0, int(max(indexes)) + 1)]
        nodes.append(helper.make_node("TfIdfVectorizer", [x_name], [f"{prefix}{k}"], **attrs))
    return nodes


def _count_grams(pool, counts):
    total = 0
    for i, start in enumerate(counts):
        end = counts[i + 1] if i + 1 < len(counts) else len(pool)
        total += (end - start) // (i + 1)
    return total


def test_tfidf_vectorizer_random_pools():
    rng = np.random.default_rng(1)
    vocab = 4  # a small vocabulary: n-grams, also with skips, occur often
    nodes = _tfidf_nodes(rng, "x2", "b", vocab) + _tfidf_nodes(rng, "x1", "v", vocab)
    dup = helper.make_node(  # the bigram (1, 2) listed twice: only its last entry counts
        "TfIdfVectorizer", ["x1"], ["dup"], max_gram_length=2, min_gram_length=1, mode="TF",
        max_skip_count=1, ngram_counts=[0, 2], ngram_indexes=[0, 1, 2, 3],
        pool_int64s=[2, 1, 1, 2, 1, 2])
    nodes.append(dup)
    outs = [o for nd in nodes for o in nd.output]
    model = _model(nodes, [("x2", TensorProto.INT64, (3, 9)), ("x1", TensorProto.INT32, (11,))],
                   outs)
    feeds = {"x2": rng.integers(0, vocab, (3, 9)).astype("int64"),
             "x1": rng.integers(0, vocab, 11).astype("int32")}
    _check(model, feeds)


def test_tfidf_vectorizer_without_weights_vs_onnxruntime():
    """IDF without weights is 1 where an n-gram occurs, TFIDF the counts (the reference
    cannot run these)."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("TfIdfVectorizer", ["x"], [mode], max_gram_length=2,
                              min_gram_length=1, mode=mode, max_skip_count=2,
                              ngram_counts=[0, 3], ngram_indexes=[4, 0, 3, 2, 1],
                              pool_int64s=[0, 1, 2, 1, 1, 2, 0]) for mode in ("IDF", "TFIDF")]
    model = _model(nodes, [("x", TensorProto.INT64, (4, 10))], ["IDF", "TFIDF"],
                   out_type=TensorProto.FLOAT)
    x = rng.integers(0, 3, (4, 10)).astype("int64")
    got = _run(model, {"x": x})
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert got[1].max() > 1  # some n-gram occurs more than once


def test_tfidf_vectorizer_errors():
    nd = helper.make_node("TfIdfVectorizer", ["x"], ["y"], max_gram_length=1, min_gram_length=1,
                          max_skip_count=0, mode="TF", ngram_counts=[0], ngram_indexes=[0],
                          pool_strings=["a"], name="tfidf")
    model = _model([nd], [("x", TensorProto.INT64, (4,))], ["y"])
    with pytest.raises(KilnError, match="TfIdfVectorizer node 'tfidf'.*pool_strings"):
        from_onnx(model)


# ---- TreeEnsemble ----------------------------------------------------------------------------
_VALUES = np.array([-1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0])  # splits, members and features


class _Trees:
    """A random ensemble in TreeEnsemble (ai.onnx.ml 5) form. Nodes are numbered in preorder,
    true branch first, so the member sets appear in the order of ``nodes_modes`` (the spec) and
    of the reference's traversal alike."""

    def __init__(self, rng, n_features, n_targets, modes):
        self.rng, self.nf, self.nt, self.modes = rng, n_features, n_targets, modes
        self.cols = {k: [] for k in ("feat", "mode", "split", "tid", "fid", "tleaf", "fleaf",
                                     "miss")}
        self.members: list[float] = []
        self.leaf_t: list[int] = []
        self.leaf_w: list[float] = []

    def _leaf(self):
        self.leaf_t.append(int(self.rng.integers(0, self.nt)))
        self.leaf_w.append(float(self.rng.uniform(-5, 5)))
        return 1, len(self.leaf_t) - 1

    def build(self, depth, root=False):
        if depth == 0 or (not root and self.rng.random() < 0.25):
            return self._leaf()
        c, i = self.cols, len(self.cols["feat"])
        mode = int(self.rng.choice(self.modes))
        for k, v in (("feat", int(self.rng.integers(0, self.nf))), ("mode", mode),
                     ("split", float(self.rng.choice(_VALUES))),
                     ("miss", int(self.rng.integers(0, 2))), ("tid", 0), ("fid", 0),
                     ("tleaf", 0), ("fleaf", 0)):
            c[k].append(v)
        if mode == 6:  # no 0.0 member: the reference ends a set at a falsy value
            self.members += [float(v) for v in self.rng.choice(_VALUES, 2, replace=False)]
            self.members.append(float("nan"))
        c["tleaf"][i], c["tid"][i] = self.build(depth - 1)
        c["fleaf"][i], c["fid"][i] = self.build(depth - 1)
        return 0, i

    def node(self, x, out, n_trees, depth, dtype, **attrs):
        roots = [self.build(depth, root=True)[1] for _ in range(n_trees)]
        c = self.cols
        extra = {}
        if self.members:
            extra["membership_values"] = helper.make_tensor(
                "m", dtype, (len(self.members),), self.members)
        return helper.make_node(
            "TreeEnsemble", [x], [out], domain=ML, n_targets=self.nt, tree_roots=roots,
            nodes_featureids=c["feat"], nodes_truenodeids=c["tid"], nodes_falsenodeids=c["fid"],
            nodes_trueleafs=c["tleaf"], nodes_falseleafs=c["fleaf"],
            nodes_missing_value_tracks_true=c["miss"],
            nodes_modes=helper.make_tensor("modes", TensorProto.UINT8, (len(c["mode"]),),
                                           c["mode"]),
            nodes_splits=helper.make_tensor("s", dtype, (len(c["split"]),), c["split"]),
            leaf_targetids=self.leaf_t,
            leaf_weights=helper.make_tensor("w", dtype, (len(self.leaf_w),), self.leaf_w),
            **extra, **attrs)


def _features(rng, shape, dtype):
    x = rng.choice(_VALUES, shape) + rng.choice([0.0, 0.25], shape)  # on and off the splits
    x[rng.random(shape) < 0.1] = np.nan  # missing values
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tree_ensemble_random(dtype):
    rng = np.random.default_rng(2)
    tp = TensorProto.FLOAT if dtype == "float32" else TensorProto.DOUBLE
    nodes = []
    for k, (agg, modes) in enumerate([(1, [0]), (0, [0, 1, 2, 3, 4, 5]), (2, [1, 3, 6]),
                                      (3, [0, 2, 4, 5, 6]), (1, [5, 6])]):
        nodes.append(_Trees(rng, 3, 3, modes).node("x", f"y{k}", int(rng.integers(1, 5)),
                                                   int(rng.integers(1, 6)), tp,
                                                   aggregate_function=agg))
    model = _model(nodes, [("x", tp, (40, 3))], [f"y{k}" for k in range(len(nodes))])
    _check(model, {"x": _features(rng, (40, 3), dtype)}, rtol=1e-6 if dtype == "float32" else 0)


def test_tree_ensemble_post_transform():
    """SOFTMAX (1) over the targets and LOGISTIC (2) of the raw scores, checked with numpy
    against the reference's raw scores (the reference ignores post_transform; onnxruntime 1.32
    swaps 1 and 2 against the ONNX spec, so it is no oracle here)."""
    rng = np.random.default_rng(3)
    base = _Trees(rng, 2, 3, [0, 3]).node("x", "p0", 3, 4, TensorProto.FLOAT)
    nodes = [base]
    for post in (1, 2):
        nd = copy.deepcopy(base)
        nd.output[0] = f"p{post}"
        nd.attribute.append(helper.make_attribute("post_transform", post))
        nodes.append(nd)
    model = _model(nodes, [("x", TensorProto.FLOAT, (16, 2))], ["p0", "p1", "p2"])
    x = _features(rng, (16, 2), "float32")
    raw, soft, logistic = _run(model, {"x": x})
    want = ReferenceEvaluator(model).run(None, {"x": x})[0].astype("float64")
    np.testing.assert_allclose(raw, want, rtol=1e-6)
    e = np.exp(want - want.max(axis=1, keepdims=True))
    np.testing.assert_allclose(soft, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(logistic, 1 / (1 + np.exp(-want)), rtol=1e-5, atol=1e-7)


def test_tree_ensemble_errors():
    trees = _Trees(np.random.default_rng(4), 2, 1, [0])
    nd = trees.node("x", "y", 1, 2, TensorProto.FLOAT, name="te")
    cyclic = helper.make_node(**{"op_type": "TreeEnsemble", "inputs": ["x"], "outputs": ["y"],
                                 "domain": ML, "name": "te"})
    cyclic.attribute.extend(a for a in nd.attribute if a.name != "nodes_truenodeids")
    cyclic.attribute.append(helper.make_attribute(
        "nodes_truenodeids", [0] * len(trees.cols["feat"])))
    for a in cyclic.attribute:
        if a.name == "nodes_trueleafs":
            a.ints[:] = [0] * len(a.ints)
    model = _model([cyclic], [("x", TensorProto.FLOAT, (4, 2))], ["y"])
    with pytest.raises(KilnError, match="TreeEnsemble node 'te'.*cycle"):
        from_onnx(model)


def test_tree_ensemble_single_leaf_trees():
    """Trees that are one leaf (a root whose branches both name that leaf), averaged."""
    nd = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain=ML, n_targets=2, tree_roots=[0, 1],
        aggregate_function=0, nodes_featureids=[0, 1], nodes_truenodeids=[0, 1],
        nodes_falsenodeids=[0, 1], nodes_trueleafs=[1, 1], nodes_falseleafs=[1, 1],
        nodes_modes=helper.make_tensor("m", TensorProto.UINT8, (2,), [0, 0]),
        nodes_splits=helper.make_tensor("s", TensorProto.FLOAT, (2,), [0.0, 0.0]),
        leaf_targetids=[1, 1],
        leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, (2,), [3.0, 4.5]))
    model = _model([nd], [("x", TensorProto.FLOAT, (5, 2))], ["y"])
    x = np.random.default_rng(6).standard_normal((5, 2)).astype("float32")
    _check(model, {"x": x})
    assert np.all(_run(model, {"x": x})[0] == [0.0, 3.75])


# ---- TreeEnsembleRegressor (ai.onnx.ml 3) ------------------------------------------------------
_V3_MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def _regressor_node(rng, out, n_trees, depth, n_targets, aggregate, base):
    """Random trees in TreeEnsembleRegressor form: (tree id, node id) addressed, LEAF nodes
    with one or two (target, weight) entries each."""
    cols = {k: [] for k in ("tree", "node", "mode", "value", "feat", "tid", "fid", "miss")}
    targets = {k: [] for k in ("tree", "node", "id", "w")}

    def build(tree, level):
        nid = sum(t == tree for t in cols["tree"])
        leaf = level == 0 or (level < depth and rng.random() < 0.3)
        for k, v in (("tree", tree), ("node", nid), ("value", float(rng.choice(_VALUES))),
                     ("mode", "LEAF" if leaf else str(rng.choice(_V3_MODES))),
                     ("feat", int(rng.integers(0, 3))), ("miss", int(rng.integers(0, 2))),
                     ("tid", 0), ("fid", 0)):
            cols[k].append(v)
        i = len(cols["tree"]) - 1
        if leaf:
            for target in rng.choice(n_targets, int(rng.integers(1, 3))):
                for k, v in (("tree", tree), ("node", nid), ("id", int(target)),
                             ("w", float(rng.uniform(-5, 5)))):
                    targets[k].append(v)
        else:
            cols["tid"][i] = build(tree, level - 1)
            cols["fid"][i] = build(tree, level - 1)
        return nid

    for tree in rng.permutation(n_trees):
        build(int(tree) * 3, depth)  # tree ids need not be 0..n-1
    extra = {"base_values": [float(b) for b in rng.uniform(-1, 1, n_targets)]} if base else {}
    return helper.make_node(
        "TreeEnsembleRegressor", ["x"], [out], domain=ML, n_targets=n_targets,
        aggregate_function=aggregate, nodes_treeids=cols["tree"], nodes_nodeids=cols["node"],
        nodes_modes=cols["mode"], nodes_values=cols["value"], nodes_featureids=cols["feat"],
        nodes_truenodeids=cols["tid"], nodes_falsenodeids=cols["fid"],
        nodes_missing_value_tracks_true=cols["miss"], target_treeids=targets["tree"],
        target_nodeids=targets["node"], target_ids=targets["id"], target_weights=targets["w"],
        **extra)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tree_ensemble_regressor_random(dtype):
    rng = np.random.default_rng(7)
    tp = TensorProto.FLOAT if dtype == "float32" else TensorProto.DOUBLE
    nodes = [_regressor_node(rng, f"y{k}", int(rng.integers(1, 5)), int(rng.integers(1, 6)), 3,
                             agg, base=k % 2 == 0)
             for k, agg in enumerate(["SUM", "AVERAGE", "MIN", "MAX", "SUM"])]
    model = _model(nodes, [("x", tp, (40, 3))], [f"y{k}" for k in range(len(nodes))],
                   ml_opset=3)
    _check(model, {"x": _features(rng, (40, 3), dtype)}, rtol=1e-6 if dtype == "float32"
           else 1e-12)


def _classifier_node(rng, outs, post, base):
    """A random TreeEnsembleClassifier over 3 classes (labels 10, 20, 30): the regressor's
    random trees with its target entries as class entries."""
    reg = _regressor_node(rng, "unused", int(rng.integers(2, 5)), int(rng.integers(2, 5)), 3,
                          "SUM", base)
    rename = {"target_treeids": "class_treeids", "target_nodeids": "class_nodeids",
              "target_ids": "class_ids", "target_weights": "class_weights"}
    attrs = {rename.get(a.name, a.name): helper.get_attribute_value(a) for a in reg.attribute
             if a.name not in ("n_targets", "aggregate_function")}
    attrs["nodes_modes"] = [m.decode() for m in attrs["nodes_modes"]]
    return helper.make_node("TreeEnsembleClassifier", ["x"], outs, domain=ML,
                            classlabels_int64s=[10, 20, 30], post_transform=post, **attrs)


def test_tree_ensemble_classifier_random():
    rng = np.random.default_rng(8)
    nodes = [_classifier_node(rng, [f"label{k}", f"score{k}"], post, base=k != 1)
             for k, post in enumerate(["NONE", "SOFTMAX", "LOGISTIC"])]
    outs = [o for nd in nodes for o in nd.output]
    model = _model(nodes, [("x", TensorProto.FLOAT, (40, 3))], outs, ml_opset=3)
    _check(model, {"x": _features(rng, (40, 3), "float32")}, rtol=1e-5, atol=1e-6)


def test_tree_ensemble_classifier_string_labels():
    """classlabels_strings: the label output is a string tensor (vs the reference, as the
    int64 labels above)."""
    rng = np.random.default_rng(10)
    nd = _classifier_node(rng, ["label", "score"], "SOFTMAX", base=True)
    del nd.attribute[[a.name for a in nd.attribute].index("classlabels_int64s")]
    nd.attribute.append(helper.make_attribute("classlabels_strings", ["cat", "dog", "émeu"]))
    model = _model([nd], [("x", TensorProto.FLOAT, (30, 3))], ["label", "score"], ml_opset=3)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.STRING
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.FLOAT
    feeds = {"x": _features(rng, (30, 3), "float32")}
    label, score = _run_raw(model, feeds)
    want_label, want_score = ReferenceEvaluator(model).run(None, feeds)
    assert label.dtype == object and label.tolist() == want_label.tolist()
    np.testing.assert_allclose(score, want_score, rtol=1e-5, atol=1e-6)


def _run_raw(model, feeds):
    mod, params = from_onnx(model)
    return kiln.build(mod, params=params)(**feeds)


def test_tree_ensemble_classifier_refuses_binary():
    rng = np.random.default_rng(9)
    nd = _classifier_node(rng, ["label", "score"], "NONE", base=False)
    for a in nd.attribute:
        if a.name == "class_ids":
            a.ints[:] = [0] * len(a.ints)
    model = _model([nd], [("x", TensorProto.FLOAT, (4, 3))], ["label", "score"], ml_opset=3)
    with pytest.raises(KilnError, match="TreeEnsembleClassifier.*binary"):
        from_onnx(model)
