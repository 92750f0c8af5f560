"""Targets for other CPUs: feature sets implied by a CPU name, schedules that follow them, code
built for them, executables that record them and refuse to load on a CPU without them."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import c as codegen_c
from kiln.ir.errors import KilnError, TargetError
from kiln.target import Target
from kiln.target.cpu import host_features, mcpu_features
from kiln.testing import models


@pytest.mark.parametrize("mcpu,bits,has,lacks", [
    ("x86-64-v2", 128, {"sse4_2", "popcnt"}, {"avx", "avx2", "fma"}),
    ("x86-64-v3", 256, {"avx2", "fma", "f16c", "bmi2"}, {"avx512f"}),
    ("x86-64-v4", 512, {"avx2", "avx512f", "avx512bw", "avx512vl"}, {"avx512fp16"}),
    ("znver3", 256, {"avx2", "fma", "sha_ni"}, {"avx512f"}),
    ("skylake-avx512", 512, {"avx512f", "avx512dq"}, {"amx_tile"}),
    ("sapphirerapids", 512, {"avx512fp16", "amx_tile", "amx_bf16"}, set()),
])
def test_a_cpu_name_implies_its_features(mcpu, bits, has, lacks):
    t = Target("c", mcpu=mcpu)
    assert t.mcpu == mcpu and t.features == mcpu_features(mcpu)
    assert has <= t.features and not (lacks & t.features)
    assert t.vector_bits == bits and t.required_features == t.features
    assert t.spec == f"c -mcpu={mcpu}" and Target.create(t.spec) == t


def test_target_strings():
    assert Target.create("x86-64-v3") == Target("c", mcpu="x86-64-v3")
    assert Target.create("llvm -mcpu=znver3").mcpu == "znver3"
    assert Target.create("cpu").mcpu == "native" and Target.create("native").kind == "c"
    with pytest.raises(KilnError, match="unknown option '-mattr=.*-mcpu=NAME"):
        Target.create("c -mattr=+avx2")


def test_an_unknown_cpu_lists_the_known_ones():
    with pytest.raises(KilnError, match="unknown target CPU 'znver99'.*x86-64-v3.*znver3"):
        Target("c", mcpu="znver99")
    with pytest.raises(KilnError, match="unknown target CPU 'x86-64-v3x'"):
        Target.create("x86-64-v3x")


def test_native_requires_only_what_this_cpu_has():
    assert Target("c").required_features <= host_features()
    assert Target("c").features == host_features()


def test_schedules_and_code_follow_the_target_not_the_host():
    """x86-64-v2 has 128-bit vectors only: no 256-bit vector types in its code, whatever the
    host has; x86-64-v3 code uses them."""
    model = models.mlp(batch=2, sizes=(64, 32, 16))
    from kiln.build import default_pipeline, schedule_prim_func
    from kiln.tir.function import PrimFunc
    from kiln.transform import PassContext

    sources = {}
    for mcpu in ("x86-64-v2", "x86-64-v3"):
        tgt = Target("c", mcpu=mcpu)
        with PassContext(opt_level=2):
            mod = default_pipeline(target=tgt)(model.mod)
        funcs = {n: schedule_prim_func(f, tgt) for n, f in mod.items() if isinstance(f, PrimFunc)}
        sources[mcpu], _ = codegen_c.generate_source(funcs, tgt)
    assert "float32x8" not in sources["x86-64-v2"] and "float32x4" in sources["x86-64-v2"]
    assert "float32x8" in sources["x86-64-v3"]


@pytest.mark.parametrize("mcpu", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "znver3",
                                  "skylake-avx512", "sapphirerapids"])
def test_executables_for_other_cpus_run_here_or_are_refused(mcpu, tmp_path):
    """Built for ``mcpu``, saved and loaded: on a CPU with every feature the code needs it runs
    and matches numpy; on one without, both the built executable and ``kiln.load`` refuse it
    with a TargetError naming the missing features (it used to die of SIGILL)."""
    model = models.small_cnn(batch=1, channels=8, size=8)
    exe = kiln.build(model.mod, target=Target("c", mcpu=mcpu))
    assert exe.target == f"c -mcpu={mcpu}"
    assert exe.required_features == mcpu_features(mcpu)
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    missing = sorted(exe.required_features - host_features())
    if missing:
        with pytest.raises(TargetError, match=f"lacks: {', '.join(missing)}"):
            kiln.load(path)
        with pytest.raises(TargetError, match="lacks"):
            exe(*model.inputs)
        return
    loaded = kiln.load(path)
    assert loaded.target == exe.target and loaded.required_features == exe.required_features
    np.testing.assert_allclose(loaded(*model.inputs), model.reference(*model.inputs),
                               rtol=1e-4, atol=1e-5)


def test_gpu_and_npu_targets_are_refused_by_build():
    model = models.mlp(batch=1, sizes=(8, 4))
    for kind in ("cuda", "npu", "opencl"):
        with pytest.raises(kiln.KilnError, match=f"target '{kind}' is not supported yet"):
            kiln.build(model.mod, target=kind)
    with pytest.raises(kiln.TargetError):
        kiln.build(model.mod, target=Target("cuda"))
