"""NPU tiling tuning: simulated cycles per layer and per model, default tilings against tuned.

    python benchmarks/npu_tuning.py                         # resnet18 on "default"
    python benchmarks/npu_tuning.py --hw edge resnet18      # another description
    python benchmarks/npu_tuning.py --seq 128 bert_encoder  # BERT-base layers (2), one sequence
    python benchmarks/npu_tuning.py --db t.sqlite resnet18  # keep (and resume) the database

For each model, :func:`kiln.tune.npu_tuning.tune_npu` measures every tiling candidate of every
product on the simulator, in the model (fused epilogues, residency: one whole-model build per
round of candidates) and checks the tuned model, then the whole model is built twice --
``kiln.build(mod, target)`` and ``kiln.build(mod, target, tuning_db=db)`` -- and run once each.
Printed: per product kernel (a depthwise convolution's tensor-route kernels included), the
default's and the tuned build's cycles in the whole model (with the tiling each chose), the
model's total cycles both ways, the tuned keys' products as the tuner measured them, whether
the outputs agree (with the float32 reference), the cost model's rank correlation with the
simulated cycles over the measured candidates (Spearman: per layer, averaged; pooled), the
tuning time, its builds and the records its check withdrew.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln.tune import TuningDatabase
from kiln.tune.npu_tuning import kernel_cycles, tune_npu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from npu import GEMM_OPS, _model  # noqa: E402 - the models of benchmarks/npu.py


def bench(name: str, hw: str, size: int, seq: int, layers: int, db_path: str) -> None:
    mod, inputs, ref = _model(name, size, seq, layers)
    target = kiln.Target("npu", hw=hw)
    db = TuningDatabase(db_path)
    t = time.perf_counter()
    res = tune_npu(mod, db, target)
    tune_s = time.perf_counter() - t
    base = kiln.build(mod, target)
    tuned = kiln.build(mod, target, tuning_db=db)
    out_b, out_t = base(*inputs), tuned(*inputs)
    c_b, c_t = kernel_cycles(base), kernel_cycles(tuned)
    print(f"\n== {name} on {hw!r}: {len(res.tasks)} tiling keys, {res.trials} candidates "
          f"measured ({res.bad} bad) in {tune_s:.1f} s ({res.builds} model builds, "
          f"{len(res.withdrawn)} records withdrawn by the check)")
    print(f"{'layer':18s} {'default tiling':40s} {'default':>9s} {'tuned tiling':40s} "
          f"{'tuned':>9s} {'speed-up':>8s}")
    tuned_kernels = {k.label: k for k in tuned.kernels}
    for k in base.kernels:
        kt = tuned_kernels.get(k.label)
        if k.op not in GEMM_OPS or kt is None or (k.op == "nn.conv2d.depthwise" and
                                                  not k.knob):  # the vector route: no tiling
            continue
        d, u = c_b[k.label], c_t[k.label]
        print(f"{k.label:18s} {k.tiling.split(' of ')[0][:40]:40s} {d:9.0f} "
              f"{kt.tiling.split(' of ')[0][:40]:40s} {u:9.0f} {d / u:8.3f}")
    cyc_b, cyc_t = base.last_cycles, tuned.last_cycles
    gemm_b = sum(c_b[k.label] for k in base.kernels if k.op in GEMM_OPS)
    gemm_t = sum(c_t[k.label] for k in tuned.kernels if k.op in GEMM_OPS)
    rel = float(np.max(np.abs(out_t - ref)) / np.max(np.abs(ref)))
    diff = float(np.max(np.abs(out_t - out_b)) / np.max(np.abs(out_b)))
    print(f"{name}: model {cyc_b:.0f} -> {cyc_t:.0f} cycles ({cyc_b / cyc_t:.3f}x); products "
          f"{gemm_b:.0f} -> {gemm_t:.0f} ({gemm_b / gemm_t:.3f}x); tuned vs float32 rel. error "
          f"{rel:.1e}, vs default {diff:.1e}")
    before, after = res.model_cycles()
    print(f"{name}: the tuned keys' products in the model (the tuner's figures): "
          f"{before:.0f} -> {after:.0f} cycles; its check of the tuned model: "
          f"{res.model_default:.0f} -> {res.model_tuned:.0f}")
    mean, pooled = res.rank_correlation()
    print(f"{name}: cost model vs simulator, Spearman over the measured candidates: per layer "
          f"(mean of {sum(len(v) > 1 for v in res.measured.values())}) {mean:.3f}, pooled "
          f"{pooled:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["resnet18"])
    ap.add_argument("--hw", default="default", help="hardware description (name or path)")
    ap.add_argument("--size", type=int, default=224, help="ResNet-18 / MobileNetV2 image size")
    ap.add_argument("--seq", type=int, default=128, help="the encoder's sequence length")
    ap.add_argument("--layers", type=int, default=2, help="the encoder's layers")
    ap.add_argument("--db", help="tuning database (default: a temporary one per model)")
    args = ap.parse_args(argv)
    for name in args.models:
        if args.db:
            bench(name, args.hw, args.size, args.seq, args.layers, args.db)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            bench(name, args.hw, args.size, args.seq, args.layers,
                  os.path.join(tmp, "tuning.sqlite"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
