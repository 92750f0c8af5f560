"""The TIR text printer: expressions, statements, blocks, buffers, PrimFuncs, te tensors."""

from kiln import te, tir
from kiln.tir import (
    Allocate,
    AssertStmt,
    Block,
    BlockRealize,
    BufferRegion,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    IterType,
    IterVar,
    Let,
    LetStmt,
    Range,
    SeqStmt,
    Var,
)
from kiln.tir.printer import script


def test_precedence_aware_parentheses():
    a, b, c = Var("a"), Var("b"), Var("c")
    assert str((a + b) * c) == "(a + b) * c"
    assert str(a + b * c) == "a + b * c"
    assert str(a - (b - c)) == "a - (b - c)"
    assert str((a - b) - c) == "a - b - c"
    assert str(a // (b * c)) == "a // (b * c)"
    assert str((a // b) * c) == "a // b * c"
    assert str(a % 4 + 1) == "a % 4 + 1"
    assert str(tir.logical_and(a < b, tir.logical_or(b < c, a > c))) == "a < b and (b < c or a > c)"
    assert str(tir.eq(a + 1, b)) == "a + 1 == b"
    assert str(tir.logical_not(a < b)) == "not a < b"


def test_expression_spellings():
    a, b = Var("a"), Var("b")
    x = Var("x", "float32")
    assert str(tir.exp(x) / (x + 1.0)) == "exp(x) / (x + 1.0)"
    assert str(tir.truncdiv(a, b)) == "truncdiv(a, b)"
    assert str(tir.truncmod(a, 3)) == "truncmod(a, 3)"
    assert str(tir.max(a, b)) == "max(a, b)"
    assert str(tir.select(a < b, x, 2.0)) == "select(a < b, x, 2.0)"
    assert str(tir.cast("float16", x)) == "cast(float16, x)"
    assert str(tir.const("float16", 1.5)) == "float16(1.5)"
    assert str(tir.const("int8", -3)) == "int8(-3)"
    assert str(tir.const("bool", True)) == "True"
    assert str(tir.const("float32", float("-inf"))) == "-inf"
    assert str(tir.Ramp(a, 1, 4)) == "ramp(a, 1, 4)"
    assert str(tir.Broadcast(x, 8)) == "broadcast(x, 8)"
    assert str(Let(b, a + 1, b * b) + 1) == "(let b = a + 1 in b * b) + 1"
    buf = tir.decl_buffer((4, 4), "float32", "A")
    assert str(buf[a, b + 1]) == "A[a, b + 1]"
    assert str(tir.decl_buffer((), "float32", "S")[()]) == "S[()]"


def test_clashing_names_get_suffixes():
    a1, a2, a3 = Var("a"), Var("a"), Var("a")
    assert str(a1 + a2 + a3) == "a + a_1 + a_2"
    assert str(a1 + a1) == "a + a"


def test_buffers_and_regions():
    X = tir.decl_buffer((16,), "float32", "X", scope="local")
    assert str(X) == 'X: Buffer((16,), "float32", scope="local")'
    n = Var("n", "int64")
    Y = tir.decl_buffer((n, 4), "int8", "Y")
    assert str(Y) == 'Y: Buffer((n, 4), "int8")'
    i = Var("i", "int64")
    r = BufferRegion(Y, (Range(i, tir.const("int64", 1)), Range(0, 4)))
    assert str(r) == "Y[i, 0:4]"
    assert str(Range(2, 4)) == "Range(min=2, extent=4)"
    assert str(IterVar(Range(2, 4), i, IterType.COMM_REDUCE)) == "iter_var(i, range(2, 6), reduce)"


def test_statements():
    i, j = Var("i", "int64"), Var("j", "int64")
    X = tir.decl_buffer((16,), "float32", "X", scope="local")
    Y = tir.decl_buffer((16,), "float32", "Y")
    body = IfThenElse(i < j, BufferStore(X, Y[i * 4 + j], (i * 4 + j,)), Evaluate(0))
    loop = For(i, 0, 4, ForKind.PARALLEL, For(j, 2, 4, ForKind.VECTORIZED, body), {"p": 1})
    stmt = Allocate(X, AssertStmt(i < 3, "bad", LetStmt(Var("t", "int64"), i + 1, loop)))
    assert str(stmt).splitlines() == [
        'allocate X: Buffer((16,), "float32", scope="local")',
        'assert i < 3, "bad"',
        "t: int64 = i + 1",
        'for i in parallel(4, annotations={"p": 1}):',
        "    for j in vectorized(2, 6):",
        "        if i < j:",
        "            X[i * 4 + j] = Y[i * 4 + j]",
        "        else:",
        "            evaluate(0)",
    ]
    assert str(For(i, 0, 3, ForKind.UNROLLED, SeqStmt(()))).splitlines() == [
        "for i in unroll(3):", "    pass",
    ]


def test_block_with_predicate_and_allocs():
    i, vi = Var("i", "int64"), Var("vi", "int64")
    X = tir.decl_buffer((16,), "float32", "X")
    Y = tir.decl_buffer((16,), "float32", "Y")
    blk = Block(
        (IterVar(Range(0, 16), vi, IterType.DATA_PAR),),
        (BufferRegion(Y, (Range(0, 16),)),),
        (BufferRegion(X, (Range(vi, 1),)),),
        "b",
        BufferStore(X, Y[vi], (vi,)),
        alloc_buffers=(tir.decl_buffer((2, 2), "int8", "T", scope="local"),),
        annotations={"a": 1},
    )
    text = str(BlockRealize((i * 2,), i < 8, blk))
    assert text.splitlines() == [
        'with block("b"):',
        "    vi = axis.spatial(16, i * 2)",
        "    where(i < 8)",
        "    reads(Y[0:16])",
        "    writes(X[vi])",
        '    alloc_buffer(T: Buffer((2, 2), "int8", scope="local"))',
        '    annotations({"a": 1})',
        "    X[vi] = Y[vi]",
    ]


def _matmul_relu():
    n = te.var("n")
    A = te.placeholder((n, 16), name="A")
    B = te.placeholder((16, 4), name="B")
    k = te.reduce_axis((0, 16), name="k")
    C = te.compute((n, 4), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((n, 4), lambda i, j: tir.max(C[i, j], 0.0), name="D")
    return te.create_prim_func([A, B, D])


def test_prim_func_text():
    text = str(_matmul_relu())
    assert text.splitlines() == [
        '@prim_func(attrs={"global_symbol": "D", "num_outputs": 1})',
        'def D(A: Buffer((n, 16), "float32"), B: Buffer((16, 4), "float32"), '
        'D: Buffer((n, 4), "float32")):',
        '    n = var("int64")',
        '    with block("root"):',
        '        alloc_buffer(C: Buffer((n, 4), "float32"))',
        "        for i in range(n):",
        "            for j in range(4):",
        "                for k in range(16):",
        '                    with block("C"):',
        "                        v_i = axis.spatial(n, i)",
        "                        v_j = axis.spatial(4, j)",
        "                        v_k = axis.reduce(16, k)",
        "                        reads(A[v_i, v_k], B[v_k, v_j])",
        "                        writes(C[v_i, v_j])",
        "                        with init():",
        "                            C[v_i, v_j] = 0.0",
        "                        C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]",
        "        for i_1 in range(n):",
        "            for j_1 in range(4):",
        '                with block("D"):',
        "                    v_i_1 = axis.spatial(n, i_1)",
        "                    v_j_1 = axis.spatial(4, j_1)",
        "                    reads(C[v_i_1, v_j_1])",
        "                    writes(D[v_i_1, v_j_1])",
        "                    D[v_i_1, v_j_1] = max(C[v_i_1, v_j_1], 0.0)",
    ]


def test_prim_func_name_argument_and_scalar_params():
    s = te.var("s", "float32")
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] * s, name="B")
    f = te.create_prim_func([A, s, B])
    first = script(f, name="scale").splitlines()[1]
    assert first == 'def scale(A: Buffer((4,), "float32"), s: float32, B: Buffer((4,), "float32")):'


def test_printing_is_deterministic():
    f = _matmul_relu()
    assert str(f) == str(f)
    assert str(f) == str(_matmul_relu())  # independent, structurally equal builds print alike


def test_reduce_and_te_reprs():
    A = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((1, 5), name="k")
    S = te.compute((4,), lambda i: te.max(A[i, k], axis=k, where=k < 3), name="S")
    assert str(S.op.body) == "max(A[i, k], axis=[k in range(1, 5)], where=k < 3, init=-inf)"
    assert str(A) == (
        'Tensor(A: Buffer((4, 5), "float32"), op=placeholder((4, 5), "float32", name="A"))'
    )
    assert str(S).startswith('Tensor(S: Buffer((4,), "float32"), op=compute((4,), lambda i: max(')
    prod = te.comm_reducer(lambda x, y: x * y, lambda t: 1, name="prod")
    P = te.compute((4,), lambda i: prod(A[i, k], axis=k), name="P")
    assert str(P.op.body) == (
        "reduce(comm_reducer(lambda x, y: x * y, identity=1.0), A[i, k], axis=[k in range(1, 5)])"
    )
