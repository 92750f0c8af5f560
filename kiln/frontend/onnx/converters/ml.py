"""Converters of the ``ai.onnx.ml`` domain (ArrayFeatureExtractor, TreeEnsemble,
TreeEnsembleRegressor/Classifier) and of the default-domain text operator TfIdfVectorizer.

These operators carry their "model" (n-gram pool, trees) in attributes, so the converters turn
the attributes into constant tables at import time and the kernels (``kiln.op.text``,
``kiln.op.tree``) only walk them. ``ai.onnx.ml`` converters are registered with
``domain="ai.onnx.ml"``: the registry keys them by (domain, op type), apart from ai.onnx names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import numpy_helper

from .... import graph as g
from .... import op
from ..importer import as_text
from ..registry import converter
from .common import dtype_of, ndim_of, shape_of, static_int
from .dynamic import check_range

ML = "ai.onnx.ml"


# =============================================================================================
# ArrayFeatureExtractor
# =============================================================================================
@converter("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(ctx: Any, node: Any) -> Any:
    """``x[..., indices.ravel()]``; a 1-D ``x`` gives a ``(1, k)`` result (the reference).

    Indices may be negative (counted from the end, as numpy does in the reference); one outside
    ``[-n, n)`` is an error: at import time for constant indices, at run time otherwise (the
    model raises instead of reading a clamped element)."""
    x, ind = node.input(0), node.input(1)
    nd = ndim_of(x)
    if nd == 0:
        raise node.error("X must have rank >= 1, got a scalar")
    n = static_int(shape_of(x)[-1])
    if dtype_of(ind) not in ("int64", "int32"):
        raise node.error(f"Y must be an int64 tensor of indices, got {dtype_of(ind)}")
    const = node.const_value(1)
    if const is not None:
        flat = np.asarray(const, dtype=np.int64).reshape(-1)
        if n is not None and flat.size and (flat.min() < -n or flat.max() >= n):
            raise node.error(f"indices {flat.tolist()} out of range for a last axis of {n}")
        ind = g.const(flat)
    else:
        sizes = [static_int(d) for d in shape_of(ind)]
        if n is None or None in sizes:
            raise node.error("run-time indices need a static last axis and a static number of "
                             "indices (they are range-checked at run time)")
        count = int(np.prod(sizes, dtype=np.int64))
        ind = ctx.emit(op.reshape(op.cast(ind, "int64"), (count,)), f"{node.name}_indices")
        check_range(ctx, node, ind, -n, n - 1, "indices")
    out = op.take(x, ind, axis=nd - 1, mode="wrap")
    if nd == 1:
        out = op.expand_dims(out, 0)
    return out


# =============================================================================================
# TfIdfVectorizer
# =============================================================================================
def _tfidf_trie(node: Any) -> tuple[np.ndarray, int, int, int]:
    """The pool of a TfIdfVectorizer as an ``op.ngram_count`` trie: ``(trie, n_out, depth,
    max_children)``.

    Pool entries are numbered in pool order across the length groups of ``ngram_counts``; entry
    ``e`` counts into column ``ngram_indexes[e]``. Only entries of length ``min_gram_length ..
    max_gram_length`` count, and an n-gram listed twice counts for its last entry (the
    reference's trie keeps the last id)."""
    pool = node.attr("pool_int64s")
    if pool is None:
        raise node.error("pool_strings (string input) is not supported; only pool_int64s")
    pool = [int(v) for v in pool]
    lo, hi = int(node.attr("min_gram_length", 1)), int(node.attr("max_gram_length", 1))
    counts = [int(v) for v in node.attr("ngram_counts", [])]
    indexes = [int(v) for v in node.attr("ngram_indexes", [])]
    if not indexes or min(indexes) < 0 or lo < 1 or hi < lo:
        raise node.error(f"invalid attributes: min/max_gram_length {lo}/{hi}, ngram_indexes "
                         f"{indexes[:8]}")
    grams: list[tuple[int, ...]] = []
    columns: list[int] = []
    entry = 0
    for group, start in enumerate(counts):
        n = group + 1
        end = counts[group + 1] if group + 1 < len(counts) else len(pool)
        for j in range((end - start) // n):
            if lo <= n <= hi:
                if entry >= len(indexes):
                    raise node.error(f"the pool has more n-grams than ngram_indexes "
                                     f"({len(indexes)})")
                grams.append(tuple(pool[start + j * n:start + (j + 1) * n]))
                columns.append(indexes[entry])
            entry += 1
    trie = op.ngram_trie(grams, columns)
    return trie, max(indexes) + 1, max([len(gr) for gr in grams], default=1), int(
        trie[:, 2].max())


def _tfidf_weighting(node: Any, tf: Any, n_out: int) -> Any:
    """TF: the counts; IDF: the weight (1 without weights) where the count is positive; TFIDF:
    count times weight. Weights are indexed by output column, as in the reference and
    onnxruntime."""
    mode = node.attr("mode", "TF")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise node.error(f"mode must be TF, IDF or TFIDF, got {mode!r}")
    weights = node.attr("weights")
    w = None if not weights else np.asarray(weights, np.float32)
    if w is not None and w.size < n_out:
        raise node.error(f"weights has {w.size} entries, the output has {n_out} columns")
    if mode == "TF":
        return tf
    w_expr = None if w is None else g.const(w[:n_out])
    if mode == "IDF":
        seen = op.cast(op.greater(tf, g.const(np.float32(0))), "float32")
        return seen if w_expr is None else op.multiply(seen, w_expr)
    return tf if w_expr is None else op.multiply(tf, w_expr)


@converter("TfIdfVectorizer", since=9)
def tfidf_vectorizer(ctx: Any, node: Any) -> Any:
    """n-gram counts of an int32/int64 ``[C]`` or ``[B, C]`` input by ``op.ngram_count`` (the
    pool becomes a constant trie), then the TF/IDF/TFIDF weighting element-wise."""
    x = node.input(0)
    if dtype_of(x) not in ("int32", "int64"):
        raise node.error(f"X must be an int32/int64 tensor (strings are not supported), got "
                         f"{dtype_of(x)}")
    nd = ndim_of(x)
    if nd > 2:
        raise node.error(f"X must have shape [C] or [B, C], got rank {nd}")
    trie, n_out, depth, max_children = _tfidf_trie(node)
    x2 = op.reshape(x, (1, -1)) if nd < 2 else x
    counts = op.ngram_count(x2, g.const(trie), n_out=n_out, depth=depth,
                            max_skip_count=int(node.attr("max_skip_count", 0)),
                            max_children=max_children)
    tf = op.cast(counts, "float32")
    out = _tfidf_weighting(node, tf, n_out)
    return op.reshape(out, (n_out,)) if nd < 2 else out


# =============================================================================================
# TreeEnsemble (ai.onnx.ml 5)
# =============================================================================================
_MEMBER = 6
_MAX_DEPTH = 512


def _tensor_attr(node: Any, name: str, dtype: str) -> np.ndarray | None:
    """A TENSOR attribute as a 1-D numpy array (None when absent)."""
    value = node.attrs.get(name)
    if value is None:
        return None

    return np.asarray(numpy_helper.to_array(value), dtype=dtype).reshape(-1)


class _TreeTables:
    """Flattens the nodes of a tree ensemble into ``op.tree_ensemble`` tables.

    Interior node ``i`` becomes code ``>= 0`` (its row in ``rows``), leaf ``l`` code
    ``-l - 1``. A set-membership node becomes a chain of EQ nodes, one per member, whose true
    successors are the member node's and whose last false successor is its false one (an empty
    set: one EQ against NaN, never true). ``members`` maps each member node to its set."""

    def __init__(self, node: Any, cols: dict[str, list[Any]], n_leaves: int,
                 members: dict[int, list[float]]):
        self.node, self.n_leaves, self.members = node, n_leaves, members
        self.feature, self.split = cols["feature"], cols["split"]
        self.mode, self.missing = cols["mode"], cols["missing"]
        self.true_id, self.false_id = cols["true_id"], cols["false_id"]
        self.true_leaf, self.false_leaf = cols["true_leaf"], cols["false_leaf"]
        if any(len(v) != len(self.feature) for v in cols.values()):
            raise node.error("the nodes_* attributes must all have the same length")
        self.rows: list[list[int]] = []  # feature, mode, missing, true code, false code
        self.splits: list[float] = []
        self.codes: dict[int, int] = {}
        self.depths: dict[int, int] = {}

    def _leaf(self, index: int) -> int:
        if not 0 <= index < self.n_leaves:
            raise self.node.error(f"leaf index {index} out of range ({self.n_leaves} leaves)")
        return -index - 1

    def _add(self, row: list[int], split: float, depth: int) -> int:
        self.rows.append(row)
        self.splits.append(split)
        self.depths[len(self.rows) - 1] = depth
        return len(self.rows) - 1

    def code(self, i: int, visiting: frozenset[int] = frozenset()) -> int:
        """The code of interior node ``i`` (converted once; a cycle is an error)."""
        if i in self.codes:
            return self.codes[i]
        if not 0 <= i < len(self.feature):
            raise self.node.error(f"node index {i} out of range ({len(self.feature)} nodes)")
        if i in visiting or len(visiting) > _MAX_DEPTH:
            raise self.node.error(f"the trees have a cycle or are deeper than {_MAX_DEPTH} "
                                  f"(at node {i})")
        inner = visiting | {i}
        t = (self._leaf(self.true_id[i]) if self.true_leaf[i]
             else self.code(self.true_id[i], inner))
        f = (self._leaf(self.false_id[i]) if self.false_leaf[i]
             else self.code(self.false_id[i], inner))
        depth = 1 + max(self.depths.get(t, 0), self.depths.get(f, 0))
        feat, miss = self.feature[i], self.missing[i]
        if self.mode[i] != _MEMBER:
            code = self._add([feat, self.mode[i], miss, t, f], float(self.split[i]), depth)
        else:  # a chain of EQ nodes, built from its end
            code = f
            for v in reversed(self.members[i] or [float("nan")]):
                code = self._add([feat, 4, miss, t, code], v, depth)
                depth += 1
        self.codes[i] = code
        return code


def _member_sets(node: Any, modes: list[int], values: np.ndarray | None) -> dict[int, list[float]]:
    """The sets of the member nodes, read in the order the member nodes appear in
    ``nodes_modes``, delimited by NaN (the ONNX spec)."""
    member_nodes = [i for i, m in enumerate(modes) if m == _MEMBER]
    if not member_nodes:
        return {}
    if values is None:
        raise node.error("set-membership nodes need membership_values")
    sets: list[list[float]] = [[]]
    for v in values:
        if np.isnan(v):
            sets.append([])
        else:
            sets[-1].append(float(v))
    if len(sets) < len(member_nodes):
        raise node.error(f"membership_values has {len(sets) - 1} NaN-delimited sets, the "
                         f"nodes use {len(member_nodes)}")
    return dict(zip(member_nodes, sets))


def _evaluate(node: Any, x: Any, tables: _TreeTables, roots: list[int], w: np.ndarray,
              mask: np.ndarray, aggregate: str) -> Any:
    """``op.tree_ensemble`` of the trees rooted at ``roots`` (node indices) with the leaf
    tables ``w``/``mask``; the features are checked against ``x``'s width."""
    if ndim_of(x) != 2 or dtype_of(x) not in ("float32", "float64", "float16"):
        raise node.error(f"X must be a 2-D float tensor, got {x.struct_info}")
    n_features = static_int(shape_of(x)[1])
    used = tables.feature
    if used and (min(used) < 0 or (n_features is not None and max(used) >= n_features)):
        raise node.error(f"nodes_featureids must lie in [0, {n_features}), got "
                         f"{min(used)}..{max(used)}")
    if not roots:
        raise node.error("the ensemble has no trees")
    root_codes = [tables.code(r) for r in roots]
    depth = max([tables.depths.get(c, 0) for c in root_codes])
    rows = tables.rows or [[0, 0, 0, -1, -1]]  # all trees single leaves: a never-read node
    splits = tables.splits or [0.0]
    modes = {r[1] for r in rows}
    return op.tree_ensemble(
        x, g.const(np.asarray(rows, np.int64)), g.const(np.asarray(splits, np.float64)),
        g.const(np.asarray(root_codes, np.int64)), g.const(w), g.const(mask),
        depth=depth, aggregate=aggregate, mode=modes.pop() if len(modes) == 1 else None)


def _post_transform(node: Any, out: Any, post: str) -> Any:
    """NONE, SOFTMAX (over the targets) or LOGISTIC; SOFTMAX_ZERO and PROBIT are refused."""
    if post == "SOFTMAX":
        return op.nn.softmax(out, axis=-1)
    if post == "LOGISTIC":
        return op.sigmoid(out)
    if post != "NONE":
        raise node.error(f"post_transform {post} is not supported (NONE, SOFTMAX, LOGISTIC)")
    return out


_POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


@converter("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(ctx: Any, node: Any) -> Any:
    """``op.tree_ensemble`` over the flattened trees (see ``_TreeTables``), then
    ``post_transform`` as the ONNX spec numbers it: 0 NONE, 1 SOFTMAX (over the targets),
    2 LOGISTIC. (The ONNX reference ignores post_transform; onnxruntime 1.32 applies LOGISTIC
    for 1 and SOFTMAX for 2.) SOFTMAX_ZERO and PROBIT are refused.

    A tree that is a single leaf is a root whose both branches are leaf ``nodes_truenodeids``
    (the spec's encoding; the reference reads leaf ``root`` instead, the same when they
    agree)."""
    a = node.attr
    ints = {k: [int(v) for v in a(f"nodes_{name}", [])] for k, name in (
        ("feature", "featureids"), ("true_id", "truenodeids"), ("false_id", "falsenodeids"),
        ("true_leaf", "trueleafs"), ("false_leaf", "falseleafs"))}
    k = len(ints["feature"])
    modes = _tensor_attr(node, "nodes_modes", "int64")
    splits = _tensor_attr(node, "nodes_splits", "float64")
    if splits is None:
        raise node.error("nodes_splits is missing")
    cols: dict[str, list[Any]] = {
        **ints, "split": list(splits),
        "mode": [int(v) for v in (np.zeros(k, np.int64) if modes is None else modes)],
        "missing": [int(v) for v in (a("nodes_missing_value_tracks_true") or [0] * k)]}
    if any(m not in range(7) for m in cols["mode"]):
        raise node.error(f"nodes_modes must be 0..6, got {sorted(set(cols['mode']))}")
    targets = [int(v) for v in a("leaf_targetids", [])]
    members = _member_sets(node, cols["mode"],
                           _tensor_attr(node, "membership_values", "float64"))
    tables = _TreeTables(node, cols, len(targets), members)
    n_targets = int(a("n_targets", 1))
    weights = _tensor_attr(node, "leaf_weights", "float64")
    if weights is None or weights.size != len(targets) or not targets:
        raise node.error("leaf_targetids and leaf_weights must be non-empty, of one length")
    if min(targets) < 0 or max(targets) >= n_targets:
        raise node.error(f"leaf_targetids must lie in [0, n_targets={n_targets})")
    w = np.zeros((len(targets), n_targets), np.float64)
    mask = np.zeros((len(targets), n_targets), np.int8)
    w[np.arange(len(targets)), targets] = weights
    mask[np.arange(len(targets)), targets] = 1
    agg, post = int(a("aggregate_function", 1)), int(a("post_transform", 0))
    if agg not in range(4) or post not in range(5):
        raise node.error(f"aggregate_function must be 0..3 and post_transform 0..4, got "
                         f"{agg} and {post}")
    out = _evaluate(node, node.input(0), tables, [int(r) for r in a("tree_roots", [])], w,
                    mask, ("AVERAGE", "SUM", "MIN", "MAX")[agg])
    return _post_transform(node, out, _POST_TRANSFORMS[post])


# =============================================================================================
# TreeEnsembleRegressor (ai.onnx.ml 1 and 3)
# =============================================================================================
_V3_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
             "BRANCH_NEQ": 5}


def _floats(node: Any, name: str) -> list[float] | None:
    """A float list attribute or its ``_as_tensor`` form (opset 3), None when both absent."""
    t = _tensor_attr(node, f"{name}_as_tensor", "float64")
    if t is not None:
        return [float(v) for v in t]
    v = node.attr(name)
    return None if v is None else [float(f) for f in v]


def _v3_trees(node: Any, prefix: str, n_targets: int, agg: str) -> tuple[Any, ...]:
    """Parse the (tree id, node id)-addressed trees of TreeEnsembleRegressor/Classifier (see
    ``tree_ensemble_regressor``): ``(tables, roots, w, mask)``; ``prefix`` names the leaf
    entries (``target`` or ``class``)."""
    a = node.attr
    tree_ids = [int(v) for v in a("nodes_treeids", [])]
    node_ids = [int(v) for v in a("nodes_nodeids", [])]
    modes = [str(m.decode() if isinstance(m, bytes) else m) for m in a("nodes_modes", [])]
    values = _floats(node, "nodes_values") or [0.0] * len(modes)
    features = [int(v) for v in a("nodes_featureids", [])]
    missing = [int(v) for v in (a("nodes_missing_value_tracks_true") or [0] * len(modes))]
    lists = (node_ids, modes, values, features, missing)
    if not tree_ids or any(len(v) != len(tree_ids) for v in lists):
        raise node.error("the nodes_* attributes must be non-empty and of one length")
    bad = sorted({m for m in modes if m != "LEAF" and m not in _V3_MODES})
    if bad:
        raise node.error(f"unknown nodes_modes {bad}")
    index = {(t, n): i for i, (t, n) in enumerate(zip(tree_ids, node_ids))}
    leaf_of = {i: k for k, i in enumerate(i for i, m in enumerate(modes) if m == "LEAF")}
    interior = [i for i, m in enumerate(modes) if m != "LEAF"]
    row_of = {i: k for k, i in enumerate(interior)}
    cols: dict[str, list[Any]] = {k: [] for k in (
        "feature", "split", "mode", "missing", "true_id", "false_id", "true_leaf", "false_leaf")}
    for i in interior:
        succ = []
        for ids in ("nodes_truenodeids", "nodes_falsenodeids"):
            j = index.get((tree_ids[i], int(a(ids)[i])))
            if j is None:
                raise node.error(f"node {node_ids[i]} of tree {tree_ids[i]}: its successor in "
                                 f"{ids} does not exist")
            succ.append((1, leaf_of[j]) if j in leaf_of else (0, row_of[j]))
        mode, miss = _V3_MODES[modes[i]], missing[i]
        if mode == 5 and not miss:  # NEQ, NaN false: EQ with NaN true, branches swapped
            mode, miss, succ = 4, 1, succ[::-1]
        for key, val in (("feature", features[i]), ("split", values[i]), ("mode", mode),
                         ("missing", miss), ("true_leaf", succ[0][0]), ("true_id", succ[0][1]),
                         ("false_leaf", succ[1][0]), ("false_id", succ[1][1])):
            cols[key].append(val)
    tables = _TreeTables(node, cols, len(leaf_of), {})
    w = np.zeros((max(len(leaf_of), 1), n_targets), np.float64)
    mask = np.zeros(w.shape, np.int8)
    entries = zip(a(f"{prefix}_treeids", []), a(f"{prefix}_nodeids", []), a(f"{prefix}_ids", []),
                  _floats(node, f"{prefix}_weights") or [])
    merge = {"MIN": min, "MAX": max}.get(agg, lambda p, q: p + q)
    for tid, nid, target, weight in entries:
        leaf = leaf_of.get(index.get((int(tid), int(nid)), -1))
        if leaf is None or not 0 <= int(target) < n_targets:
            raise node.error(f"{prefix} entry (tree {tid}, node {nid}, id {target}) names no "
                             "leaf or an id out of range")
        cell = (leaf, int(target))
        w[cell] = merge(w[cell], weight) if mask[cell] else weight
        mask[cell] = 1
    roots = sorted({t: i for i, t in reversed(list(enumerate(tree_ids)))}.items())
    first = [i for _, i in roots]
    if any(modes[i] == "LEAF" for i in first):
        raise node.error("a tree that is a single leaf is not supported")
    return tables, [row_of[i] for i in first], w, mask


def _add_base(node: Any, out: Any, n: int, dtype: str) -> Any:
    base = _floats(node, "base_values")
    if not base:
        return out
    if len(base) != n:
        raise node.error(f"base_values has {len(base)} entries for {n} outputs")
    return op.add(out, g.const(np.asarray(base, dtype=dtype)))


@converter("TreeEnsembleRegressor", since=1, domain=ML)
def tree_ensemble_regressor(ctx: Any, node: Any) -> Any:
    """The (tree id, node id)-addressed trees of TreeEnsembleRegressor as TreeEnsemble tables:
    ``LEAF`` nodes become leaves whose targets are dense rows (several weights of a leaf for
    one target add up, or combine by MIN/MAX), the other nodes interior nodes, each tree rooted
    at its first node. A missing value takes ``missing_value_tracks_true`` whatever the mode
    (the spec and the reference; onnxruntime 1.32 sends NaN through NEQ as true); for NEQ
    without it (where TreeEnsemble's NaN != x would be true) the node
    becomes an EQ that sends NaN the other way, with its branches swapped. ``base_values`` are
    added after the aggregation, then ``post_transform`` (NONE/SOFTMAX/LOGISTIC)."""
    n_targets = int(node.attr("n_targets", 1))
    agg = str(node.attr("aggregate_function", "SUM"))
    if agg not in ("SUM", "AVERAGE", "MIN", "MAX"):
        raise node.error(f"aggregate_function must be SUM, AVERAGE, MIN or MAX, got {agg!r}")
    tables, roots, w, mask = _v3_trees(node, "target", n_targets, agg)
    x = node.input(0)
    out = _evaluate(node, x, tables, roots, w, mask, agg)
    out = _add_base(node, out, n_targets, dtype_of(x))
    return _post_transform(node, out, str(node.attr("post_transform", "NONE")))


@converter("TreeEnsembleClassifier", since=1, domain=ML)
def tree_ensemble_classifier(ctx: Any, node: Any) -> Any:
    """Class scores: the sum over trees of the reached leaves' class weights plus
    ``base_values``, then ``post_transform``; the label is the int64 class label of the best
    score (the first on ties). Integer features are compared as float32 (the reference).
    String class labels (``classlabels_strings``) are looked up on the host
    (``label_encoder``: class index -> label). Refused: the binary form (every weight on one
    class), whose score conventions differ between the reference and onnxruntime."""
    text = [as_text(v) for v in node.attr("classlabels_strings", None) or ()]
    labels = node.attr("classlabels_int64s") or text
    if not labels:
        raise node.error("classlabels_int64s or classlabels_strings is required")
    class_ids = {int(c) for c in node.attr("class_ids", [])}
    if len(class_ids) < 2 or len(labels) < 2:
        raise node.error("the binary form (all weights on one class) is not supported")
    tables, roots, w, mask = _v3_trees(node, "class", len(labels), "SUM")
    x = node.input(0)
    if dtype_of(x) not in ("float32", "float64"):
        x = op.cast(x, "float32")
    scores = op.cast(_evaluate(node, x, tables, roots, w, mask, "SUM"), "float32")
    scores = _add_base(node, scores, len(labels), "float32")
    scores = ctx.emit(_post_transform(node, scores, str(node.attr("post_transform", "NONE"))),
                      f"{node.name}_scores")
    best = op.argmax(scores, axis=1)
    if text:
        label = op.label_encoder(op.cast(best, "int64"), keys=tuple(range(len(text))),
                                 values=tuple(text), default="", dtype="string")
        return [label, scores]
    label = op.take(g.const(np.asarray(labels, np.int64)), best, axis=0, mode="clip")
    return [label, scores]
