"""PyTorch's OpInfo operator tests through torch.export and kiln: the pass table by op.

For every op of ``op_db`` that runs in float32 on CPU and each of its float32 samples that
``torch.export`` can export (and whose exported program agrees with eager), kiln's result is
compared with eager (rtol 1e-5, atol 1e-5, NaNs equal; integer and bool results exactly).
Eigenvectors and singular vectors are unique only up to sign, so for ``linalg.eigh``, ``svd``
and ``linalg.svd`` (``SIGN_FREE`` of ``kiln.testing.torch_opinfo``) kiln's factors must first
reconstruct the matrix eager's reconstruct (same tolerances), then each vector's sign is set to
eager's (a singular vector pair flips together) and the results are compared as above.
Prints one line per op (exportable samples, passed, first failure) and the totals; ops excluded
(``kiln.frontend.torch.exclusions``) are listed with their reasons.

    python benchmarks/torch_opinfo.py                  # every op (~30 min on 2 cores)
    python benchmarks/torch_opinfo.py --ops add,mul    # some ops
    python benchmarks/torch_opinfo.py --json out.json  # also write every case's result
    python benchmarks/torch_opinfo.py --cache DIR --export-only --shard 0/2  # export (and
                                # keep) half of the samples; a later run with --cache DIR
                                # imports, compiles and compares without exporting again
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import defaultdict

sys.path.insert(0, ".")

from kiln.frontend.torch.exclusions import EXCLUDED_OPS  # noqa: E402
from kiln.testing import torch_opinfo  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--max-samples", type=int, default=None, help="samples per op")
    ap.add_argument("--batch", type=int, default=48, help="cases per kiln build")
    ap.add_argument("--json", help="write each case's result here")
    ap.add_argument("--failures", action="store_true", help="print every failing case")
    ap.add_argument("--cache", help="directory keeping the exported cases")
    ap.add_argument("--shard", default="0/1", help="k/n: only the ops at positions k mod n")
    ap.add_argument("--export-only", action="store_true", help="export (into --cache) only")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    names = args.ops.split(",") if args.ops else None
    t0 = time.time()
    k, n = (int(v) for v in args.shard.split("/"))
    cases = list(torch_opinfo.cases(names, args.max_samples, args.cache, (k, n)))
    print(f"exported {len(cases)} samples in {time.time() - t0:.0f} s", file=sys.stderr,
          flush=True)
    if args.export_only:
        return
    t1 = time.time()
    torch_opinfo.run(cases, batch=args.batch,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    t2 = time.time()
    by_op: dict[str, list] = defaultdict(list)
    for c in cases:
        by_op[c.op].append(c)
    total = exportable = passed = 0
    print(f"{'op':40s} {'samples':>7s} {'export':>6s} {'pass':>5s}  first failure")
    for name, cs in sorted(by_op.items()):
        ex = [c for c in cs if c.exportable]
        ok = [c for c in ex if c.result == "pass"]
        fail = next((c for c in ex if c.result != "pass"), None)
        total += len(cs)
        exportable += len(ex)
        passed += len(ok)
        msg = "" if fail is None else f"[{fail.stage}] {fail.result}"[:110].replace("\n", " ")
        if not ex:
            reason = cs[0].not_exportable or ""
            msg = f"(not exportable: {reason})"[:110].replace("\n", " ")
        print(f"{name:40s} {len(cs):7d} {len(ex):6d} {len(ok):5d}  {msg}")
        if args.failures:
            for c in ex:
                if c.result != "pass":
                    print(f"    #{c.index} [{c.stage}] {c.result}"[:300].replace("\n", " "))
    print(f"\nexcluded ops ({len(EXCLUDED_OPS)}):")
    for name, reason in sorted(EXCLUDED_OPS.items()):
        print(f"  {name}: {reason}")
    pct = 100.0 * passed / max(exportable, 1)
    print(f"\nops {len(by_op)}, samples {total}, exportable {exportable}, passed {passed} "
          f"({pct:.1f}% of exportable); export {t1 - t0:.0f} s, kiln {t2 - t1:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"op": c.op, "index": c.index, "exportable": c.exportable,
                        "not_exportable": c.not_exportable, "result": c.result,
                        "stage": c.stage} for c in cases], f, indent=1)


if __name__ == "__main__":
    main()
