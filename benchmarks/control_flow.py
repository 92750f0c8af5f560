"""ONNX Loop: unrolled at import vs run by the executor, side by side with onnxruntime.

Usage: ``python benchmarks/control_flow.py [--trips 4,16,64] [--width 64] [--repeat 200]``.

The model is a recurrence ``acc = tanh(acc @ W + x)`` in a Loop with a constant trip count.
kiln imports it twice: unrolled (``UNROLL_LIMIT`` raised above trip x body nodes: one straight
graph, the iterations fused and planned together) and as a run-time loop (``UNROLL_LIMIT`` 0:
a ``kiln.control.loop`` step calling the body function once per iteration). Printed per trip
count: the build time and the per-call latency of both, onnxruntime's latency, and the ratio
that decides ``converters/control_flow.UNROLL_LIMIT``.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.frontend.onnx.converters import control_flow

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def loop_model(trip: int, width: int):
    body = helper.make_graph(
        [helper.make_node("MatMul", ["acc_in", "W"], ["mm"]),
         helper.make_node("Add", ["mm", "x"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["acc_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c_in", B, []),
                 helper.make_tensor_value_info("acc_in", F, [1, width])],
        [helper.make_tensor_value_info("c_out", B, []),
         helper.make_tensor_value_info("acc_out", F, [1, width])])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.int64(trip), "M"),
             numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width))
                                     .astype(np.float32), "W")]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "acc0"], ["acc"], body=body)], "g",
        [helper.make_tensor_value_info("acc0", F, [1, width]),
         helper.make_tensor_value_info("x", F, [1, width])],
        [helper.make_tensor_value_info("acc", F, [1, width])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def latency(fn, feeds: dict, repeat: int) -> float:
    fn(**feeds)
    start = time.perf_counter()
    for _ in range(repeat):
        fn(**feeds)
    return (time.perf_counter() - start) / repeat


def build(model, unroll_limit: int):
    saved = control_flow.UNROLL_LIMIT
    control_flow.UNROLL_LIMIT = unroll_limit
    try:
        start = time.perf_counter()
        mod, params = from_onnx(model)
        exe = kiln.build(mod, params=params)
        return exe, time.perf_counter() - start
    finally:
        control_flow.UNROLL_LIMIT = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trips", default="4,16,64")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    print(f"width {args.width}; latency per call in microseconds; "
          "ratio = run-time loop / unrolled")
    print(f"{'trip':>5} {'build unrolled':>15} {'build loop':>11} {'unrolled':>9} "
          f"{'loop':>9} {'ort':>9} {'ratio':>6}")
    for trip in (int(t) for t in args.trips.split(",")):
        model = loop_model(trip, args.width)
        feeds = {n: rng.standard_normal((1, args.width)).astype(np.float32)
                 for n in ("acc0", "x")}
        unrolled, b_unrolled = build(model, trip * len(model.graph.node[0].attribute[0].g.node))
        looped, b_loop = build(model, 0)
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)[0]
        for exe in (unrolled, looped):
            np.testing.assert_allclose(exe(**feeds), ref, rtol=1e-4, atol=1e-5)
        t_u = latency(unrolled, feeds, args.repeat) * 1e6
        t_l = latency(looped, feeds, args.repeat) * 1e6
        t_o = latency(functools.partial(sess.run, None), {"input_feed": feeds}, args.repeat) * 1e6
        print(f"{trip:>5} {b_unrolled:>14.2f}s {b_loop:>10.2f}s {t_u:>9.1f} {t_l:>9.1f} "
              f"{t_o:>9.1f} {t_l / t_u:>6.2f}")


if __name__ == "__main__":
    main()
