"""The model zoo: every architecture of ``kiln.testing.zoo`` through kiln, next to onnxruntime.

    python benchmarks/zoo.py                     # the whole zoo, CPU (C target)
    python benchmarks/zoo.py bert resnet18       # some models (names or name substrings)
    python benchmarks/zoo.py --family vision     # one family; --ci: the CI test's subset
    python benchmarks/zoo.py --target opencl     # another target (npu, cuda where built)
    python benchmarks/zoo.py --no-timing         # correctness only
    python benchmarks/zoo.py -j 3                # three models at a time
    python benchmarks/zoo.py --frontend torch    # through torch.export, against torch eager

Each model is exported to ONNX once (cached under kiln's cache directory, ``zoo/``), imported,
compiled and run by kiln, checked against onnxruntime (fp32; max error <= 1e-4 of the output's
scale) and timed beside it in alternating rounds, both engines with ``--threads`` threads
(default 2). ``-j N`` runs N models at once: faster on a machine with spare cores, but the
engines of one model are then timed under the others' load (their ratio, measured in
alternating rounds, suffers less than the latencies). Each model runs in a child process
(``--no-isolate`` to run in this one), so that a crash is one model's failure, classified
``crash``. The table gives the status (``pass`` or the failing stage: export, reference,
import, target, compile, run, mismatch, crash), the error relative to the output's scale,
compile seconds, kiln and onnxruntime latency and their ratio (median of the per-round
ratios; lower is better for kiln); then the pass rate, the geometric mean of the ratios over
the passing models, the five slowest models relative to onnxruntime and every failure with
its node and reason. ``--json`` writes the results. ``--frontend torch`` runs the same
catalogue through kiln's PyTorch frontend (torch.export of the entry's module, same seeded
weights), checked against and timed beside torch eager.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing as mp
import os
import sys
import time
import warnings

sys.path.insert(0, ".")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kiln.testing.zoo import CATALOGUE, FAMILIES  # noqa: E402
from kiln.testing.zoo.runner import ZooResult, run_model, run_model_torch  # noqa: E402

RUNNERS = {"onnx": run_model, "torch": run_model_torch}


def _child(frontend: str, name: str, kwargs: dict, queue: mp.Queue) -> None:
    warnings.simplefilter("ignore")
    queue.put(RUNNERS[frontend](CATALOGUE[name], **kwargs).as_dict())


def run_isolated(frontend: str, name: str, kwargs: dict, timeout: float) -> ZooResult:
    """The model's run in a child process; a crash or a timeout is the model's failure."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(frontend, name, kwargs, queue))
    proc.start()
    try:
        return ZooResult(**queue.get(timeout=timeout))
    except Exception:  # noqa: BLE001 - queue.Empty: the child died or hung
        model = CATALOGUE[name]
        proc.join(1)
        if proc.is_alive():
            proc.kill()
            why = f"no result within {timeout:.0f} s"
        else:
            why = f"the process died with exit code {proc.exitcode}"
        return ZooResult(name, model.family, model.source, status="crash", error=why,
                         reference="torch" if frontend == "torch" else "onnxruntime")
    finally:
        proc.join(5)


def select(args: argparse.Namespace) -> list[str]:
    names = list(CATALOGUE)
    if args.models:
        # an exact name selects that model, another word every name containing it
        names = [n for n in names
                 if any(m == n or (m not in CATALOGUE and m in n) for m in args.models)]
    if args.family:
        names = [n for n in names if CATALOGUE[n].family in args.family]
    if args.ci:
        names = [n for n in names if CATALOGUE[n].ci]
    return names


def _ms(s: float | None) -> str:
    return f"{s * 1e3:9.3f}" if s is not None else f"{'-':>9s}"


def report(results: list[ZooResult]) -> str:
    lines = [f"{'model':30s} {'family':16s} {'status':9s} {'rel.err':>8s} {'compile s':>9s} "
             f"{'kiln ms':>9s} {'ref ms':>9s} {'kiln/ref':>8s}"]
    for r in results:
        err = f"{r.max_error:8.1e}" if r.max_error is not None else f"{'-':>8s}"
        comp = f"{r.compile_s:9.1f}" if r.compile_s is not None else f"{'-':>9s}"
        ratio = f"{r.ratio:8.2f}" if r.ratio is not None else f"{'-':>8s}"
        lines.append(f"{r.name:30s} {r.family:16s} {r.status:9s} {err} {comp} {_ms(r.kiln_s)} "
                     f"{_ms(r.ref_s)} {ratio}")
    passed = [r for r in results if r.passed]
    ref = results[0].reference if results else "onnxruntime"
    lines.append(f"ref: {ref}")
    lines.append(f"\npassed {len(passed)}/{len(results)} "
                 f"({100 * len(passed) / max(len(results), 1):.1f}%)")
    timed = [r for r in passed if r.ratio]
    if timed:
        gm = math.exp(sum(math.log(r.ratio) for r in timed) / len(timed))
        lines.append(f"geometric mean kiln/{ref} latency over {len(timed)} models: "
                     f"{gm:.2f}")
        worst = sorted(timed, key=lambda r: r.ratio, reverse=True)[:5]
        lines.append(f"slowest relative to {ref}: " + ", ".join(
            f"{r.name} {r.ratio:.2f}x" for r in worst))
    failed = [r for r in results if not r.passed]
    if failed:
        lines.append("\nfailures:")
        for r in failed:
            node = f" [{r.node}]" if r.node else ""
            lines.append(f"  {r.name} ({r.status}){node}: {r.error[:400]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="model names or substrings (default: all)")
    ap.add_argument("--family", action="append", choices=FAMILIES)
    ap.add_argument("--ci", action="store_true", help="only the CI test's subset")
    ap.add_argument("--target", default="c", help="c (default), opencl, cuda, npu")
    ap.add_argument("--frontend", choices=tuple(RUNNERS), default="onnx",
                    help="onnx (default: the exported file, against onnxruntime) or torch "
                         "(torch.export, against eager)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KILN_BENCH_THREADS", 2)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-isolate", action="store_true")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="models run at once (isolated)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model (isolated)")
    ap.add_argument("--json", default="zoo-results.json", help="results file ('' for none)")
    args = ap.parse_args()
    names = select(args)
    if not names:
        ap.error("no model selected")
    kwargs = {"target": args.target, "timing": not args.no_timing, "threads": args.threads,
              "rounds": args.rounds}
    try:
        from tqdm import tqdm
    except ImportError:  # plain lines instead of a bar
        tqdm = None
    bar = tqdm(total=len(names), unit="model", dynamic_ncols=True) if tqdm else None
    say = bar.write if bar else print
    done: dict[str, ZooResult] = {}
    start = time.perf_counter()

    def finished(name: str, r: ZooResult) -> None:
        done[name] = r
        ratio = f" kiln/ref {r.ratio:.2f}" if r.ratio else ""
        say(f"[{len(done)}/{len(names)}] {name}: {r.status}{ratio}"
            + (f" -- {r.error[:160]}" if r.error else ""))
        if bar:
            bar.update()

    if args.no_isolate:
        for name in names:
            if bar:
                bar.set_description(name)
            finished(name, RUNNERS[args.frontend](CATALOGUE[name], **kwargs))
    else:
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = {pool.submit(run_isolated, args.frontend, n, kwargs, args.timeout): n
                       for n in names}
            for fut in concurrent.futures.as_completed(futures):
                finished(futures[fut], fut.result())
    results = [done[n] for n in names]
    if bar:
        bar.close()
    print(f"\nfrontend {args.frontend}, target {args.target}, threads {args.threads}, "
          f"{time.perf_counter() - start:.0f} s\n")
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"frontend": args.frontend, "target": args.target, "threads": args.threads,
                       "results": [r.as_dict() for r in results]}, f, indent=1)
        print(f"\nresults written to {args.json}")


if __name__ == "__main__":
    main()
