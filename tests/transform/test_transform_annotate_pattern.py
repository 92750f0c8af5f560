"""AnnotateTIROpPattern: the fusion pattern derived from a PrimFunc's body, on every kiln op."""

import pytest

from kiln import graph as g
from kiln import op, te, tir
from kiln.ir import IRModule, KilnError
from kiln.op.registry import OpPattern, get_op_def, list_ops
from kiln.transform import AnnotateTIROpPattern
from kiln.transform.annotate_tir_op_pattern import analyze_op_pattern, block_patterns
from kiln.transform.legalize_ops import legalize_call

P = OpPattern


def v(name, shape, dtype="float32"):
    return g.Var(name, g.TensorStructInfo(shape, dtype))


X4 = v("x", (2, 4, 8, 8))
M = v("m", (4, 8))
Y = v("y", (4, 8))
B = v("b", (8,))
IDX = v("i", (3,), "int64")
C = v("c", (4, 8), "bool")
W = v("w", (6, 8))
PARAMS = [X4, M, Y, B, IDX, C, W]

UNARY = ["abs", "ceil", "cos", "erf", "exp", "floor", "log", "negative", "relu", "round",
         "rsqrt", "sigmoid", "silu", "sin", "sqrt", "tanh"]
BINARY = ["add", "divide", "equal", "floor_divide", "greater", "greater_equal", "less",
          "less_equal", "maximum", "minimum", "mod", "multiply", "not_equal", "power",
          "subtract"]

# (case id, call maker, derived pattern expected)
CASES = (
    [(u, lambda u=u: getattr(op, u)(M), P.ELEMWISE) for u in UNARY]
    + [(b, lambda b=b: getattr(op, b)(M, B), P.BROADCAST) for b in BINARY]
    + [(b + "/same-shape", lambda b=b: getattr(op, b)(M, Y), P.ELEMWISE) for b in BINARY]
    + [
        ("logical_not", lambda: op.logical_not(C), P.ELEMWISE),
        ("logical_and", lambda: op.logical_and(C, C), P.ELEMWISE),
        ("logical_or", lambda: op.logical_or(C, C), P.ELEMWISE),
        ("cast", lambda: op.cast(M, "float16"), P.ELEMWISE),
        ("clip", lambda: op.clip(M, 0.0, 1.0), P.ELEMWISE),
        ("gelu", lambda: op.gelu(M), P.ELEMWISE),
        ("where", lambda: op.where(C, M, B), P.BROADCAST),
        ("nn.dropout", lambda: op.nn.dropout(M), P.ELEMWISE),
        ("nn.batch_norm", lambda: op.nn.batch_norm(X4, *[v(n, (4,)) for n in "gbmv"]),
         P.BROADCAST),
        ("broadcast_to", lambda: op.broadcast_to(B, (4, 8)), P.BROADCAST),
        ("expand_dims", lambda: op.expand_dims(M, axis=1), P.BROADCAST),
        ("squeeze", lambda: op.squeeze(v("s", (4, 1, 8)), axis=[1]), P.BROADCAST),
        ("concat", lambda: op.concat([M, Y], axis=0), P.INJECTIVE),
        ("pad", lambda: op.pad(M, pad_width=((1, 1), (0, 2))), P.INJECTIVE),
        ("reshape", lambda: op.reshape(M, (8, 4)), P.INJECTIVE),
        ("split", lambda: op.split(M, 2, axis=1), P.INJECTIVE),
        ("strided_slice",
         lambda: op.strided_slice(M, begin=[1], end=[4], strides=[2], axes=[0]), P.INJECTIVE),
        ("take", lambda: op.take(M, IDX, axis=0), P.INJECTIVE),
        ("transpose", lambda: op.transpose(M), P.INJECTIVE),
        ("sum", lambda: op.sum(M), P.COMM_REDUCE),
        ("max", lambda: op.max(X4, axis=[2, 3]), P.COMM_REDUCE),
        ("min", lambda: op.min(X4, axis=[1]), P.COMM_REDUCE),
        ("prod", lambda: op.prod(M, axis=[1]), P.COMM_REDUCE),
        ("mean", lambda: op.mean(X4, axis=[2, 3]), P.COMM_REDUCE),
        ("argmax", lambda: op.argmax(X4, axis=1), P.COMM_REDUCE),
        ("argmin", lambda: op.argmin(X4, axis=1), P.COMM_REDUCE),
        ("dense", lambda: op.dense(M, W), P.OUT_EWISE_FUSABLE),
        ("dense/one-row", lambda: op.dense(v("r", (1, 8)), W), P.OUT_EWISE_FUSABLE),
        ("matmul", lambda: op.matmul(M, v("k", (8, 5))), P.OUT_EWISE_FUSABLE),
        ("nn.conv2d", lambda: op.nn.conv2d(X4, v("cw", (6, 4, 3, 3)), padding=1),
         P.OUT_EWISE_FUSABLE),
        ("nn.conv2d/1x1", lambda: op.nn.conv2d(X4, v("cw", (6, 4, 1, 1))), P.OUT_EWISE_FUSABLE),
        ("nn.max_pool2d", lambda: op.nn.max_pool2d(X4, pool_size=2, strides=2),
         P.OUT_EWISE_FUSABLE),
        ("nn.avg_pool2d", lambda: op.nn.avg_pool2d(X4, pool_size=3, padding=1),
         P.OUT_EWISE_FUSABLE),
        ("nn.adaptive_max_pool2d", lambda: op.nn.adaptive_max_pool2d(X4, output_size=3),
         P.OUT_EWISE_FUSABLE),
        ("nn.adaptive_avg_pool2d", lambda: op.nn.adaptive_avg_pool2d(X4, output_size=3),
         P.OUT_EWISE_FUSABLE),
        # one output cell: the window is the whole input, a plain reduction (see below)
        ("nn.adaptive_avg_pool2d/global", lambda: op.nn.adaptive_avg_pool2d(X4, output_size=1),
         P.COMM_REDUCE),
        ("nn.softmax", lambda: op.nn.softmax(M), P.OPAQUE),
        ("nn.log_softmax", lambda: op.nn.log_softmax(M), P.OPAQUE),
        ("nn.layer_norm", lambda: op.nn.layer_norm(M, B, B), P.OPAQUE),
    ]
)

# The operators of kiln/op/{elementwise,reduce,shape,linalg,nn}.py when this test was written.
CORE_OPS = set(UNARY) | set(BINARY) | {
    "logical_not", "logical_and", "logical_or", "cast", "clip", "gelu", "where", "nn.dropout",
    "nn.batch_norm", "broadcast_to", "expand_dims", "squeeze", "concat", "pad", "reshape",
    "split", "strided_slice", "take", "transpose", "sum", "max", "min", "prod", "mean",
    "argmax", "argmin", "dense", "matmul", "nn.conv2d", "nn.max_pool2d", "nn.avg_pool2d",
    "nn.adaptive_max_pool2d", "nn.adaptive_avg_pool2d", "nn.softmax", "nn.log_softmax",
    "nn.layer_norm",
}

# Where the derived pattern may differ from the declaration:
# - a pattern of the injective family may be *refined* (an add of equal shapes is element-wise,
#   expand_dims/squeeze/broadcast_to read their input at a subsequence of the output indices);
# - global average pooling (adaptive pooling to 1x1) is a plain reduction.
KNOWN_DIFFERENCES = {"nn.adaptive_avg_pool2d/global"}


def legalized(make_call):
    bb = g.BlockBuilder()
    with bb.function("main", PARAMS):
        call = bb.normalize(make_call())
        res = legalize_call(bb, call)
        bb.emit_func_output(M)
    return call.op.name, bb.get()[res.args[0].name]


@pytest.mark.parametrize("case,make,expected", CASES, ids=[c[0] for c in CASES])
def test_derived_pattern_of_every_op(case, make, expected):
    name, func = legalized(make)
    derived = analyze_op_pattern(func)
    assert derived == expected, block_patterns(func)
    declared = get_op_def(name).pattern
    if case in KNOWN_DIFFERENCES or derived == declared:
        return
    assert declared <= P.INJECTIVE and derived < declared, (case, derived, declared)


def test_other_registered_ops_agree_with_their_declaration():
    """Ops without a case above (added by other families later) are checked on a (4, 8) or
    NCHW tensor when they take one tensor and default attributes; ops that need particular
    inputs are left to their own tests."""
    covered = set()
    bb = g.BlockBuilder()
    with bb.function("main", PARAMS):
        for _, make, _ in CASES:
            covered.add(bb.normalize(make()).op.name)
        bb.emit_func_output(M)
    assert CORE_OPS <= covered
    for name in sorted(set(list_ops()) - covered):
        opdef = get_op_def(name)
        if len(opdef.inputs) != 1:
            continue
        func = None
        for arg in (M, X4):
            try:
                _, func = legalized(lambda opdef=opdef, arg=arg: opdef(arg))
                break
            except KilnError:
                continue
        if func is None:
            continue
        derived, declared = analyze_op_pattern(func), opdef.pattern
        assert derived == declared or (declared <= P.INJECTIVE and derived < declared), name


def _func(*stages):
    return te.create_prim_func(list(stages))


def test_hand_written_functions():
    a = te.placeholder((4, 8), "float32", name="A")
    b = te.placeholder((8, 4), "float32", name="B")
    k = te.reduce_axis((0, 8), name="k")
    # a window over a spatial index is OUT_EWISE_FUSABLE, a product of two reads too
    mm = te.compute((4, 4), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    assert analyze_op_pattern(_func(a, b, mm)) == P.OUT_EWISE_FUSABLE
    r = te.reduce_axis((0, 3), name="r")
    win = te.compute((4, 6), lambda i, j: te.max(a[i, j + r], axis=r), name="win")
    assert analyze_op_pattern(_func(a, win)) == P.OUT_EWISE_FUSABLE
    # a product of one read with a constant is still a plain reduction
    s = te.compute((4,), lambda i: te.sum(a[i, k] * 2.0, axis=k), name="s")
    assert analyze_op_pattern(_func(a, s)) == P.COMM_REDUCE
    # a reduction whose result is broadcast back over the reduced axis: a normalization
    norm = te.compute((4, 8), lambda i, j: a[i, j] / s[i], name="norm")
    assert analyze_op_pattern(_func(a, norm)) == P.OPAQUE
    # a reduction followed by an element-wise stage of its result
    twice = te.compute((4,), lambda i: s[i] * 2.0, name="twice")
    assert analyze_op_pattern(_func(a, twice)) == P.COMM_REDUCE
    # gather with a data-dependent index: injective
    idx = te.placeholder((4,), "int64", name="I")
    gat = te.compute((4, 8), lambda i, j: a[idx[i], j], name="gat")
    assert analyze_op_pattern(_func(a, idx, gat)) == P.INJECTIVE
    # reversed index order is not a broadcast
    tr = te.compute((8, 4), lambda i, j: a[j, i], name="tr")
    assert analyze_op_pattern(_func(a, tr)) == P.INJECTIVE
    # a slice read at the output's indices (different extents) is injective, not broadcast
    sl = te.compute((2, 8), lambda i, j: a[i, j], name="sl")
    assert analyze_op_pattern(_func(a, sl)) == P.INJECTIVE


def test_symbolic_shapes():
    n = tir.Var("n", "int64")
    a = te.placeholder((n, 8), "float32", name="A")
    bias = te.placeholder((8,), "float32", name="b")
    out = te.compute((n, 8), lambda i, j: a[i, j] + bias[j], name="out")
    assert analyze_op_pattern(_func(a, bias, out)) == P.BROADCAST
    ew = te.compute((n, 8), lambda i, j: a[i, j] * 2.0, name="ew")
    assert analyze_op_pattern(_func(a, ew)) == P.ELEMWISE


def test_non_block_body_is_opaque():
    buf = tir.decl_buffer((4,), "float32", "A")
    hv = tir.Var("A", "handle")
    i = tir.Var("i", "int64")
    body = tir.For(i, tir.const("int64", 0), tir.const("int64", 4), tir.ForKind.SERIAL,
                   tir.BufferStore(buf, tir.const("float32", 0), (i,)))
    func = tir.PrimFunc((hv,), {hv: buf}, body)
    assert analyze_op_pattern(func) == P.OPAQUE


def _module():
    a = te.placeholder((4, 8), "float32", name="A")
    out = te.compute((4, 8), lambda i, j: a[i, j] * 2.0, name="out")
    hand = _func(a, out)
    declared = hand.with_attr("op_pattern", int(P.OPAQUE))
    return IRModule({"hand": hand, "declared": declared})


def test_pass_fills_missing_patterns_only():
    mod = _module()
    out = AnnotateTIROpPattern()(mod)
    assert out["hand"].attrs["op_pattern"] == int(P.ELEMWISE)
    assert out["declared"] is mod["declared"]  # the declaration wins
    assert "op_pattern" not in mod["hand"].attrs  # the input is not modified


def test_pass_overwrite():
    out = AnnotateTIROpPattern(overwrite=True)(_module())
    assert out["declared"].attrs["op_pattern"] == int(P.ELEMWISE)
    assert AnnotateTIROpPattern.info.opt_level == 0
