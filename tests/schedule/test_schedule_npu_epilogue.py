"""A product's element-wise epilogue on its accumulator tiles (kiln/schedule/npu/epilogue.py):
conv2d (implicit GEMM and pointwise), dense and matmul with bias, batch norm, relu, clip, a
residual add and the cast for the next product, on both descriptions and both lowering
routes -- bit-identical to the unfused kernels, close to numpy, fewer kernels and DRAM bytes;
a result with two consumers stored twice (no cast kernel); the fallback when the
accumulators leave no room (a description with a small L0 acc)."""

import re

import numpy as np
import pytest
import torch

import kiln
from kiln import graph as g
from kiln import op
from kiln.build import npu_pipeline
from kiln.codegen.npu import build_npu
from kiln.schedule.npu.emit import MEM_ID, DramTensor
from kiln.schedule.npu.epilogue import Epilogue, broadcast_strides, chunks
from kiln.schedule.npu.vector import VecStep
from kiln.target.npu import load_config
from kiln.testing.npu_descriptions import edited_description
from kiln.transform.npu import npu_functions, partition_for_npu
from kiln.transform.pass_infra import PassContext

RNG = np.random.default_rng(23)


def _module(body, shapes):
    bb = g.BlockBuilder()
    xs = [g.Var(f"x{i}", g.TensorStructInfo(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = body(bb, *xs)
        bb.emit_func_output(out)
    return bb.get()


def _const(*shape, scale=0.5):
    return g.const((RNG.standard_normal(shape) * scale).astype("float32"))


def _build(mod, hw, route, fuse, **config):
    """Every tensor in DRAM (``residency=False``): the tests count what fusion saves there.
    ``config``: more PassContext options (``npu_prefetch=False`` for ``"npu.prefetch"``)."""
    with PassContext(config={"npu.lowering": route,
                             **{k.replace("_", ".", 1): v for k, v in config.items()}}):
        return build_npu(npu_pipeline()(mod), kiln.Target("npu", hw=hw), fuse_epilogue=fuse,
                         residency=False)


def _outputs(exe, inputs):
    out = exe(*inputs)
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _labels(exe):
    return [k.label.split(":", 1)[1] for k in exe.kernels]


def _check(mod, inputs, reference, hw, fused_labels, tol=2e-2):
    """Fused and unfused builds on both routes: the same bits, the same cycles per route
    pair, the fused labels present, the result close to ``reference``; returns the fused
    and unfused executables of the TIR route."""
    exes, outs = {}, {}
    for route in ("tir", "emit"):
        for fuse in (False, True):
            exes[route, fuse] = exe = _build(mod, hw, route, fuse)
            outs[route, fuse] = _outputs(exe, inputs)
    base = outs["emit", False]
    for key, out in outs.items():
        for a, b in zip(out, base):
            assert np.array_equal(a, b), key
    for fuse in (False, True):  # both routes: the same program, so the same cycles
        assert exes["tir", fuse].last_cycles == exes["emit", fuse].last_cycles
    labels = _labels(exes["tir", True])
    for want in fused_labels:
        assert want in labels, labels
    assert not any("+" in lab for lab in _labels(exes["tir", False]) if "nn.conv2d" in lab
                   or "dense" in lab or "matmul" in lab)
    for o, r in zip(outs["tir", True], reference):
        err = np.max(np.abs(o - r)) / max(np.max(np.abs(r)), 1e-6)
        assert err < tol, err
    on, off = exes["tir", True], exes["tir", False]
    assert len(on.kernels) < len(off.kernels)
    traffic = [sum(r.dram_read + r.dram_written for r in e.last_reports) for e in (on, off)]
    assert traffic[0] < traffic[1]
    return on, off


def _conv(x, w, b=None, stride=1, pad=0):
    return torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w),
                                      None if b is None else torch.tensor(b),
                                      stride=stride, padding=pad).numpy()


def _conv_residual_relu(w, shape):
    """relu(conv2d(x, w, padding 1) + res): a product whose fused epilogue loads a residual."""
    def body(bb, x, res):
        c = bb.emit(op.nn.conv2d(x, w, padding=(1, 1)), "c")
        a = bb.emit(op.add(c, res), "a")
        return bb.emit_output(op.nn.relu(a), "y")

    return _module(body, [shape, shape])


@pytest.mark.parametrize("hw", ["default", "edge"])
def test_conv_bias_relu_and_pointwise_bn(hw):
    """A 3x3 conv (prime channels and size) + per-channel bias + relu, then a pointwise conv
    (channels on the GEMM's M axis) + batch norm's multiply/add + clip: each product's chain
    runs on its tiles; the first chain's result is cast for the pointwise conv in its
    epilogue (no cast kernel between them)."""
    w1, b1 = _const(7, 5, 3, 3), _const(7, 1, 1)
    w2, s2, t2 = _const(11, 7, 1, 1), _const(11, 1, 1), _const(11, 1, 1)

    def body(bb, x):
        c = bb.emit(op.nn.conv2d(x, w1, padding=(1, 1)), "c")
        a = bb.emit(op.add(c, b1), "a")
        r = bb.emit(op.nn.relu(a), "r")
        p = bb.emit(op.nn.conv2d(r, w2), "p")
        m = bb.emit(op.multiply(p, s2), "m")
        s = bb.emit(op.add(m, t2), "s")
        return bb.emit_output(op.clip(s, 0.0, 6.0), "y")

    mod = _module(body, [(1, 5, 13, 11)])
    x = RNG.standard_normal((1, 5, 13, 11)).astype("float32")
    r = np.maximum(_conv(x, w1.data, b1.data.reshape(-1), pad=1), 0)
    ref = np.clip(_conv(r, w2.data) * s2.data + t2.data, 0, 6)
    on, off = _check(mod, [x], [ref], hw, ["nn.conv2d+add+relu",
                                            "nn.conv2d+multiply+add+clip"])
    assert sum("cast" in lab for lab in _labels(on)) == 1  # only the model input's
    assert sum("cast" in lab for lab in _labels(off)) == 1


@pytest.mark.parametrize("hw", ["default", "edge"])
def test_residual_block_stores_float32_and_float16(hw):
    """conv + bn + relu whose result feeds both the next conv (float16) and the residual add
    (float32): the epilogue stores both, no cast kernel; the second conv's epilogue adds the
    residual (a DRAM tensor loaded per tile) and relus. AnnotateMemoryScope says the convs'
    results never reach DRAM."""
    w1, s1, t1 = _const(6, 6, 3, 3), _const(6, 1, 1), _const(6, 1, 1)
    w2 = _const(6, 6, 3, 3)

    def body(bb, x):
        c = bb.emit(op.nn.conv2d(x, w1, padding=(1, 1)), "c")
        m = bb.emit(op.multiply(c, s1), "m")
        a = bb.emit(op.add(m, t1), "a")
        r = bb.emit(op.nn.relu(a), "r")
        d = bb.emit(op.nn.conv2d(r, w2, padding=(1, 1)), "d")
        e = bb.emit(op.add(d, r), "e")
        return bb.emit_output(op.nn.relu(e), "y")

    mod = _module(body, [(2, 6, 17, 7)])
    x = RNG.standard_normal((2, 6, 17, 7)).astype("float32")
    r = np.maximum(_conv(x, w1.data, pad=1) * s1.data + t1.data, 0)
    ref = np.maximum(_conv(r, w2.data, pad=1) + r, 0)
    on, off = _check(mod, [x], [ref], hw, ["nn.conv2d+multiply+add+relu", "nn.conv2d+add+relu"])
    assert sum("cast" in lab for lab in _labels(on)) == 1
    assert sum("cast" in lab for lab in _labels(off)) == 2
    part = partition_for_npu(load_config(hw))(npu_pipeline()(mod))
    scopes = part[npu_functions(part)[0]].attrs["npu.memory_scope"]
    assert scopes["c"] == scopes["d"] == "l0.acc (fused, never in DRAM)"
    assert scopes["r"].startswith("l0.acc -> dram")


def test_result_read_by_products_only_is_stored_cast_once():
    """A downsampling block's input (read by its 3x3/s2 and 1x1/s2 convolutions, nothing
    else): the epilogue stores it in float16 only -- no cast kernel, no float32 copy."""
    w0, b0 = _const(6, 3, 3, 3), _const(6, 1, 1)
    w1, w2 = _const(8, 6, 3, 3), _const(8, 6, 1, 1)

    def body(bb, x):
        c = bb.emit(op.nn.conv2d(x, w0, padding=(1, 1)), "c")
        r = bb.emit(op.nn.relu(bb.emit(op.add(c, b0), "a")), "r")
        d = bb.emit(op.nn.conv2d(r, w1, strides=(2, 2), padding=(1, 1)), "d")
        s = bb.emit(op.nn.conv2d(r, w2, strides=(2, 2)), "s")
        return bb.emit_output(op.add(d, s), "y")

    mod = _module(body, [(1, 3, 15, 15)])
    x = RNG.standard_normal((1, 3, 15, 15)).astype("float32")
    r = np.maximum(_conv(x, w0.data, b0.data.reshape(-1), pad=1), 0)
    ref = _conv(r, w1.data, stride=2, pad=1) + _conv(r, w2.data, stride=2)
    on, off = _check(mod, [x], [ref], "default", ["nn.conv2d+add+relu", "nn.conv2d+add"])
    assert sum("cast" in lab for lab in _labels(on)) == 1
    stored = [ins.args["dst"].dtype for st in on.steps[0].program.streams for ins in st
              if ins.op == "dma.store"]
    assert "float16" in stored


@pytest.mark.parametrize("hw", ["default", "edge"])
def test_dense_and_matmul_epilogues(hw):
    """dense (prime sizes) + bias + relu, cast for the next dense in the epilogue; a batched
    matmul + a residual of its shape + clip."""
    w1, b1 = _const(31, 29), _const(31)
    w2, b2 = _const(17, 31), _const(17)

    def body(bb, x, y, z):
        h = bb.emit(op.dense(x, w1), "h")
        a = bb.emit(op.add(h, b1), "a")
        r = bb.emit(op.nn.relu(a), "r")
        o = bb.emit(op.dense(r, w2), "o")
        o1 = bb.emit_output(op.add(o, b2), "o1")
        q = bb.emit(op.matmul(y, z), "q")
        q1 = bb.emit(op.add(q, y), "q1")
        q2 = bb.emit_output(op.clip(q1, -1.0, 1.0), "q2")
        return g.Tuple((o1, q2))

    mod = _module(body, [(13, 29), (3, 19, 19), (3, 19, 19)])
    x = RNG.standard_normal((13, 29)).astype("float32")
    y, z = (RNG.standard_normal((3, 19, 19)).astype("float32") for _ in range(2))
    ref1 = np.maximum(x @ w1.data.T + b1.data, 0) @ w2.data.T + b2.data
    ref2 = np.clip(y @ z + y, -1, 1)
    _check(mod, [x, y, z], [ref1, ref2], hw, ["matmul+add+relu", "matmul+add", "matmul+add+clip"])


def test_no_room_in_the_accumulators_falls_back(tmp_path):
    """A description whose accumulators hold the product's tiles and nothing more: the
    epilogue does not fit, the build emits the product and its chain apart -- the same bits
    as without fusion, never an error."""
    path, cfg = edited_description(tmp_path, "edge-tiny-acc", (
        r'(^\[l0\.acc\]\s*\nsize\s*=\s*)"[^"]*"', r'\1"1 KiB"'), base="edge")
    assert cfg.memory("acc").size == 1024
    w = _const(8, 8, 3, 3)
    mod = _conv_residual_relu(w, (1, 8, 16, 16))
    x, res = (RNG.standard_normal((1, 8, 16, 16)).astype("float32") for _ in range(2))
    outs = {}
    for route in ("tir", "emit"):
        for fuse in (False, True):
            exe = _build(mod, path, route, fuse)
            outs[route, fuse] = _outputs(exe, [x, res])[0]
            if fuse:
                assert "nn.conv2d" in _labels(exe) and "add+relu" in _labels(exe)
                assert not exe.cpu_ops
    for out in outs.values():
        assert np.array_equal(out, outs["emit", False])
    ref = np.maximum(_conv(x, w.data, pad=1) + res, 0)
    assert np.max(np.abs(outs["tir", True] - ref)) / np.max(np.abs(ref)) < 2e-2


def test_chunks_and_broadcast_strides():
    """The pieces an epilogue cuts a tile into cover it once, each within the limit; an
    operand's strides over the result (0 where it broadcasts)."""
    for shape, limit in [((1, 7, 13), 20), ((3, 5, 11), 7), ((1, 1, 29), 4), ((2, 3, 4), 100)]:
        seen = np.zeros(shape, int)
        for o, e in chunks(shape, limit):
            assert np.prod(e) <= limit
            seen[o[0]:o[0] + e[0], o[1]:o[1] + e[1], o[2]:o[2] + e[2]] += 1
        assert (seen == 1).all()
    assert broadcast_strides(DramTensor(0, (7, 1, 1), "float32"), 4) == (0, 1, 0, 0)
    assert broadcast_strides(DramTensor(0, (2, 7, 3, 3), "float32"), 4) == (63, 9, 3, 1)
    assert broadcast_strides(DramTensor(0, (31,), "float32"), 2) == (0, 1)


def _core_streams(exe):
    """Each core's instructions of the program's last kernel (the product)."""
    prog = [s.program for s in exe.steps if getattr(s, "program", None)][-1]
    out = []
    for st in prog.streams:
        bars = [n for n, i in enumerate(st) if i.op == "barrier"]
        out.append(st[bars[-2] + 1 if len(bars) > 1 else 0:bars[-1]])
    return out


def _epilogue_loads(stream):
    """Positions of the DMA loads of the epilogue's operands: float32 into an L0 buffer
    (wherever its home put them; the product's own tiles are float16)."""
    return [n for n, i in enumerate(stream)
            if i.op == "dma.load" and i.args["dst"].mem != MEM_ID["l1"] and
            i.args["dst"].dtype == "float32"]


@pytest.mark.parametrize("route", ["tir", "emit"])
def test_a_broadcast_operand_is_loaded_once_per_core(route):
    """A conv of several output tiles a core, + a per-channel bias and scale + relu: the
    epilogue loads each constant whole once per core (not per chunk of every tile, whose
    DRAM round trips sat in DMA-in's queue ahead of the next step's gathers), with the same
    bits as the unfused kernels."""
    w, b, s = _const(24, 8, 3, 3), _const(24, 1, 1), _const(24, 1, 1)

    def body(bb, x):
        c = bb.emit(op.nn.conv2d(x, w, padding=(1, 1)), "c")
        m = bb.emit(op.multiply(c, s), "m")
        a = bb.emit(op.add(m, b), "a")
        return bb.emit_output(op.nn.relu(a), "y")

    mod = _module(body, [(1, 8, 48, 40)])
    x = RNG.standard_normal((1, 8, 48, 40)).astype("float32")
    # (without the prefetch, which moves the constants' loads into the kernel before)
    on, off = (_build(mod, "default", route, fuse, npu_prefetch=False) for fuse in (True, False))
    assert np.array_equal(_outputs(on, [x])[0], _outputs(off, [x])[0])
    ref = np.maximum(_conv(x, w.data, pad=1) * s.data + b.data, 0)
    out = _outputs(on, [x])[0]
    assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 2e-2
    assert "nn.conv2d+multiply+add+relu" in _labels(on)
    for stream in _core_streams(on):
        stores = sum(i.op == "dma.store" for i in stream)
        assert stores > 2  # several tiles (chunks) a core
        assert len(_epilogue_loads(stream)) == 2  # the bias and the scale, once each


def test_a_residual_is_loaded_after_the_next_steps_gathers():
    """A conv with a residual add fused: the store of a core's output tile (the epilogue's
    residual chunks, loaded by DMA-in) is emitted after the core's next step's loads, so the
    in-order DMA-in queue gathers the next step first; the same bits as unfused, and on both
    routes the same program."""
    w = _const(16, 16, 3, 3)
    mod = _conv_residual_relu(w, (1, 16, 40, 40))
    x, res = (RNG.standard_normal((1, 16, 40, 40)).astype("float32") for _ in range(2))
    ref = np.maximum(_conv(x, w.data, pad=1) + res, 0)
    on, _ = _check(mod, [x, res], [ref], "default", ["nn.conv2d+add+relu"])
    stream = _core_streams(on)[0]
    first = _epilogue_loads(stream)[0]
    last_mma = max(n for n in range(first) if stream[n].op in ("mma", "mma.set"))
    between = stream[last_mma + 1:first]
    assert any(i.op == "dma.load" and i.args["dst"].mem == MEM_ID["input"] for i in between)


def _block_bytes(blk, shape):
    """``[lo, hi)``: the bytes a block of ``shape`` spans."""
    isz = {"float32": 4, "float16": 2, "int32": 4, "int8": 1}[blk.dtype]
    shape = (1,) * (len(blk.strides) - len(shape)) + tuple(shape)
    return blk.addr, blk.addr + (sum((n - 1) * s for n, s in zip(shape, blk.strides)) + 1) * isz


def _residual_bias_then_pointwise():
    """relu(conv3x3(x) + bias + res), read by a 1x1 conv only: the first product's epilogue
    hoists the bias, loads the residual per chunk and casts its result to float16."""
    w1, b1, w2 = _const(16, 16, 3, 3), _const(16, 1, 1), _const(8, 16, 1, 1)

    def body(bb, x, res):
        c = bb.emit(op.nn.conv2d(x, w1, padding=(1, 1)), "c")
        a = bb.emit(op.add(c, b1), "a")
        e = bb.emit(op.add(a, res), "e")
        r = bb.emit(op.nn.relu(e), "r")
        return bb.emit_output(op.nn.conv2d(r, w2), "y")

    shape = (1, 16, 40, 40)
    x, res = (RNG.standard_normal(shape).astype("float32") for _ in range(2))
    ref = _conv(np.maximum(_conv(x, w1.data, b1.data.reshape(-1), pad=1) + res, 0), w2.data)
    return _module(body, [shape, shape]), [x, res], ref


def _home_build(mod, hw, home, bank_plan=True):
    with PassContext(config={"npu.epilogue_home": home, "npu.prefetch": False}):
        return build_npu(npu_pipeline()(mod), kiln.Target("npu", hw=hw), residency=False,
                         bank_plan=bank_plan)


def _kernel_streams(exe, label):
    """Per core, the instructions of kernel ``label`` (between its barrier and the one
    before)."""
    prog = [s.program for s in exe.steps if getattr(s, "program", None)][-1]
    bid = next(b for b, lab in prog.labels.items() if label in lab)
    out = []
    for st in prog.streams:
        bars = [n for n, i in enumerate(st) if i.op == "barrier"]
        end = next(n for n in bars if st[n].args["id"] == bid)
        out.append(st[max([n for n in bars if n < end], default=-1) + 1:end])
    return out


def _epilogue_blocks(exe, label):
    """Per core, the fused epilogue's buffers in kernel ``label``: its operands' loads into
    L0 (float32) and its casts' destinations, each ``(memory name, lo, hi)``; and the
    product's operand slots' loads (float16 into L0 input / weight)."""
    names = {v: k for k, v in MEM_ID.items()}
    out = []
    for stream in _kernel_streams(exe, label):
        ep, slots = [], []
        for i in stream:
            if i.op == "dma.load" and i.args["dst"].mem in (MEM_ID["input"], MEM_ID["weight"],
                                                               MEM_ID["acc"]):
                d = i.args["dst"]
                (ep if d.dtype == "float32" else slots).append(
                    (names[d.mem], *_block_bytes(d, i.args["shape"])))
            elif i.op == "vcast":
                d = i.args["dst"]
                ep.append((names[d.mem], *_block_bytes(d, i.args["shape"])))
        out.append((ep, slots))
    return out


def test_epilogue_buffers_go_to_free_bank_groups_of_weight():
    """On ``default`` (every L0 buffer one port a group) the epilogue's hoisted bias, its
    residual chunks and its cast buffers go to L0 weight / input, in bank groups the
    product's operand slots leave free (each slot in groups of its own): the accumulators
    hold only the product's tiles. The same bits as with the buffers in the accumulators
    (``"npu.epilogue_home": "acc"``) and as unfused, close to torch."""
    mod, inputs, ref = _residual_bias_then_pointwise()
    cfg = load_config("default")
    moved = _home_build(mod, "default", "weight", bank_plan=False)
    label = "nn.conv2d+add+add+relu"
    assert any(label in k.label for k in moved.kernels)
    for ep, slots in _epilogue_blocks(moved, label):
        assert ep and slots
        assert all(mem in ("weight", "input") for mem, _, _ in ep), ep
        assert any(mem == "weight" for mem, _, _ in ep)
        for mem, lo, hi in ep:
            gb = cfg.memory(mem).group_bytes
            groups = set(range(lo // gb, (hi - 1) // gb + 1))
            for smem, slo, shi in slots:
                if smem == mem:
                    sgb = cfg.memory(smem).group_bytes
                    assert not groups & set(range(slo // sgb, (shi - 1) // sgb + 1))
    in_acc = _home_build(mod, "default", "acc", bank_plan=False)
    for ep, _ in _epilogue_blocks(in_acc, label):
        assert ep and all(mem == "acc" for mem, _, _ in ep)
    out = _outputs(moved, inputs)[0]
    assert np.array_equal(out, _outputs(in_acc, inputs)[0])
    assert np.array_equal(out, _outputs(_home_build(mod, "default", "weight"), inputs)[0])
    assert np.array_equal(out, _outputs(_build(mod, "default", "tir", False), inputs)[0])
    assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 2e-2


def test_a_float32_result_is_staged_out_of_the_accumulators():
    """A result stored in the product's own dtype (float32: here the model's output): on
    ``default`` the chain's last step (the relu) writes each chunk into an epilogue slot in
    a bank group of L0 weight / input of its own and DMA-out stores it from there -- it
    never reads the accumulators, where the vector unit computes the next chunk (ResNet-18's
    stem, whose float32 result the max pool reads: 9,304 conflict cycles). With the buffers
    in the accumulators (``"acc"``) the stores read the tile itself. The same bits, close
    to torch; on ``edge`` (two ports a group of acc) nothing is staged."""
    w, bias = _const(64, 16, 3, 3, scale=0.3), _const(64, 1, 1)

    def body(bb, x):
        c = bb.emit(op.nn.conv2d(x, w, padding=(1, 1)), "c")
        return bb.emit_output(op.nn.relu(bb.emit(op.add(c, bias), "a")), "y")

    mod = _module(body, [(1, 16, 32, 32)])
    x = RNG.standard_normal((1, 16, 32, 32)).astype("float32")
    label = "nn.conv2d+add+relu"
    names = {v: k for k, v in MEM_ID.items()}

    def stores_and_last_step(exe):
        out = []
        for stream in _kernel_streams(exe, label):
            stores = {names[i.args["src"].mem] for i in stream if i.op == "dma.store"}
            relus = {names[i.args["dst"].mem] for i in stream if i.op == "vrelu"}
            out.append((stores, relus))
        return out

    staged = _home_build(mod, "default", "weight")
    in_acc = _home_build(mod, "default", "acc")
    assert any(label in k.label for k in staged.kernels)
    for stores, relus in stores_and_last_step(staged):
        assert stores and stores <= {"weight", "input"} and relus == stores
    for stores, relus in stores_and_last_step(in_acc):
        assert stores == relus == {"acc"}
    for stores, _ in stores_and_last_step(_home_build(mod, "edge", "weight")):
        assert stores == {"acc"}
    out = _outputs(staged, [x])[0]
    assert out.tobytes() == _outputs(in_acc, [x])[0].tobytes()
    ref = torch.relu(torch.nn.functional.conv2d(
        torch.tensor(x), torch.tensor(w.data), torch.tensor(bias.data.reshape(-1)),
        padding=1)).numpy()
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)


def test_staged_slots_take_free_groups_of_input_and_of_the_accumulators():
    """BERT's FFN product on ``default`` (its epilogue adds the bias and stores float32): the
    weight slots fill L0 weight, the one input slot leaves one group of L0 input, the three
    output slots of 32 KiB one group of the accumulators -- the staged result's two slots go
    to those two groups, the bias (3072 channels, hoisted) above the slot in acc; a slot's
    size no longer depends on the room above the home's operand slots (which refused it).
    Without the output slots' size (``acc_tile`` 0) everything stays in the accumulators."""
    cfg = load_config("default")
    ep = Epilogue(out=DramTensor(0, (1, 128, 3072), "float32"),
                  steps=[VecStep("vadd", (("out",), ("in", 0)))],
                  inputs=[DramTensor(1 << 20, (3072,), "float32")],
                  results=[DramTensor(2 << 20, (1, 128, 3072), "float32")], names="add",
                  home="weight")
    ops = {"input": (1, 196608), "weight": (2, 98304)}
    lay = ep._layout_in(cfg, 3 * 32768, 2, ops, 8192, acc_tile=32768)
    group = cfg.memory("acc").group_bytes
    assert sorted(lay.slot_at) == [("acc", 3 * group), ("input", 3 * group)]
    assert lay.keep_at is not None and lay.slot_bytes >= 4096 * 4
    assert lay.hoist_at == ("acc", 3 * group + lay.slot_bytes) and lay.hoist[0] is not None
    assert all(m == "acc" for m, _ in ep._layout_in(cfg, 3 * 32768, 2, ops, 8192).slot_at)


def test_epilogue_buffers_stay_in_the_accumulators_without_a_better_home(tmp_path):
    """``edge``'s accumulators have two ports a group, its L0 input and weight one: the
    buffers stay in the accumulators (two units share a group there without a stretch); so
    they do on a description whose L0 input and weight have no bank groups (no group of
    their own to give them). The same bits either way."""
    mod, inputs, _ = _residual_bias_then_pointwise()
    label = "nn.conv2d+add+add+relu"
    edge = _home_build(mod, "edge", "weight", bank_plan=False)
    for ep, _ in _epilogue_blocks(edge, label):
        assert ep and all(mem == "acc" for mem, _, _ in ep)
    path, cfg = edited_description(tmp_path, "default-ungrouped-l0", (
        r'(^\[l0\.(input|weight)\][^\[]*?)bank_groups = 4\n', r'\1'))
    assert cfg.memory("input").bank_groups == cfg.memory("weight").bank_groups == 1
    flat = _home_build(mod, path, "weight", bank_plan=False)
    for ep, _ in _epilogue_blocks(flat, label):
        assert ep and all(mem == "acc" for mem, _, _ in ep)
    assert np.array_equal(_outputs(edge, inputs)[0],
                          _outputs(_home_build(mod, "edge", "acc"), inputs)[0])


def test_epilogue_home_auto_replays_each_home_and_bad_values_are_refused():
    """``"auto"``: the product's kernel is emitted with its epilogue's buffers in each home
    and replayed after its bank placement; the kernel's tiling text names the home kept and
    every home's cycles, and the kept one is the fewest. An unknown home is a KilnError
    naming the option."""
    mod, inputs, _ = _residual_bias_then_pointwise()
    auto = _home_build(mod, "default", "auto")
    info = next(k for k in auto.kernels if "nn.conv2d+add+add+relu" in k.label)
    m = re.search(r"epilogue buffers in (\w+); replayed cycles (.*)\]", info.tiling)
    assert m, info.tiling
    cycles = dict((h, float(c)) for h, c in re.findall(r"(\w+): (\d+) \(", m.group(2)))
    assert "acc" in cycles and len(cycles) >= 2
    assert cycles[m.group(1)] == min(cycles.values())
    assert np.array_equal(_outputs(auto, inputs)[0],
                          _outputs(_home_build(mod, "default", "acc"), inputs)[0])
    with pytest.raises(kiln.KilnError, match="npu.epilogue_home"):
        _home_build(mod, "default", "l1")
