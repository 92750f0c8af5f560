"""What the run-time index checks cost: the same gather kernels with and without them.

    python benchmarks/index_checks.py

Gathers and scatters check every index while they run (``kiln.tir.check_index``: an index out
of range fails the call with a RuntimeCheckError, as onnxruntime raises). ``hoist_checks``
moves a check out of the loops it does not depend on, so a gather of rows checks each index
once per row, not once per element. Each case builds one kernel twice from the same tensor
expression -- the checked index, and the bare one (the caller's promise that it is in range) --
with the same schedule, and times them in alternating rounds (``kiln.testing.timing.compare``)
next to onnxruntime's operator. Printed: median latencies, checked / bare (the cost of the
checks) and checked / onnxruntime.
"""

from __future__ import annotations

import os

import numpy as np

from kiln import te, tir
from kiln.codegen import c as codegen_c
from kiln.schedule.cpu.generic import schedule_injective
from kiln.target import Target
from kiln.testing.timing import compare

THREADS = int(os.environ.get("KILN_BENCH_THREADS", "2"))


def _bare(v, n):
    """The index without a check: negative ones counted from the end (the "fast" take)."""
    v = tir.cast("int64", v)
    return tir.select(v < 0, v + n, v)


def _checked(v, n):
    return tir.check_index(v, n, "bench")


def _kernel(shapes, dtypes, compute):
    """A scheduled, compiled kernel of ``compute(*placeholders)``; its checked entry."""
    ins = [te.placeholder(s, d, name=f"in{k}") for k, (s, d) in enumerate(zip(shapes, dtypes))]
    out = compute(*ins)
    sch = tir.Schedule(te.create_prim_func([*ins, out]))
    target = Target.create("c")
    schedule_injective(sch, target)
    mod = codegen_c.build({"k": sch.func}, target)
    return mod["k"], tuple(int(d.value) for d in out.shape), out.dtype.to_numpy()


def _rows(fix, n, width, count):
    """Gather ``count`` rows of ``width`` elements from an ``n``-row table (ONNX Gather)."""
    return _kernel([(n, width), (count,)], ["float32", "int64"],
                   lambda x, i: te.compute((count, width),
                                           lambda r, c: x[fix(i[r], n), c], name="out"))


def _elements(fix, rows, cols):
    """GatherElements along the last axis: every element has its own index."""
    return _kernel([(rows, cols), (rows, cols)], ["float32", "int64"],
                   lambda x, i: te.compute((rows, cols),
                                           lambda r, c: x[r, fix(i[r, c], cols)], name="out"))


def _ort(op_type, x, idx, **attrs):
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    node = helper.make_node(op_type, ["x", "i"], ["y"], **attrs)
    graph = helper.make_graph([node], "bench", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
        helper.make_tensor_value_info("i", TensorProto.INT64, list(idx.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"x": x, "i": idx})


def cases():
    rng = np.random.default_rng(0)
    for n, width, count in ((30522, 768, 1024), (100000, 16, 100000), (1000000, 1, 1000000)):
        x = rng.standard_normal((n, width), dtype=np.float32)
        idx = rng.integers(-n, n, count)
        yield (f"Gather rows {n}x{width}, {count} indices",
               lambda fix, n=n, width=width, count=count: _rows(fix, n, width, count),
               [x, idx], _ort("Gather", x, idx, axis=0))
    for rows, cols in ((512, 1024), (2048, 2048)):
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        idx = rng.integers(-cols, cols, (rows, cols))
        yield (f"GatherElements {rows}x{cols} axis 1",
               lambda fix, rows=rows, cols=cols: _elements(fix, rows, cols),
               [x, idx], _ort("GatherElements", x, idx, axis=1))


def main() -> None:
    print(f"{'case':44s} {'checked':>10s} {'bare':>10s} {'ORT':>10s}  checked/bare  "
          "checked/ORT")
    for name, make, arrays, ort_fn in cases():
        fns = {}
        for label, fix in (("checked", _checked), ("bare", _bare)):
            fn, shape, dtype = make(fix)
            out = np.empty(shape, dtype)
            fn(*arrays, out)
            fns[label] = lambda fn=fn, out=out, arrays=arrays: fn(*arrays, out)
        if ort_fn is not None:
            fns["ORT"] = ort_fn
        result = compare(fns, rounds=5)
        ms = {k: 1e3 * result.median(k) for k in fns}
        ort_text = f"{ms['ORT']:8.3f}ms" if "ORT" in ms else f"{'-':>10s}"
        vs_ort = result.ratio_text("checked", "ORT") if "ORT" in ms else "-"
        print(f"{name:44s} {ms['checked']:8.3f}ms {ms['bare']:8.3f}ms {ort_text}  "
              f"{result.ratio_text('checked', 'bare'):>16s}  {vs_ort}")


if __name__ == "__main__":
    main()
