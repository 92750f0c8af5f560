"""Instruction selection for the NPU's element-wise kernels: the forms enumerated, the
description's limits (each rejection with its reason), the cost model's choice, and that the
choice changes blocks only -- the same bits as the fixed plan, the same instruction stream on
both lowering routes."""

import math

import numpy as np
import pytest

import kiln
from kiln import op
from kiln.codegen.npu import LOWERING_KEY
from kiln.codegen.npu.executable import NpuStep
from kiln.schedule.npu import LoweringContext
from kiln.schedule.npu.isel import (
    Form,
    check_form,
    enumerate_forms,
    fixed_form,
    form_cost,
    select_form,
)
from kiln.schedule.npu.nest_analysis import analyse_elementwise
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext

HW = ["default", "edge"]


def _nest(hw, out_shape, in_shapes, cdt="float32", opcodes=("vadd",), dtype="float32"):
    cfg = load_config(hw)
    ctx = LoweringContext(cfg)
    out = ctx.alloc(out_shape, dtype)
    ins = [ctx.alloc(s, dtype) for s in in_shapes]
    return cfg, ctx.kb.nbuf, analyse_elementwise(cfg, out, ins, cdt, opcodes)


def _old_plan(cfg, nbuf, nest):
    """The plan before the search, written out again: the dims merged wherever the strides
    allow, the largest block halving the innermost axis first, then the next."""
    dims, strides = [], []
    for i, n in enumerate(nest.dims):
        ss = [b.strides[i] for b in (nest.out, *nest.inputs)]
        if dims and all(p == q * n for p, q in zip(strides[-1], ss)):
            dims[-1] *= n
            strides[-1] = ss
        else:
            dims.append(n)
            strides.append(ss)
    while len(dims) < 3:
        dims.insert(0, 1)
        strides.insert(0, [0] * len(strides[0]))
    last = dims[-3:]
    sizes = [b.itemsize for b in nest.inputs]
    osz = nest.out.itemsize + (4 if nest.compute_dtype != nest.out.dtype else 0)

    def fits(t):
        if max(t) > cfg.encoding.max_extent:
            return False
        for m, mem in enumerate(("input", "weight")):
            need = 0
            for j, sz in enumerate(sizes):
                if j % 2 != m:
                    continue
                st = [strides[d][j + 1] for d in range(len(dims))][-3:]
                need += nbuf * math.prod(n if s else 1 for n, s in zip(t, st)) * sz
            if need > cfg.memory(mem).size:
                return False
        return nbuf * (math.prod(t) * osz + 16) <= cfg.memory("acc").size

    t = [1, 1, 1]
    for axis in (2, 1, 0):
        e = last[axis]
        while e > 1 and not fits([e if i == axis else t[i] for i in range(3)]):
            e = math.ceil(e / 2)
        t[axis] = e
        if e < last[axis]:
            break
    return tuple(dims), tuple(t)


SHAPES = [((4096,), [(4096,), (4096,)]), ((1, 64, 56, 56), [(1, 64, 56, 56), (1, 64, 1, 1)]),
          ((128, 3072), [(128, 3072), (3072,)]), ((3, 17, 101), [(3, 17, 101), (17, 1)]),
          ((2, 3, 5, 7, 11), [(2, 3, 5, 7, 11), (5, 1, 1)]), ((7,), [(7,), (1,)])]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("out_shape,in_shapes", SHAPES)
def test_fixed_form_is_the_old_plan(hw, out_shape, in_shapes):
    cfg, nbuf, nest = _nest(hw, out_shape, in_shapes)
    f = fixed_form(cfg, nbuf, nest)
    assert (f.dims, f.tile) == _old_plan(cfg, nbuf, nest)
    assert f.reshape == "merged"


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("out_shape,in_shapes", SHAPES)
def test_search_estimates_no_worse_than_the_fixed_plan(hw, out_shape, in_shapes):
    """The chosen form is legal, the fixed plan's form is among those considered, and the
    choice is estimated no slower than it."""
    cfg, nbuf, nest = _nest(hw, out_shape, in_shapes, opcodes=("vadd", "vexp"))
    sel = select_form(cfg, nbuf, nest)
    base = fixed_form(cfg, nbuf, nest)
    assert sel.searched and check_form(cfg, nbuf, nest, sel.form) is None
    assert base in enumerate_forms(cfg, nest)
    assert sel.estimate <= form_cost(cfg, nbuf, nest, base)
    assert sel.considered == len(enumerate_forms(cfg, nest))
    # every block covers the nest: the forms' dims multiply to its elements
    assert math.prod(sel.form.dims) == nest.elements


def test_forms_cover_reshapes_and_ranks():
    cfg, nbuf, nest = _nest("default", (1, 64, 56, 56), [(1, 64, 56, 56), (1, 64, 56, 56)])
    forms = enumerate_forms(cfg, nest)
    kinds = {f.reshape for f in forms}
    assert "merged" in kinds and any(k.startswith("split ") for k in kinds)
    assert {f.rank for f in forms} == {1, 2}  # a merged 1-D axis or rows of a split
    for f in forms:
        if f.reshape.startswith("split "):
            width = int(f.reshape.split()[1])
            assert f.dims[-1] == width and width * 4 % cfg.memory("dram").burst == 0


def test_limits_reject_with_their_reason():
    cfg, nbuf, nest = _nest("edge", (64, 4096), [(64, 4096), (64, 4096)])
    dims = (1, 64, 4096)
    st = ((0, 4096, 1),) * 3
    assert check_form(cfg, nbuf, nest, Form(dims, st, (1, 1, 64), "merged")) is None
    assert check_form(cfg, nbuf, nest, Form(dims, st, (1, 64, 4096), "merged")) == "L0 input"
    big = cfg.encoding.max_extent + 1
    assert check_form(cfg, nbuf, nest, Form((1, 1, big), ((0, 0, 1),) * 3, (1, 1, big),
                                            "merged")) == "max_extent"
    bad = ((0, 0, 0), (0, 4096, 1), (0, 4096, 1))
    assert check_form(cfg, nbuf, nest, Form(dims, bad, (1, 1, 64), "merged")) == \
        "broadcast result"
    cfg, nbuf, nest = _nest("edge", (64,), [(64,)], cdt="int64", opcodes=("vadd",),
                            dtype="int64")
    assert check_form(cfg, nbuf, nest, Form((1, 1, 64), ((0, 0, 1),) * 2, (1, 1, 64),
                                            "merged")) == "dtype"
    sel = select_form(*_nest("edge", (64, 4096), [(64, 4096), (64, 4096)]))
    assert dict(sel.rejected).get("L0 input", 0) > 0
    assert "rejected (" in sel.describe() and "L0 input" in sel.describe()


def test_knob_restores_the_fixed_plan(monkeypatch):
    cfg, nbuf, nest = _nest("default", (97, 251), [(97, 251)], opcodes=("vexp",))
    monkeypatch.setenv("KILN_NPU_ISEL", "0")
    sel = select_form(cfg, nbuf, nest)
    assert not sel.searched and sel.form == fixed_form(cfg, nbuf, nest)
    assert sel.describe() == "fixed plan"
    monkeypatch.setenv("KILN_NPU_ISEL", "1")
    assert select_form(cfg, nbuf, nest).searched


CASES = [("default", lambda a: op.exp(a), np.exp, [(97, 251)]),
         ("default", lambda a, b: op.subtract(a, b), np.subtract, [(3, 17, 101), (17, 1)]),
         ("edge", lambda a, b: op.add(a, b), np.add, [(4096,), (4096,)])]


def _build(fn, shapes, hw, route):
    with PassContext(config={LOWERING_KEY: route}):
        return kiln.build(graph_module(fn, shapes), target=kiln.Target("npu", hw=hw))


@pytest.mark.parametrize("hw,fn,ref,shapes", CASES)
def test_search_changes_blocks_not_bits(monkeypatch, hw, fn, ref, shapes):
    """Where the search picks another form than the fixed plan: the same output bits (and
    numpy's values), and both routes give the same instruction stream."""
    rng = np.random.default_rng(len(shapes))
    xs = [rng.standard_normal(s).astype("float32") for s in shapes]
    monkeypatch.setenv("KILN_NPU_ISEL", "0")
    fixed = _build(fn, shapes, hw, "emit")
    monkeypatch.setenv("KILN_NPU_ISEL", "1")
    emit, tir = _build(fn, shapes, hw, "emit"), _build(fn, shapes, hw, "tir")
    (kf,), (ke,), (kt,) = fixed.kernels, emit.kernels, tir.kernels
    assert ke.tiling.split(" [")[0] != kf.tiling.split(" [")[0]  # another form was chosen
    assert "[isel " in ke.tiling and "forms" in ke.tiling and kt.tiling == "TIR: " + ke.tiling
    streams = [[s.program.streams for s in e.steps if isinstance(s, NpuStep)]
               for e in (emit, tir)]
    assert streams[0] == streams[1]
    want = np.asarray(fixed(*xs))
    for exe in (emit, tir):
        got = np.asarray(exe(*xs))
        assert got.tobytes() == want.tobytes()
    np.testing.assert_allclose(want, ref(*xs), rtol=1e-5, atol=1e-6)
