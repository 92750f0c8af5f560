"""Random NPU models (``kiln.testing.npu_fuzz``): built for each hardware description,
simulated, checked against float64 torch, against the build with its optimizations off and the
other lowering route (the same bits), with the epilogue unfused, in float16 and bfloat16, and
(int8 cases) quantized against the numpy model of quantized graphs.

    python benchmarks/npu_fuzz.py --cases 200                  # seeds 0..199, default and edge
    python benchmarks/npu_fuzz.py --start 1000 --cases 50 --hw edge
    python benchmarks/npu_fuzz.py --seed 86 -v                 # one case, its layers and checks

Prints one line per failing case (seed, description, layers, what failed) and a summary: cases,
failures, the largest error against the reference, simulated cycles. Run it on a branch that
changes the NPU compiler before merging it.
"""

from __future__ import annotations

import argparse
import sys
import time

from kiln.testing.npu_fuzz import TOLERANCE, check_case, make_case


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, default=None, help="run this one seed")
    ap.add_argument("--hw", default="default,edge", help="comma-separated descriptions")
    ap.add_argument("--quick", action="store_true",
                    help="the reference check only (no optimizations-off / route builds)")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    args = ap.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.cases)
    start, failed, worst, count = time.monotonic(), 0, 0.0, 0
    for seed in seeds:
        case = make_case(seed)
        for hw in args.hw.split(","):
            res = check_case(case, hw, variants=not args.quick)
            count += 1
            worst = max(worst, res.error)
            if args.verbose or not res.ok:
                print(f"seed {seed} {hw} {case.kind}: {' '.join(case.layers)} -- error "
                      f"{res.error:.2e}, {res.cycles:,.0f} cycles"
                      f"{', CPU ' + ','.join(res.cpu_ops) if res.cpu_ops else ''}"
                      f"{'' if res.ok else ' FAILED'}", flush=True)
            for f in res.failures:
                print("    " + f.replace("\n", "\n    "), flush=True)
            failed += not res.ok
    print(f"{count} builds of {len(seeds)} cases: {failed} failed; largest error "
          f"{worst:.2e} (tolerance {TOLERANCE}); {time.monotonic() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
