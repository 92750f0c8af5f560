"""NPU: simulated cycles per layer and per model, against the roofline of the hardware
description, with and without double buffering.

    python benchmarks/npu.py                          # resnet18, mlp, small_cnn on "default"
    python benchmarks/npu.py --hw edge resnet18       # another description, some models
    python benchmarks/npu.py --size 112 resnet18      # a smaller image (faster to simulate)
    python benchmarks/npu.py mobilenet_v2             # depthwise convolutions on the vector unit
    python benchmarks/npu.py --seq 128 bert_encoder   # BERT-base layers (2 of them), one sequence
    python benchmarks/npu.py --emit bert_encoder      # also every product emitted directly
    python benchmarks/npu.py --batch 4 --sub-batch resnet18   # sub-batches at the front only

Every model is compiled twice with ``kiln.build(target="npu -hw=...")``'s lowering -- double
buffering on (the default) and off -- and run once on the simulator. Per GEMM/conv layer it
prints the simulated cycles, the roofline bound (max of the tensor unit's cycles and the DRAM
cycles of the layer's minimum traffic, both from the description: ``gemm_roofline``),
utilization = bound / cycles (the DRAM side without the loads the prefetch ran in the layer
before, below), which side binds (``bound by``: ``DRAM`` -- a DMA-bound layer --
or the compute unit), and the cycles without double buffering with the speed-up (off / on)
and what overlapping the roofline's two sides would give (``sides x``: (compute + DRAM
cycles) / the larger -- for a plain GEMM the most double buffering can give: one far from
balanced cannot gain 1.5x; a convolution's DMA queue also carries its on-chip gathers), and
``real x``: the same with the DRAM cycles the kernel really moved (the simulator's bytes on
the bus in its phase: every reload of a tile, whole bursts) -- the honest ceiling for the
tiling chosen. On a description of several cores, "off" still overlaps one core's loads
with another's products on the shared channel (off / on stays below (C + T / cores) /
max(C, T) <= 1.5 on two cores), so the model is also built for a one-core copy of the
description with that core's share of the DRAM bandwidth (``one_core_share``; the same
balance of compute and traffic per core, nothing else to overlap): ``1c dbuf x`` and
``1c real x`` (``--no-one-core`` skips it). Summarized over the DMA-bound layers (the
issue's target: >= 1.5x there), and over those whose ceiling is >= 1.6.
A second table lists the other layers (element-wise chains, row kernels, pooling, the copies
of transpose/slices/concat, the scalar unit's loops): cycles, bound -- the larger of the
vector unit's work (its instructions at the description's throughput,
``KernelBuilder.with_vector_side``) and the traffic --, utilization and the side that binds
(``vector``, ``DMA`` or ``scalar``).
Per model: total cycles (all kernels, vector ones included), the sum of the bounds,
bank-group conflict cycles before and after the placement of on-chip buffers (a build with
``bank_plan=False`` against the default; the model's cycles both ways, bit-identical outputs),
where its work ran (``unit_shares``: MACs on the tensor unit against the vector unit's
depthwise ones and the CPU's, other element operations on the vector unit against the scalar
unit and the CPU, the scalar fallbacks with their reasons) against issue 23's goal, the
element-wise kernels' cycles (``KILN_NPU_ISEL=0``: the fixed plan instead of the search),
DRAM traffic, the simulation's wall time, the ops left on the CPU, and the DRAM footprint
with liveness-based reuse against a range per tensor, the cycles with every tensor in DRAM
against on-chip residency, and without and with the prefetch across kernel boundaries
(``"npu.prefetch"``; a moved load's cycles count in the kernel it joins, so the per-layer
cycles shift by what it moves; a layer's bound leaves out of its DRAM side the channel time
of its loads that ran in the layer before, ``PrefetchPlan.prefetched``: the work its phase
holds -- else a layer whose weights were partly loaded before it starts would show more
than 100% of a bound its cycles do not contain; the layer before keeps its own bound, a
lower one than the work its phase holds. The model's bound counts every layer's whole).
Outputs are checked against the float32 reference (torch for ResNet-18, MobileNetV2 and the
encoder, numpy for the others). The encoder has BERT-base's layer shapes (hidden 768, 12
heads, FFN 3072; ``--layers`` of them, default 2: every layer is the same kernels) with its
embedding gather and the mask's int64 -> float cast as scalar-unit loops (the NPU has no
indirect DMA and no int64 vector type).

The builds lower every kernel through TIR, the default route (scheduled into NPU scopes,
tensorized, generated): the products (dense, matmul), the convolutions (pointwise as ``W @ X``,
the others as an implicit GEMM staged in L1, depthwise ones on the vector unit) and the vector
kernels (element-wise with fused chains and casts, pooling, softmax, layer_norm, means).
``--emit`` compiles the model once more with every op emitted directly (PassContext
``"npu.lowering": "emit"``) and prints the GEMM/conv layers' cycles on that route and the ratio
to the TIR route's (and its range over the layers, products and convolutions apart), the same
per kind of vector kernel (``worst``: the largest deviation of one kernel), the whole model's,
and whether the outputs are bit-identical.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln.build import npu_pipeline
from kiln.codegen.npu import DEPTHWISE_KEY, LOWERING_KEY, build_npu
from kiln.codegen.npu.prefetch import PREFETCH_KEY
from kiln.schedule.npu.nest_analysis import unit_shares
from kiln.schedule.npu.ops import depthwise_group
from kiln.schedule.npu.region import FUSE_EPILOGUE_KEY
from kiln.schedule.npu.sub_batch import SUB_BATCH_KEY
from kiln.target.npu import load_config
from kiln.testing import models

GEMM_OPS = ("dense", "matmul", "nn.conv2d", "nn.conv2d.depthwise")


def _import_bound(data: bytes):
    """An exported ONNX model imported by kiln with its weights bound as constants."""
    from kiln.frontend.onnx import from_onnx

    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        f.write(data)
        f.flush()
        mod, params = from_onnx(f.name)
    return kiln.transform.BindParams("main", params)(mod)


def _torch_net(name: str, size: int, batch: int = 1):
    import torch

    from kiln.testing import torch_models

    torch.manual_seed(0)  # the same weights every run: outputs comparable bit for bit
    net = getattr(torch_models, name)()
    x = np.random.default_rng(0).standard_normal((batch, 3, size, size)).astype("float32")
    mod = _import_bound(torch_models.export_onnx(net, (torch.from_numpy(x),), ["x"]))
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    return mod, [x], ref


def _bert(seq: int, layers: int):
    import torch

    from kiln.testing import torch_models

    torch.manual_seed(0)
    net = torch_models.bert_encoder(layers=layers, max_len=max(seq, 512)).eval()
    ids, mask = torch_models.example_inputs("bert_encoder", seq=seq)
    mod = _import_bound(torch_models.export_onnx(
        net, (torch.from_numpy(ids), torch.from_numpy(mask)), ["input_ids", "attention_mask"]))
    with torch.no_grad():
        ref = net(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    return mod, [ids, mask], ref


def _model(name: str, size: int, seq: int = 128, layers: int = 2, batch: int = 1):
    if name in ("resnet18", "mobilenet_v2"):
        return _torch_net(name, size, batch)
    if name == "bert_encoder":
        return _bert(seq, layers)
    m = {"mlp": lambda: models.mlp(batch=64),
         "small_cnn": lambda: models.small_cnn(batch=8, channels=32, size=32)}[name]()
    return m.mod, m.inputs, m.reference(*m.inputs)


def _run(mod, inputs, hw: str, double_buffer: bool, route: str | None = None,
         bank_plan: bool = True, residency: bool = True, fuse_epilogue: bool = True,
         depthwise: str = "auto", prefetch: bool = True, sub_batch: bool = True):
    config = {LOWERING_KEY: route} if route else {}
    config[SUB_BATCH_KEY] = sub_batch
    config[FUSE_EPILOGUE_KEY] = fuse_epilogue
    config[DEPTHWISE_KEY] = depthwise
    config[PREFETCH_KEY] = prefetch
    with kiln.transform.PassContext(config=config):
        exe = build_npu(npu_pipeline()(mod), kiln.Target("npu", hw=hw),
                        double_buffer=double_buffer, bank_plan=bank_plan, residency=residency)
    t = time.perf_counter()
    out = exe(*inputs)
    return exe, out, time.perf_counter() - t


def _phases(reports) -> dict[str, float]:
    """Cycles per kernel label over every NPU region of a run (labels are unique per build)."""
    out: dict[str, float] = {}
    for r in reports:
        out.update({k: v for k, v in r.phase_cycles().items() if k != "tail"})
    return out


def _moved(reports, bandwidth: float) -> dict[str, float]:
    """Cycles of the DRAM channel per kernel label: the bytes it really moved (whole
    bursts, every reload of a tile) over the chip's bandwidth."""
    out: dict[str, float] = {}
    for r in reports:
        out.update({k: v / bandwidth for k, v in r.phase_bytes.items() if k != "tail"})
    return out


def one_core_share(hw: str) -> str:
    """The path of a description like ``hw`` with one core and that core's share of the
    DRAM channel (``bandwidth / cores``), written next to the kernel cache: each core's
    pipeline with the balance of compute and traffic it has on ``hw``, with no other core
    to load while it computes -- where switching double buffering off measures what the
    pipeline overlaps and nothing else (on ``hw`` itself, "off" still overlaps one core's
    loads with the other's products on the shared channel)."""
    cfg = load_config(hw)
    with open(cfg.path) as f:
        text = f.read()
    bandwidth = cfg.memory("dram").bandwidth // cfg.cores
    text, n_cores = re.subn(r"(?m)^cores\s*=.*$", "cores = 1", text)
    text, n_name = re.subn(r'(?m)^name\s*=.*$', f'name = "{cfg.name}-1core"', text)
    dram = re.search(r"(?ms)^\[dram\].*?(?=^\[)", text)
    assert n_cores == n_name == 1 and dram, f"{cfg.path}: cores, name or [dram] not found"
    body = re.sub(r"(?m)^bandwidth\s*=\s*\d+", f"bandwidth = {bandwidth}", dram.group(0))
    text = text[:dram.start()] + body + text[dram.end():]
    path = os.path.join(tempfile.gettempdir(), f"kiln-npu-{cfg.name}-1core-{os.getpid()}.toml")
    with open(path, "w") as f:
        f.write(text)
    one = load_config(path)
    assert one.cores == 1 and one.memory("dram").bandwidth == bandwidth
    return path


def _relabel(on, other, table: dict) -> dict:
    """``table`` (kernel label -> value) of build ``other`` keyed by build ``on``'s labels
    too: its product kernels in order (whether a product's epilogue is fused may differ
    between the builds -- without double buffering less room is left in the accumulators --
    and a fused kernel's label names its chain), the others by their label."""
    mine = [k.label for k in on.kernels if k.op in GEMM_OPS]
    theirs = [k.label for k in other.kernels if k.op in GEMM_OPS]
    out = dict(table)
    if len(mine) == len(theirs):
        out.update({a: table[b] for a, b in zip(mine, theirs) if b in table})
    return out


def _epilogue_line(name: str, mod, inputs, hw: str, on, out) -> None:
    """Epilogue fusion off against on: cycles, DRAM bytes read and written, kernels, and
    whether the outputs are bit-identical."""
    off, off_out, _ = _run(mod, inputs, hw, True, fuse_epilogue=False)
    cyc = [sum(r.cycles for r in e.last_reports) for e in (off, on)]
    rd = [sum(r.dram_read for r in e.last_reports) for e in (off, on)]
    wr = [sum(r.dram_written for r in e.last_reports) for e in (off, on)]
    print(f"{name}: epilogue fusion off -> on: {cyc[0]:.0f} -> {cyc[1]:.0f} cycles "
          f"({cyc[0] / cyc[1]:.2f}x), DRAM read {rd[0] / 1e6:.1f} -> {rd[1] / 1e6:.1f} MB, "
          f"written {wr[0] / 1e6:.1f} -> {wr[1] / 1e6:.1f} MB, kernels {len(off.kernels)} -> "
          f"{len(on.kernels)}, outputs "
          f"{'bit-identical' if np.array_equal(off_out, out) else 'DIFFERENT'}")


def sub_batch_bench(name: str, hw: str, size: int, batch: int) -> None:
    """Sub-batches at the front of the network (PassContext ``"npu.sub_batch"``) off against
    on, both with residency and everything else on: the plan, the DRAM bytes read and
    written, the bytes kept in L1, the cycles, and whether the outputs are the same bits."""
    mod, inputs, ref = _model(name, size, batch=batch)
    on, out, _ = _run(mod, inputs, hw, True, sub_batch=True)
    if all(p is None for p in on.sub_batches):  # the same build either way
        cycles = sum(r.cycles for r in on.last_reports)
        moved = sum(r.dram_read + r.dram_written for r in on.last_reports)
        print(f"{name} (batch {batch}, {size}) on {hw!r}: sub-batches: none (not sliced: the "
              f"cost model finds no gain); DRAM read + written {moved / 1e6:.1f} MB, "
              f"{cycles:.0f} cycles")
        return
    off, off_out, _ = _run(mod, inputs, hw, True, sub_batch=False)
    moved = [sum(r.dram_read + r.dram_written for r in e.last_reports) for e in (off, on)]
    cycles = [sum(r.cycles for r in e.last_reports) for e in (off, on)]
    l1 = [sum(e.residency.nbytes.values()) for e in (off, on)]
    plans = [p.describe() for p in on.sub_batches if p is not None] or ["none (not sliced)"]
    rel = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    print(f"{name} (batch {batch}, {size}) on {hw!r}: sub-batches: {'; '.join(plans)}")
    print(f"{name}: sub-batches off -> on: DRAM read + written {moved[0] / 1e6:.1f} -> "
          f"{moved[1] / 1e6:.1f} MB; kept in L1 {l1[0] / 1e6:.2f} -> {l1[1] / 1e6:.2f} MB "
          f"({off.residency.tensors} -> {on.residency.tensors} tensors); kernels "
          f"{len(off.kernels)} -> {len(on.kernels)}; {cycles[0]:.0f} -> {cycles[1]:.0f} "
          f"cycles ({cycles[0] / cycles[1]:.3f}x); bit-identical: "
          f"{np.asarray(off_out).tobytes() == np.asarray(out).tobytes()}; rel. error vs "
          f"float32 {rel:.1e}")


def bench(name: str, hw: str, size: int, seq: int = 128, layers: int = 2,
          emit: bool = False, one_core: bool = True, epilogue: bool = False,
          depthwise: bool = False, batch: int = 1) -> None:
    mod, inputs, ref = _model(name, size, seq, layers, batch)
    on, out, wall = _run(mod, inputs, hw, True)
    off, _, _ = _run(mod, inputs, hw, False)
    via, via_out, _ = _run(mod, inputs, hw, True, "emit") if emit else (None, None, 0)
    share = one_core_share(hw) if one_core and load_config(hw).cores > 1 else None
    solo = [_run(mod, inputs, share, db)[0] for db in (True, False)] if share else []
    if share:
        os.unlink(share)
    c_emit = _relabel(on, via, _phases(via.last_reports)) if via else {}
    rel = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    c_on, c_off = _phases(on.last_reports), _relabel(on, off, _phases(off.last_reports))
    bandwidth = load_config(hw).memory("dram").bandwidth
    moved = _moved(on.last_reports, bandwidth)
    # cycles of the channel a layer's prefetched loads took in the layer before it: not in
    # its phase, so not in the bound its phase's cycles are held against
    fetched = {label: n / bandwidth for p in on.prefetch_plans if not p.reverted
               for label, n in p.prefetched.items()}

    def bound_of(k) -> float:
        if not fetched.get(k.label):
            return k.roofline
        return max(k.compute, k.traffic - fetched[k.label])
    if solo:
        s_on, s_off = (_relabel(on, e, _phases(e.last_reports)) for e in solo)
        s_kernels = _relabel(on, solo[0], {k.label: k for k in solo[0].kernels})
        s_moved = _relabel(on, solo[0], _moved(solo[0].last_reports,
                                               bandwidth / load_config(hw).cores))
    cyc_on, cyc_off_total = (sum(r.cycles for r in e.last_reports) for e in (on, off))
    clock = on.last_reports[0].clock_mhz
    print(f"\n== {name} on {hw!r}: {len(on.kernels)} kernels, CPU ops: "
          f"{', '.join(on.cpu_ops) or 'none'}; rel. error vs float32 {rel:.1e}")
    print(f"{'layer':22s} {'tiling':58s} {'cycles':>10s} {'bound':>10s} {'util':>6s} "
          f"{'bound by':>8s} {'no dbuf':>10s} {'dbuf x':>6s} {'sides x':>7s} {'real x':>6s}" +
          (f" {'1c dbuf x':>9s} {'1c real x':>9s}" if solo else "") +
          (f" {'emit':>10s} {'emit/TIR':>8s}" if via else ""))
    real, solo_x, solo_real = {}, {}, {}
    for k in on.kernels:
        if k.op not in GEMM_OPS:
            continue
        cyc, cyc_off = c_on[k.label], c_off[k.label]
        side = "DRAM" if k.dram_bound else (
            "vector" if k.op.endswith("depthwise") and "tensor unit" not in k.tiling
            else "tensor")
        real[k.label] = k.achievable_gain(moved[k.label])
        line = (f"{k.label:22s} {k.tiling.split(', est.')[0]:58s} {cyc:10.0f} "
                f"{bound_of(k):10.0f} {bound_of(k) / cyc:6.1%} "
                f"{side:>8s} {cyc_off:10.0f} "
                f"{cyc_off / cyc:6.2f} {k.overlap_gain:7.2f} {real[k.label]:6.2f}")
        if solo and k.label in s_kernels:  # the same kernels, labelled alike
            solo_x[k.label] = s_off[k.label] / s_on[k.label]
            solo_real[k.label] = s_kernels[k.label].achievable_gain(s_moved[k.label])
            line += f" {solo_x[k.label]:9.2f} {solo_real[k.label]:9.2f}"
        if via:
            routed = k.tiling.startswith("TIR: ")
            line += f" {c_emit[k.label]:10.0f} {c_emit[k.label] / cyc:8.4f}" if routed else \
                f" {'(emitted)':>10s}"
        print(line)
    _other_table(name, on, c_on, bound_of)
    bound = sum(k.roofline for k in on.kernels)
    gemm = [k for k in on.kernels if k.op in GEMM_OPS]
    dma = [k for k in gemm if k.dram_bound]
    speedups = sorted(c_off[k.label] / c_on[k.label] for k in dma)
    if speedups:
        ideal = [k.overlap_gain for k in dma]
        reach = [k for k in dma if real[k.label] >= 1.6]
        print(f"{name}: double buffering on the {len(speedups)} DMA-bound GEMM/conv layers: "
              f"{min(speedups):.2f}x to {max(speedups):.2f}x (median "
              f"{speedups[len(speedups) // 2]:.2f}x), {sum(s >= 1.5 for s in speedups)} of them "
              f">= 1.5x; overlapping their roofline's sides ((compute + DRAM) / max) would give "
              f"{min(ideal):.2f}x to {max(ideal):.2f}x, {sum(i >= 1.5 for i in ideal)} >= 1.5x; "
              f"with the traffic really moved (real x) {len(reach)} can give >= 1.6x, "
              f"{sum(c_off[k.label] / c_on[k.label] >= 1.5 for k in reach)} of those give "
              f">= 1.5x")
        if solo_x:
            xs = sorted(solo_x[k.label] for k in dma if k.label in solo_x)
            reach = [k for k in dma if solo_real.get(k.label, 0) >= 1.6]
            print(f"{name}: the same layers on one core with its share of the DRAM channel "
                  f"(1c): double buffering gives {xs[0]:.2f}x to {xs[-1]:.2f}x (median "
                  f"{xs[len(xs) // 2]:.2f}x), {sum(x >= 1.5 for x in xs)} >= 1.5x; "
                  f"{len(reach)} can give >= 1.6x (1c real x), "
                  f"{sum(solo_x[k.label] >= 1.5 for k in reach)} of those give >= 1.5x")
    else:
        print(f"{name}: no DMA-bound GEMM/conv layer (every one bound by its compute unit)")
    g_cyc = sum(c_on[k.label] for k in gemm)
    g_bound = sum(k.roofline for k in gemm)
    read = sum(r.dram_read for r in on.last_reports)
    written = sum(r.dram_written for r in on.last_reports)
    print(f"{name}: {cyc_on:.0f} cycles ({cyc_on / clock:.0f} us at {clock} MHz) in "
          f"{len(on.last_reports)} NPU region(s), bound {bound:.0f} -> utilization "
          f"{bound / cyc_on:.1%}; GEMM/conv layers {g_bound / g_cyc:.1%}; without double "
          f"buffering {cyc_off_total:.0f} cycles ({cyc_off_total / cyc_on:.2f}x); DRAM read "
          f"{read / 1e6:.1f} MB, written {written / 1e6:.1f} MB; simulated in {wall:.1f} s")
    print(f"{name}: DRAM footprint {on.dram_bytes / 1e6:.2f} MB with liveness-based reuse, "
          f"{on.unshared_dram_bytes / 1e6:.2f} MB with a range per tensor "
          f"({on.unshared_dram_bytes / on.dram_bytes:.2f}x)")
    _bank_line(name, on, out, _run(mod, inputs, hw, True, bank_plan=False)[:2])
    shares = unit_shares(on)
    print(f"{name}: {shares.summary()}")
    print(f"{name}: goal (>= 99% of MACs on the tensor unit, >= 95% of other element ops on "
          f"the vector unit): MACs {'met' if shares.tensor_mac_share >= 0.99 else 'NOT met'}, "
          f"element ops {'met' if shares.vector_op_share >= 0.95 else 'NOT met'}")
    ew = [k for k in on.kernels if k.tiling.split("TIR: ")[-1].startswith("block (")]
    print(f"{name}: {len(ew)} element-wise kernel(s) in {sum(c_on[k.label] for k in ew):.0f} "
          f"cycles ({sum('[isel' in k.tiling for k in ew)} planned by the instruction search)")
    if depthwise and any(k.op == "nn.conv2d.depthwise" for k in on.kernels):
        _depthwise_table(name, mod, inputs, ref, hw, on, c_on)
        return
    _residency_line(name, mod, inputs, hw, on, out)
    _prefetch_line(name, mod, inputs, hw, on, out)
    if epilogue:
        _epilogue_line(name, mod, inputs, hw, on, out)
    if via:
        _vector_table(name, on, c_on, c_emit)
        n_tir = sum(k.tiling.startswith("TIR: ") for k in on.kernels)
        for what, ops in (("product", ("dense", "matmul")), ("convolution", ("nn.conv2d",))):
            ratios = sorted(c_emit[k.label] / c_on[k.label] for k in on.kernels
                            if k.tiling.startswith("TIR: ") and k.op in ops)
            if ratios:
                print(f"{name}: {len(ratios)} {what} kernel(s) through TIR, emit/TIR cycles "
                      f"per layer {ratios[0]:.4f} to {ratios[-1]:.4f}")
        cyc_emit = sum(r.cycles for r in via.last_reports)
        print(f"{name}: {n_tir} kernel(s) lowered through TIR; with every op emitted "
              f"directly {cyc_emit:.0f} cycles ({cyc_emit / cyc_on:.4f}x the TIR route's), "
              f"outputs {'bit-identical' if np.array_equal(via_out, out) else 'DIFFERENT'}")


def _other_table(name: str, on, c_on: dict[str, float], bound_of) -> None:
    """The kernels that are no product or convolution, per layer: element-wise chains, row
    kernels (softmax, layer_norm), pooling, the copies (transpose, slices, concat: DMAs
    through L0) and the scalar unit's loops, each with its cycles against its bound and the
    side that binds: ``vector`` (the vector unit's instructions at the description's
    throughput, ``KernelBuilder.with_vector_side``), ``DMA`` (the traffic: DRAM, or the DMA
    engines' on-chip bandwidth for what residency keeps in L1) or ``scalar`` (a scalar-unit
    loop's estimate)."""
    print(f"{'other layer':34s} {'kernel':58s} {'cycles':>8s} {'bound':>8s} {'util':>6s} "
          f"{'bound by':>8s}")
    worst, cyc, bnd = 0.0, 0.0, 0.0
    for k in on.kernels:
        if k.op in GEMM_OPS or k.label not in c_on:
            continue
        b = bound_of(k)
        side = "scalar" if k.tiling.startswith("scalar unit") else \
            "vector" if k.compute and k.compute >= k.traffic else "DMA"
        util = b / c_on[k.label] if c_on[k.label] else 0.0
        worst, cyc, bnd = max(worst, util), cyc + c_on[k.label], bnd + b
        print(f"{k.label[:34]:34s} {k.tiling.removeprefix('TIR: ')[:58]:58s} "
              f"{c_on[k.label]:8.0f} {b:8.0f} {util:6.1%} {side:>8s}")
    if cyc:
        print(f"{name}: the other layers: {cyc:.0f} cycles against a bound of {bnd:.0f} "
              f"({bnd / cyc:.1%}); the highest utilization of one: {worst:.1%}")


def _bank_line(name: str, on: object, out: object, naive: tuple[object, object]) -> None:
    """Bank-group conflicts (issue 23): the cycles the simulator lost to them in the run
    without the placement (``build_npu(bank_plan=False)``) and with it, the model's cycles
    both ways, and whether the outputs are the same bits."""
    exe, naive_out = naive
    before = sum(r.total_conflict_cycles for r in exe.last_reports)  # type: ignore[attr-defined]
    after = sum(r.total_conflict_cycles for r in on.last_reports)  # type: ignore[attr-defined]
    plans = on.bank_plans  # type: ignore[attr-defined]
    same = np.asarray(naive_out).tobytes() == np.asarray(out).tobytes()
    print(f"{name}: bank conflicts: {before:.0f} cycles before placement, {after:.0f} after; "
          f"model cycles {exe.last_cycles:.0f} -> {on.last_cycles:.0f}"  # type: ignore
          f" ({sum(len(p.moves) for p in plans)} buffer(s) moved, "
          f"{sum(len(p.left) for p in plans)} pair(s) left; outputs "
          f"{'bit-identical' if same else 'DIFFERENT'})")


def _residency_line(name: str, mod, inputs, hw: str, on, out) -> None:
    """The same model with every tensor through DRAM (``residency=False``): the DRAM bytes
    and cycles that keeping intermediates in L1 saves, and whether the bits are the same."""
    dram, dram_out, _ = _run(mod, inputs, hw, True, residency=False)
    moved = [sum(r.dram_read + r.dram_written for r in e.last_reports) for e in (dram, on)]
    cycles = [sum(r.cycles for r in e.last_reports) for e in (dram, on)]
    res = on.residency
    print(f"{name}: on-chip residency: {res.tensors} intermediate(s) kept in L1 "
          f"({sum(res.nbytes.values()) / 1e6:.2f} MB); DRAM read + written "
          f"{moved[0] / 1e6:.1f} -> {moved[1] / 1e6:.1f} MB; {cycles[0]:.0f} -> "
          f"{cycles[1]:.0f} cycles ({cycles[0] / cycles[1]:.2f}x); bit-identical: "
          f"{np.array_equal(dram_out, out)}")


def _depthwise_layers(exe, g: int) -> list[list]:
    """The depthwise layers' kernels in order: a tensor-route layer whose channels are no
    multiple of ``g`` has a second kernel (its last channels' group), which joins it."""
    layers: list[list] = []
    for k in exe.kernels:
        if k.op != "nn.conv2d.depthwise":
            continue
        m = re.search(r"groups of (\d+) channels", k.tiling)
        if layers and m and int(m.group(1)) < g and len(layers[-1]) == 1:
            layers[-1].append(k)
        else:
            layers.append([k])
    return layers


def _depthwise_table(name: str, mod, inputs, ref, hw: str, on, c_on) -> None:
    """Depthwise convolutions on the vector unit against the tensor unit's two forms
    (block-diagonal grouped products, banded products over the rows): per layer the
    simulated cycles of its kernels with every depthwise convolution forced onto each route
    (PassContext ``npu.depthwise``), the cost model's estimates of each and its choice in
    the default build (``auto``, whose cycles close the line); then per build the model's
    cycles, the MAC share of the tensor unit (useful MACs: a tensor-unit form counts its
    depthwise MACs, not its zeros) and the error."""
    g = depthwise_group(load_config(hw))
    runs = {"auto": (on, c_on)}
    routes = ("vector", "diagonal", "banded")
    for route in routes:
        exe = _run(mod, inputs, hw, True, depthwise=route)[0]
        runs[route] = (exe, _phases(exe.last_reports))
    layers = {r: _depthwise_layers(e, g) for r, (e, _) in runs.items()}
    print(f"{'depthwise layer':16s} {'kernel (vector route)':44s} {'vector':>8s} "
          f"{'diagonal':>8s} {'banded':>8s} {'est vec':>8s} {'est diag':>8s} "
          f"{'est band':>8s} {'auto':>8s} {'auto cyc':>8s}")
    for i, ks in enumerate(zip(*(layers[r] for r in (*routes, "auto")))):
        cyc = {r: sum(runs[r][1][k.label] for k in kk) for r, kk in zip((*routes, "auto"), ks)}
        tiling = ks[-1][0].tiling
        est = {r: re.search(rf"{r} (\d+)", tiling.split("est. cycles")[-1]) for r in routes}
        choice = re.search(r"on the tensor unit \((\w+)\)|on the (vector) unit", tiling)
        print(f"{i:<16d} {ks[0][0].tiling.removeprefix('TIR: ').split(' [')[0][:44]:44s} " +
              " ".join(f"{cyc[r]:8.0f}" for r in routes) + " " +
              " ".join(f"{est[r].group(1) if est[r] else '-':>8s}" for r in routes) +
              f" {(choice.group(1) or choice.group(2)) if choice else '?':>8s}"
              f" {cyc['auto']:8.0f}")
    for r, (exe, _) in runs.items():
        out = exe(*inputs)
        sh = unit_shares(exe)
        print(f"{name}: depthwise {r:8s}: {sum(x.cycles for x in exe.last_reports):.0f} "
              f"cycles, {len(exe.kernels)} kernels, MACs on the tensor unit "
              f"{100 * sh.tensor_mac_share:.2f}% (vector {sh.vector_macs:,}), rel. error vs "
              f"float32 {float(np.max(np.abs(out - ref)) / np.max(np.abs(ref))):.1e}")


def _prefetch_line(name: str, mod, inputs, hw: str, on, out) -> None:
    """The same model without the prefetch across kernel boundaries (PassContext
    ``"npu.prefetch": False``): the cycles that running each kernel's first loads during
    the kernel before saves, how many loads moved, whether the bits are the same. A moved
    load's cycles and DRAM bytes count in the kernel it joins (phases are between
    barriers): the per-layer columns above move by what it shifts."""
    off, off_out, _ = _run(mod, inputs, hw, True, prefetch=False)
    cycles = [sum(r.cycles for r in e.last_reports) for e in (off, on)]
    plans = [p for p in on.prefetch_plans if not p.reverted]
    print(f"{name}: prefetch across kernel boundaries: {sum(p.moved for p in plans)} load(s) "
          f"({sum(p.moved_bytes for p in plans) / 1e6:.2f} MB) moved above the barrier before "
          f"their kernel, {sum(len(p.relocated) for p in plans)} buffer(s) moved to make room "
          f"({len(on.prefetch_plans) - len(plans)} program(s) kept without: not faster); "
          f"{cycles[0]:.0f} -> {cycles[1]:.0f} cycles ({cycles[0] / cycles[1]:.3f}x); "
          f"bit-identical: {np.array_equal(off_out, out)}")


def _vector_table(name: str, on: object, c_on: dict[str, float],
                  c_emit: dict[str, float]) -> None:
    """Per kind of vector kernel (every kernel but the products, by op): how many, how many
    went through TIR, their cycles on both routes and the worst kernel's ratio."""
    kinds: dict[str, list[object]] = {}
    for k in on.kernels:  # type: ignore[attr-defined]
        if k.op not in ("dense", "matmul", "nn.conv2d"):
            kinds.setdefault("chain" if "+" in k.op else k.op, []).append(k)
    print(f"{'vector kernels':22s} {'count':>5s} {'TIR':>4s} {'cycles':>10s} {'emit':>10s} "
          f"{'emit/TIR':>8s} {'worst':>7s}")
    for kind, ks in sorted(kinds.items()):
        cyc = sum(c_on[k.label] for k in ks)
        emit = sum(c_emit[k.label] for k in ks)
        worst = max((abs(c_emit[k.label] / c_on[k.label] - 1) for k in ks), default=0.0)
        n_tir = sum(k.tiling.startswith("TIR: ") for k in ks)
        print(f"{kind:22s} {len(ks):5d} {n_tir:4d} {cyc:10.0f} {emit:10.0f} "
              f"{emit / cyc:8.4f} {worst:7.2%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["resnet18", "mlp", "small_cnn"])
    ap.add_argument("--hw", default="default", help="hardware description (name or path)")
    ap.add_argument("--size", type=int, default=224, help="ResNet-18 / MobileNetV2 image size")
    ap.add_argument("--seq", type=int, default=128, help="the encoder's sequence length")
    ap.add_argument("--layers", type=int, default=2, help="the encoder's layers")
    ap.add_argument("--emit", action="store_true",
                    help="also emit every op directly (not through TIR) and compare: the "
                    "products and convolutions per layer, the vector kernels per kind, the "
                    "whole model")
    ap.add_argument("--no-one-core", action="store_true",
                    help="skip the one-core variant of a multi-core description (1c columns)")
    ap.add_argument("--epilogue", action="store_true",
                    help="also build without epilogue fusion (PassContext "
                    "'npu.fuse_epilogue': False) and print cycles and DRAM traffic off -> on")
    ap.add_argument("--depthwise", action="store_true",
                    help="also build with every depthwise convolution forced onto the vector "
                    "unit and onto the tensor unit (PassContext 'npu.depthwise') and print "
                    "per layer both routes' cycles, the estimates and the choice (the "
                    "residency and epilogue lines are skipped)")
    ap.add_argument("--batch", type=int, default=1,
                    help="ResNet-18 / MobileNetV2 batch (the others have their own)")
    ap.add_argument("--sub-batch", action="store_true",
                    help="only build with and without sub-batches at the front of the network "
                    "(PassContext 'npu.sub_batch') and print DRAM bytes, cycles and the plan")
    args = ap.parse_args(argv)
    for name in args.models:
        if args.sub_batch:
            sub_batch_bench(name, args.hw, args.size, args.batch)
            continue
        bench(name, args.hw, args.size, args.seq, args.layers, args.emit, not args.no_one_core,
              args.epilogue, args.depthwise, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
