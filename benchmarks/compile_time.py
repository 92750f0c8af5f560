"""Build times per model: cold, warm kernels, and from the executable cache.

    python benchmarks/compile_time.py                      # the models of benchmarks/models.py
    python benchmarks/compile_time.py resnet18 --repeat 3  # some of them, best of 3 each
    python benchmarks/compile_time.py resnet18 --profile   # + cProfile of the cold build

For each model (exported from PyTorch to ONNX with random weights, as in
``benchmarks/models.py``) three builds run, each in a fresh Python process that imports the
ONNX file and times ``kiln.build`` alone (the import is printed beside it):

- **cold**: an empty cache directory (``KILN_CACHE_DIR`` of its own): graph passes,
  scheduling, lowering, code generation and the C compile all run;
- **warm-process**: the same directory after the cold build, the executable cache off
  (``KILN_EXECUTABLE_CACHE=0``): every kernel library is found in the kernel cache, everything
  before the C compile runs again (what a restart paid before the executable cache);
- **cached**: the executable cache on: the stored executable is loaded.

With ``--repeat N`` the warm and cached builds run N times each (fresh processes) and the
minimum and maximum are printed. Beside each wall time is the CPU time the build used
(``getrusage``: kiln's own process, and for the cold build the C compiler processes it ran):
on a machine shared with other work the wall time grows with the load, the CPU time hardly
(a cold build on an idle machine with ``c`` cores takes about cpu + C compiler / c seconds,
the pieces of a large model being compiled in parallel). Targets (issue 27): cached < 1 s for
every model, cold ResNet-18 < 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from models import CASES  # the script's folder: benchmarks/models.py (name -> (model, batch))

_CHILD = r"""
import json, resource, sys, time
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime
t0 = time.perf_counter()
import kiln
from kiln.frontend.onnx import from_onnx
t1 = time.perf_counter()
mod, params = from_onnx(sys.argv[1])
t2 = time.perf_counter()
if sys.argv[2] == "profile":
    import cProfile, pstats
    prof = cProfile.Profile()
    prof.enable()
c0 = cpu()
exe = kiln.build(mod, params=params)
t3 = time.perf_counter()
c1 = cpu()
if sys.argv[2] == "profile":
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
print(json.dumps({"import_kiln": t1 - t0, "from_onnx": t2 - t1, "build": t3 - t2,
                  "cpu": c1[0] - c0[0], "cc_cpu": c1[1] - c0[1], "kernels": exe.num_kernels}))
"""


def _run(path: str, cache_dir: str, exe_cache: bool, profile: bool = False) -> dict:
    env = {**os.environ, "KILN_CACHE_DIR": cache_dir,
           "KILN_EXECUTABLE_CACHE": "1" if exe_cache else "0"}
    out = subprocess.run([sys.executable, "-c", _CHILD, path, "profile" if profile else "-"],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"build of {path} failed:\n{out.stderr[-3000:]}")
    if profile:
        print(out.stderr, flush=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _span(times: list[float]) -> str:
    lo, hi = min(times), max(times)
    return f"{lo:7.2f} s" if len(times) == 1 else f"{lo:7.2f} s ({lo:.2f}-{hi:.2f})"


def bench(name: str, repeat: int, profile: bool) -> None:
    from kiln.testing import torch_models

    model_name, batch = CASES[name]
    data, _ = torch_models.onnx_model(model_name, batch)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        with open(path, "wb") as f:
            f.write(data)
        cache_dir = os.path.join(tmp, "cache")
        cold = _run(path, cache_dir, exe_cache=True, profile=profile)
        warm = [_run(path, cache_dir, exe_cache=False) for _ in range(repeat)]
        cached = [_run(path, cache_dir, exe_cache=True) for _ in range(repeat)]
    print(f"{name:14s} | cold {cold['build']:6.2f} s (cpu {cold['cpu']:.2f} + C compiler "
          f"{cold['cc_cpu']:.2f}) | warm-process {_span([r['build'] for r in warm])} (cpu "
          f"{min(r['cpu'] for r in warm):.2f}) | cached {_span([r['build'] for r in cached])} "
          f"(cpu {min(r['cpu'] for r in cached):.2f}) | ONNX import {cold['from_onnx']:.2f} s "
          f"| {cold['kernels']} kernels", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"subset of {sorted(CASES)}")
    ap.add_argument("--repeat", type=int, default=1, help="warm and cached builds per model")
    ap.add_argument("--profile", action="store_true", help="cProfile the cold build")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {sorted(CASES)}")
    for name in args.cases or list(CASES):
        bench(name, max(1, args.repeat), args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
