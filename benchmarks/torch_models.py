"""PyTorch models: kiln next to torch eager and torch.compile (inductor), in one run.

    python benchmarks/torch_models.py                 # every model
    python benchmarks/torch_models.py resnet18 bert   # some of them
    python benchmarks/torch_models.py --size test     # the tests' small sizes

The models (``kiln.testing.torch_programs``, ``--size full`` by default: ResNet-18 and
MobileNetV2 at 224x224, BERT with MiniLM-L6's sizes and GPT-2 small at sequence 128, ViT-B/16,
a 2-layer LSTM of width 512 over 64 steps; batch 1, random weights) run through
``torch.export`` + ``from_exported_program`` + ``kiln.build`` (kiln), plain PyTorch (eager)
and ``torch.compile`` with its default inductor backend, all with the same thread count
(``KILN_BENCH_THREADS``, default 2), under ``torch.no_grad``. kiln is called with torch
tensors (zero-copy DLPack views). The engines are timed in alternating rounds
(``kiln.testing.timing.compare``): the table gives each median latency and the ratios
kiln/eager and kiln/inductor (lower is better for kiln), median of the per-round ratios with
their range in brackets. Outputs are checked against eager before timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, ".")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend.torch import from_exported_program  # noqa: E402
from kiln.frontend.torch.tensors import to_kiln  # noqa: E402
from kiln.testing import torch_programs  # noqa: E402
from kiln.testing.timing import compare  # noqa: E402

THREADS = int(os.environ.get("KILN_BENCH_THREADS", "2"))


def bench(name: str, size: str, rounds: int) -> dict:
    model, inputs, _ = torch_programs.MODELS[name](size)
    t0 = time.perf_counter()
    # static shapes, as inductor compiles its first call (and a batch of 1 cannot be
    # exported with a dynamic batch: torch specializes sizes 0 and 1)
    ep = torch.export.export(model, inputs, strict=False)
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, params=params)
    exe.set_num_threads(THREADS)
    t1 = time.perf_counter()
    compiled = torch.compile(model)  # inductor
    with torch.no_grad():
        ref = model(*inputs)
        compiled(*inputs)
        t2 = time.perf_counter()
        views = [to_kiln(t) for t in inputs]
        out = exe(*views)
        err = float(np.abs(out - ref.numpy()).max() / np.abs(ref.numpy()).max())
        cmp = compare({"kiln": lambda: exe(*views), "eager": lambda: model(*inputs),
                       "inductor": lambda: compiled(*inputs)}, rounds=rounds)
    return {"name": name, "cmp": cmp, "err": err, "kiln_build": t1 - t0,
            "inductor_build": t2 - t1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(torch_programs.MODELS))
    ap.add_argument("--size", choices=("full", "test"), default="full")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(THREADS)
    print(f"threads {THREADS}, size {args.size}, torch {torch.__version__}")
    print(f"{'model':14s} {'kiln ms':>9s} {'eager ms':>9s} {'inductor ms':>11s} "
          f"{'kiln/eager':>18s} {'kiln/inductor':>18s} {'rel.err':>8s} {'build s':>13s}")
    for name in args.models:
        r = bench(name, args.size, args.rounds)
        c = r["cmp"]
        print(f"{name:14s} {c.median('kiln') * 1e3:9.2f} {c.median('eager') * 1e3:9.2f} "
              f"{c.median('inductor') * 1e3:11.2f} {c.ratio_text('kiln', 'eager'):>18s} "
              f"{c.ratio_text('kiln', 'inductor'):>18s} {r['err']:8.1e} "
              f"{r['kiln_build']:5.0f}/{r['inductor_build']:<5.0f}", flush=True)
    print("build s: kiln (export + import + build) / inductor (first call)")


if __name__ == "__main__":
    main()
