"""from_exported_program: parameters and buffers, nested inputs and outputs, dynamic dims and
their exported ranges, dtypes, spans, unsupported operators, .pt2 files and the CLI."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln.cli import main as cli_main
from kiln.frontend.torch import from_exported_program, from_pt2
from kiln.ir import ArgumentError, KilnError, UnsupportedOperatorError


class Nested(torch.nn.Module):
    """A linear + batch norm with nested inputs (a dict) and outputs (a dict of a tuple)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x, extra):
        y = self.bn(self.lin(x)).relu()
        return {"y": y, "pair": (y.sum(-1), extra["scale"] * 2.0)}


def _export(module, args, dynamic_shapes=None):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(module.eval(), args, dynamic_shapes=dynamic_shapes)


def _nested_program():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=64)
    args = (torch.randn(3, 8), {"scale": torch.randn(3)})
    module = Nested().eval()
    ep = _export(module, args, ({0: batch}, {"scale": {0: batch}}))
    return module, ep


def test_nested_structure_params_and_dynamic_batch() -> None:
    module, ep = _nested_program()
    mod, params = from_exported_program(ep)
    main = mod["main"]
    # user inputs first, then parameters and buffers (returned in params)
    assert [p.name_hint for p in main.params[:2]] == ["x", "extra_scale"]
    assert {"p_lin_weight", "p_lin_bias", "b_bn_running_mean", "b_bn_running_var"} <= set(params)
    exe = kiln.build(mod, params=params)
    for n in (1, 3, 7, 64):
        x, s = torch.randn(n, 8), torch.randn(n)
        out = exe(x, {"scale": s})
        with torch.no_grad():
            ref = module(x, {"scale": s})
        assert set(out) == {"y", "pair"} and isinstance(out["pair"], tuple)
        np.testing.assert_allclose(out["y"], ref["y"].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["pair"][0], ref["pair"][0].numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["pair"][1], ref["pair"][1].numpy(), rtol=1e-6)


def test_exported_range_is_checked_at_run_time() -> None:
    _, ep = _nested_program()
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, params=params)
    with pytest.raises(ArgumentError, match=r"input 'x' axis 0 has size 65, outside the range "
                                            r"\[1, 64\]"):
        exe(torch.randn(65, 8), {"scale": torch.randn(65)})
    # the structure is checked too, naming the place
    with pytest.raises(ArgumentError, match="keys"):
        exe(torch.randn(2, 8), {"other": torch.randn(2)})


def test_bound_params_and_save_load_keep_structure_and_ranges(tmp_path) -> None:
    module, ep = _nested_program()
    mod, params = from_exported_program(ep, bind_params=True)
    assert params == {} and len(mod["main"].params) == 2
    path = str(tmp_path / "m.kiln")
    kiln.build(mod).save(path)
    exe = kiln.load(path)
    x, s = torch.randn(5, 8), torch.randn(5)
    out = exe(x, {"scale": s})
    with torch.no_grad():
        ref = module(x, {"scale": s})
    np.testing.assert_allclose(out["y"], ref["y"].numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ArgumentError, match="outside the range"):
        exe(torch.randn(100, 8), {"scale": torch.randn(100)})


class Casts(torch.nn.Module):
    def forward(self, h, b, i, m):
        # float16 and bfloat16 math, integer and bool inputs, promotion to float32
        return (h * 2 + 1, b.float() * 0.5, (i * 3 + 1) // 2, m & (i > 0), (h.float() + i))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_dtypes(dtype) -> None:
    torch.manual_seed(0)
    args = (torch.randn(4, 3).half(), torch.randn(4, 3).bfloat16(),
            torch.randint(-5, 5, (4, 3), dtype=dtype), torch.rand(4, 3) > 0.5)
    ep = _export(Casts(), args)
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, params=params)
    from kiln.frontend.torch.tensors import to_kiln

    got = exe(*[to_kiln(a) for a in args])
    want = Casts()(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w.dtype == torch.bfloat16:
            assert str(g.dtype) == "bfloat16"
            w = w.float()
            g = g.astype(np.float32)
        assert g.dtype == w.numpy().dtype
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-3)


def test_spans_name_the_fx_node_and_aten_overload() -> None:
    _, ep = _nested_program()
    mod, _ = from_exported_program(ep)
    spans = set()
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            span = getattr(b.value, "span", None)
            if span is not None:
                spans.update((n.name, n.op_type) for n in span.nodes)
    assert ("relu", "aten.relu.default") in spans
    assert ("addmm", "aten.addmm.default") in spans


def test_unsupported_operators_are_listed_at_once() -> None:
    class Unsupported(torch.nn.Module):
        def forward(self, x, y):
            return torch.gcd(x, y) + torch.lcm(x, y) + torch.gcd(x * 2, y)

    ep = _export(Unsupported(), (torch.tensor([4, 6, 8]), torch.tensor([2, 3, 4])))
    with pytest.raises(UnsupportedOperatorError) as err:
        from_exported_program(ep)
    msg = str(err.value)
    assert "2 operator(s)" in msg
    assert "aten.gcd.default: nodes gcd, gcd_1" in msg
    assert "aten.lcm.default: nodes lcm" in msg


def test_not_an_exported_program() -> None:
    with pytest.raises(KilnError, match="ExportedProgram"):
        from_exported_program(torch.nn.Linear(2, 2))


class Stateful(torch.nn.Module):
    """Updates two buffers (a step counter, a running mean) and its second input in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("avg", torch.zeros(4))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, acc):
        self.steps += 1
        self.avg.mul_(0.9).add_(0.1 * x.mean(0))
        acc.add_(x.sum(0))
        return self.lin(x) + self.avg, self.steps * 2


class KVCache(torch.nn.Module):
    """Writes each call's row into a cache buffer at a position given as a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(6, 3))

    def forward(self, row, pos):
        self.cache.index_copy_(0, pos, row)
        return self.cache.cumsum(0)


@pytest.mark.parametrize("target, bind", [("c", False), ("c", True), ("opencl", True)])
def test_buffer_and_input_updates_are_kept_and_written_back(target, bind, tmp_path) -> None:
    """Buffers the program updates are the executable's state (also with bind_params, also
    after save and load); an updated input is written into the caller's numpy array or torch
    tensor; three calls in a row match the eager module's."""
    ep = _export(Stateful(), (torch.randn(3, 4), torch.zeros(4)))
    mod, params = from_exported_program(ep, bind_params=bind)
    assert {"b_steps", "b_avg"} <= set(params)
    exe = kiln.build(mod, target, params=params)
    ref = Stateful()
    ref.load_state_dict(ep.state_dict)
    acc, acc_ref = np.zeros(4, np.float32), torch.zeros(4)
    for _ in range(3):
        x = torch.randn(3, 4)
        got, want = exe(x.numpy(), acc), ref(x, acc_ref)
        np.testing.assert_allclose(got[0], want[0].detach().numpy(), rtol=1e-5, atol=1e-6)
        assert int(got[1]) == int(want[1])
        np.testing.assert_allclose(acc, acc_ref.numpy(), rtol=1e-6)
    exe.save(tmp_path / "m.kiln")
    loaded = kiln.load(tmp_path / "m.kiln")
    for run in (exe, loaded):  # both continue from the saved state
        x, acc_t = torch.randn(3, 4), torch.ones(4)
        got = run(x, acc_t)
        assert int(got[1]) == 8
        np.testing.assert_allclose(acc_t.numpy(), 1 + x.sum(0).numpy(), rtol=1e-6)
    want = ref(x, torch.ones(4))
    np.testing.assert_allclose(got[0], want[0].detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_kv_cache_buffer_fills_call_after_call() -> None:
    ep = _export(KVCache(), (torch.randn(1, 3), torch.tensor([0])))
    mod, params = from_exported_program(ep, bind_params=True)
    exe = kiln.build(mod, "c", params=params)
    ref = KVCache()
    for pos in (0, 3, 1, 3):
        row, p = torch.randn(1, 3), torch.tensor([pos])
        np.testing.assert_allclose(exe(row, p), ref(row, p).numpy(), rtol=1e-6, atol=1e-6)


def test_an_updated_input_must_be_writable() -> None:
    ep = _export(Stateful(), (torch.randn(3, 4), torch.zeros(4)))
    mod, params = from_exported_program(ep, bind_params=True)
    exe = kiln.build(mod, "c", params=params)
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ArgumentError, match="'acc' is updated in place .* read-only"):
        exe(np.ones((3, 4), np.float32), frozen)
    with pytest.raises(ArgumentError, match="'acc' is updated in place .* not a list"):
        exe(np.ones((3, 4), np.float32), [0.0] * 4)
    # the failed calls changed no state: the step counter starts at 1
    assert int(exe(np.ones((3, 4), np.float32), np.zeros(4, np.float32))[1]) == 2


def test_pt2_file_and_cli_compile(tmp_path, capsys) -> None:
    module, ep = _nested_program()
    path = str(tmp_path / "model.pt2")
    torch.export.save(ep, path)
    mod, params = from_pt2(path)
    assert set(params) >= {"p_lin_weight"}
    out_path = str(tmp_path / "m.kiln")
    assert cli_main(["compile", path, "-o", out_path]) == 0
    assert "compiled" in capsys.readouterr().out
    exe = kiln.load(out_path)
    x, s = torch.randn(6, 8), torch.randn(6)
    with torch.no_grad():
        ref = module(x, {"scale": s})
    np.testing.assert_allclose(exe(x, {"scale": s})["y"], ref["y"].numpy(), rtol=1e-5,
                               atol=1e-6)
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(kiln.ir.ModelFormatError, match="bad.pt2"):
        from_pt2(str(bad))


def test_kiln_imports_without_torch() -> None:
    """``import kiln`` neither needs nor imports torch (the frontend imports it lazily)."""
    code = ("import sys; sys.modules['torch'] = None; import kiln, kiln.frontend.torch; "
            "print(sys.modules['torch'] is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "True"
