"""Sub-batches at the front of a batched network (kiln.schedule.npu.sub_batch): the layers whose
intermediates do not fit L1 at the full batch run per slice of it, the same bits as the
unsliced build (float and int8), less DRAM traffic by the simulator's counters; a batch
whose intermediates fit already, a batch of one and the PassContext option off are not
sliced."""

from __future__ import annotations

import numpy as np

import kiln
from kiln.build import npu_pipeline
from kiln.codegen.npu import build_npu
from kiln.quantize import quantize_model
from kiln.schedule.npu import LoweringContext
from kiln.schedule.npu.sub_batch import SUB_BATCH_KEY, plan_sub_batches
from kiln.target.npu import load_config
from kiln.testing import models
from kiln.testing.quant_reference import run_quantized_graph
from kiln.transform.npu import partition_for_npu


def _dram_bytes(exe):
    return sum(r.dram_read + r.dram_written for r in exe.last_reports)


def _both(mod, hw):
    """Built with sub-batches off (the PassContext option) and on (the default). Without the
    bank placement and the prefetch, whose timing replays double the build time: both keep
    the bits (their own tests) and work on the sliced program as on any other."""
    mod = npu_pipeline()(mod)
    target = kiln.Target("npu", hw=hw)
    with kiln.transform.PassContext(config={SUB_BATCH_KEY: False}):
        off = build_npu(mod, target, bank_plan=False, prefetch=False)
    return off, build_npu(mod, target, bank_plan=False, prefetch=False)


def _region(mod, hw):
    """The NPU region function of ``mod`` partitioned for ``hw``."""
    part = partition_for_npu(load_config(hw), True)(npu_pipeline()(mod))
    return next(f for _, f in part.items() if getattr(f, "attrs", {}).get("Codegen") == "npu")


def test_a_conv_chain_runs_per_image_with_the_same_bits_and_less_dram():
    """conv-bn-relu -> pool -> conv-relu on "edge" (256 KiB of L1): the first activation
    (32 x 32 x 32 float32, 128 KiB per image) does not fit L1 at batch 2, one image's does
    (batch 4: the int8 test below; measured on this network too, 1.11x fewer cycles). The
    sliced build runs the front per image, keeps it in L1, moves fewer DRAM bytes, and
    computes the same bits (and the numpy model's values)."""
    batch = 2
    m = models.small_cnn(batch=batch, channels=32, size=32)
    off, on = _both(m.mod, "edge")
    x = m.inputs[0]
    want, got = off(x), on(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, m.reference(x), rtol=2e-2, atol=2e-2)
    assert off.sub_batches == [None]
    plan = on.sub_batches[0]
    assert plan is not None and plan.batch == batch and plan.size == 1 and plan.saved > 0
    # one kernel per slice for each sliced layer: more kernels, fewer bytes
    assert len(on.kernels) > len(off.kernels)
    assert _dram_bytes(on) < _dram_bytes(off) - plan.saved // 2
    assert on.residency.tensors > off.residency.tensors
    assert on.last_cycles < off.last_cycles
    assert "sub-batches: " in on.describe()
    # each sliced layer's weights are uploaded once, not once per slice
    assert len(on.constants) == len(off.constants)


def test_int8_sub_batches_are_bit_exact():
    """The quantized ResNet block at batch 4 on "edge": the stem's int32 accumulators (32 x 32
    x 16, 64 KiB per image) fit L1 per image only; sliced, the output is the quantized
    graph's numpy model bit for bit, as unsliced, with less DRAM traffic and fewer cycles
    (the cost model slices only the front, where the tensor unit does not bind)."""
    m = models.resnet_block_cnn(batch=4, channels=16, size=32, blocks=1)
    rng = np.random.default_rng(1)
    calib = [rng.standard_normal(m.inputs[0].shape).astype("float32") for _ in range(2)]
    qmod = quantize_model(m.mod, None, calib)
    off, on = _both(qmod, "edge")
    x = calib[0]
    want = run_quantized_graph(qmod, x)
    np.testing.assert_array_equal(off(x), want)
    np.testing.assert_array_equal(on(x), want)
    assert on.sub_batches[0] is not None and on.sub_batches[0].size < 4
    assert _dram_bytes(on) < _dram_bytes(off)
    assert on.last_cycles < off.last_cycles


def test_what_fits_or_is_one_image_is_not_sliced():
    """On "default" (4 MiB of L1) the same network's activations fit at batch 4: nothing to
    gain, no plan. A batch of one has nothing to slice."""
    for hw, batch in (("default", 4), ("edge", 1)):
        ctx = LoweringContext(load_config(hw))
        assert plan_sub_batches(ctx, _region(models.small_cnn(batch, 32, 32).mod, hw)) is None
