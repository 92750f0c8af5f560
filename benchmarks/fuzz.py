"""Fuzz kiln: seeded mutations of models, inputs and saved executables (``kiln.testing.fuzz``).

    python benchmarks/fuzz.py --cases 20000 --workers 2           # seeds 0..19999
    python benchmarks/fuzz.py --start 50000 --cases 1000 --kinds inputs,dims
    python benchmarks/fuzz.py --seed 1234                         # one case, in this process

Prints the table of outcomes by class (with example seeds) and by kind of case; ``--json``
writes one line per case as it ends. Every case runs in a worker process under ``--timeout``
seconds; kernels compile into ``$KILN_CACHE_DIR`` (set it to keep the fuzzer's out of the shared
cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from kiln.testing.fuzz import KINDS, fuzz, run_one


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--kinds", default="", help=f"comma-separated subset of {','.join(KINDS)}")
    ap.add_argument("--json", default="", help="write every outcome here (JSON lines)")
    ap.add_argument("--seed", type=int, default=None, help="run one case here and print it")
    args = ap.parse_args(argv)
    kinds = None
    if args.kinds:
        names = args.kinds.split(",")
        unknown = [n for n in names if n not in KINDS]
        if unknown:
            ap.error(f"unknown kinds {unknown}; choose from {list(KINDS)}")
        kinds = {n: KINDS[n] for n in names}
    if args.seed is not None:
        print(run_one(args.seed, kinds))
        return 0
    start = time.monotonic()
    log = open(args.json, "w") if args.json else None  # written as cases end

    def progress(outcome, report):
        if log is not None:
            log.write(json.dumps(asdict(outcome)) + "\n")
            log.flush()
        n = len(report.outcomes)
        if n % 100 == 0:
            rate = n / (time.monotonic() - start)
            bad = len(report.failures())
            print(f"  {n} cases, {rate:.2f}/s, {bad} failures", file=sys.stderr, flush=True)

    report = fuzz(range(args.start, args.start + args.cases), args.workers, args.timeout,
                  kinds, progress=progress)
    print(report.table())
    print(f"\n{time.monotonic() - start:.0f} s")
    if log is not None:
        log.close()
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
