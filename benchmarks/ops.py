"""Single-operator speed: kiln next to numpy (and onnxruntime when installed), in one run.

    python benchmarks/ops.py            # all cases
    python benchmarks/ops.py dense      # cases whose name contains "dense"
    python benchmarks/ops.py --depthwise  # MobileNetV2's depthwise layers: NCHWc vs NCHW vs ORT

Prints median latency of each implementation and the ratio kiln / peer (lower is better): the
engines are timed in alternating rounds (``kiln.testing.timing.compare``), the ratio is the
median of the per-round ratios.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.testing.timing import compare, median_seconds

THREADS = int(os.environ.get("KILN_BENCH_THREADS", "2"))


def _single_op_module(shapes, make_call):
    bb = g.BlockBuilder()
    params = [g.Var(f"x{i}", g.TensorStructInfo(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():  # graph passes (layouts, fusion) work on dataflow blocks, as in a model
            out = bb.emit_output(make_call(*params))
        bb.emit_func_output(out)
    return bb.get()


def _ort_session(nodes, inputs, output_shape, initializers=()):
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(output_shape))],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    feeds = {n: a for n, a in inputs}
    return lambda: sess.run(None, feeds)


def _conv_numpy(x, w, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)


def cases():
    rng = np.random.default_rng(0)
    from onnx import helper

    # dense n^3 (x @ w.T), the weight an input (packed at run time, O(n^2), in the timing)
    for n in (1024, 2048):
        x = rng.standard_normal((n, n), dtype=np.float32)
        w = rng.standard_normal((n, n), dtype=np.float32)
        yield (
            f"dense {n}x{n}x{n} fp32",
            _single_op_module([x.shape, w.shape], lambda a, b: op.dense(a, b)),
            [x, w],
            lambda x=x, w=w: x @ w.T,
            _ort_session([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)],
                         [("x", x), ("w", w)], (n, n)),
            2 * n**3,
        )
    # the same with a constant weight, as in a model: packed once at compile time
    from onnx import numpy_helper

    for n in (1024, 2048):
        x = rng.standard_normal((n, n), dtype=np.float32)
        w = rng.standard_normal((n, n), dtype=np.float32)
        yield (
            f"dense {n}x{n}x{n} fp32 const w",
            _one_input_module(x.shape, lambda a, w=w: op.dense(a, g.const(w))),
            [x],
            lambda x=x, w=w: x @ w.T,
            _ort_session([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)],
                         [("x", x)], (n, n), initializers=[numpy_helper.from_array(w, "w")]),
            2 * n**3,
        )
    # conv2d 1x64x56x56, 64 3x3 filters, padding 1
    xc = rng.standard_normal((1, 64, 56, 56), dtype=np.float32)
    wc = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    yield (
        "conv2d 1x64x56x56 k64 3x3 pad1",
        _single_op_module([xc.shape, wc.shape],
                          lambda a, b: op.nn.conv2d(a, b, padding=(1, 1))),
        [xc, wc],
        lambda: _conv_numpy(xc, wc, 1),
        _ort_session([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                     [("x", xc), ("w", wc)], (1, 64, 56, 56)),
        2 * 64 * 56 * 56 * 64 * 9,
    )
    # softmax over 64x1024
    xs = rng.standard_normal((64, 1024), dtype=np.float32)

    def np_softmax():
        e = np.exp(xs - xs.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    yield (
        "softmax 64x1024",
        _single_op_module([xs.shape], lambda a: op.nn.softmax(a, axis=-1)),
        [xs],
        np_softmax,
        _ort_session([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", xs)],
                     xs.shape),
        None,
    )
    # layer_norm over 128x768
    xl = rng.standard_normal((128, 768), dtype=np.float32)
    gamma = rng.standard_normal(768, dtype=np.float32)
    beta = rng.standard_normal(768, dtype=np.float32)

    def np_layer_norm():
        mu = xl.mean(axis=-1, keepdims=True)
        var = ((xl - mu) ** 2).mean(axis=-1, keepdims=True)
        return (xl - mu) / np.sqrt(var + 1e-5) * gamma + beta

    yield (
        "layer_norm 128x768",
        _single_op_module([xl.shape, gamma.shape, beta.shape],
                          lambda a, gm, bt: op.nn.layer_norm(a, gm, bt, axes=(-1,),
                                                             epsilon=1e-5)),
        [xl, gamma, beta],
        np_layer_norm,
        _ort_session(
            [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                              epsilon=1e-5)],
            [("x", xl), ("g", gamma), ("b", beta)], xl.shape),
        None,
    )


#: MobileNetV2's depthwise 3x3 layers at batch 1 (channels, input size, stride).
DEPTHWISE_LAYERS = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                    (384, 14, 1), (576, 14, 1), (960, 7, 1)]


def _one_input_module(shape, make_call):
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make_call(x))
        bb.emit_func_output(out)
    return bb.get()


def depthwise_table() -> int:
    """Per-layer latency of MobileNetV2's depthwise convolutions (padding 1, constant weights):
    kiln's nn.depthwise_conv2d_nchwc on NCHW[lanes]c data (the kernel alone, as it runs inside
    the blocked network), kiln's NCHW conv2d (AlterOpLayout disabled) and onnxruntime's Conv."""
    from onnx import helper, numpy_helper

    from kiln.op.layout import transform_array
    from kiln.target import Target
    from kiln.transform import PassContext

    lanes = Target.create("c").vector_lanes("float32")
    rng = np.random.default_rng(0)
    print(f"threads: {THREADS} (kiln and onnxruntime); channel block {lanes}")
    header = f"{'depthwise 3x3 layer':28s} {'nchwc ms':>9s} {'nchw ms':>9s} {'ort ms':>9s} " \
             f"{'nchwc/ort':>9s} {'nchw/ort':>9s}"
    print(header)
    print("-" * len(header))
    for c, size, stride in DEPTHWISE_LAYERS:
        x = rng.standard_normal((1, c, size, size), dtype=np.float32)
        w = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
        xb = transform_array(x, "NCHW", f"NCHW{lanes}c")
        wb = transform_array(w, "OIHW", f"OIHW{lanes}o")
        blocked = kiln.build(_one_input_module(xb.shape, lambda a, wb=wb, s=stride: (
            op.nn.depthwise_conv2d_nchwc(a, g.const(wb), padding=1, strides=s))))
        with PassContext(opt_level=2, disabled_pass=["AlterOpLayout"]):
            plain = kiln.build(_one_input_module(x.shape, lambda a, w=w, c=c, s=stride: (
                op.nn.conv2d(a, g.const(w), padding=1, strides=s, groups=c))))
        ort_fn = _ort_session(
            [helper.make_node("Conv", ["x", "w"], ["y"], group=c, pads=[1] * 4,
                              strides=[stride] * 2)],
            [("x", x)], plain(x).shape, initializers=[numpy_helper.from_array(w, "w")])
        ref = plain(x)
        got = transform_array(np.asarray(blocked(xb)), f"NCHW{lanes}c", "NCHW")
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-4), f"depthwise C={c}: results differ"
        for exe in (blocked, plain):
            exe.set_num_threads(THREADS)
        t_b = median_seconds(lambda e=blocked, a=xb: e(a))
        t_p = median_seconds(lambda e=plain, a=x: e(a))
        t_o = median_seconds(ort_fn) if ort_fn is not None else float("nan")
        name = f"C={c} {size}x{size} stride {stride}"
        print(f"{name:28s} {t_b * 1e3:9.3f} {t_p * 1e3:9.3f} {t_o * 1e3:9.3f} "
              f"{t_b / t_o:9.2f} {t_p / t_o:9.2f}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if "--depthwise" in argv:
        return depthwise_table()
    pattern = argv[1] if len(argv) > 1 else ""
    header = (f"{'case':34s} {'kiln ms':>9s} {'numpy ms':>9s} {'k/np':>6s} "
              f"{'ort ms':>9s} {'k/ort':>6s}")
    print(f"threads: kiln OpenMP default, onnxruntime {THREADS}")
    print(header)
    print("-" * len(header))
    for name, mod, inputs, np_fn, ort_fn, flops in cases():
        if pattern not in name:
            continue
        exe = kiln.build(mod, target="c")
        out = exe(*inputs)
        ref = np_fn()
        assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), f"{name}: kiln result differs"
        engines = {"kiln": lambda exe=exe, inputs=inputs: exe(*inputs), "numpy": np_fn}
        if ort_fn is not None:
            engines["ort"] = ort_fn
        times = compare(engines)
        t_k, t_np = times.median("kiln"), times.median("numpy")
        line = f"{name:34s} {t_k * 1e3:9.3f} {t_np * 1e3:9.3f} {times.ratio('kiln', 'numpy'):6.2f}"
        if ort_fn is not None:
            t_ort = times.median("ort")
            line += f" {t_ort * 1e3:9.3f} {times.ratio('kiln', 'ort'):6.2f}"
        if flops:
            line += f"   kiln {flops / t_k / 1e9:.1f} GFLOP/s, numpy {flops / t_np / 1e9:.1f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
