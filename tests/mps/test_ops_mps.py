"""Every op on device="mps" through the Metal kernels vs the reference on CPU: the shared samples
(odd sizes, strided views, GQA, paged, varlen, empty sequences), torch.library.opcheck, and the
encoder regression of pytorch/pytorch#163721 (every op twice, interleaved with stock torch ops
on the same stream)."""

import pytest
import torch

import _util
from _samples import all_samples
from torch_aura import reference
from torch_aura._schema import OPS

SAMPLES = all_samples()
CASES = [(name, s) for name in sorted(OPS) for s in SAMPLES[name]("cpu")]
IDS = [f"{name}-{s.id}" for name, s in CASES]


def _to(args, device):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def _results(name, args, out):
    schema = getattr(torch.ops.aura, name).default._schema
    outs = [] if out is None else list(out) if isinstance(out, tuple) else [out]
    return outs + [v for a, v in zip(schema.arguments, args)
                   if a.alias_info is not None and a.alias_info.is_write and v is not None]  # Tensor(a!)? given


def _reference(name, args):
    args = _to(args, "cpu")
    return _results(name, args, getattr(reference.FAMILIES[OPS[name].family], name)(*args))


def _mps(name, args):
    args = _to(args, "mps")
    out = getattr(torch.ops.aura, name)(*args)
    torch.mps.synchronize()
    return [t.cpu() for t in _results(name, args, out)]


def _compare(name, got, ref, args):
    for i, (g, r) in enumerate(zip(got, ref)):
        label = f"{name}[{i}]"
        if not g.is_floating_point():
            if name in ("aura_encode", "aura_write_cache") or (name == "aura_append" and i in (0, 2)):
                # aura-format.md §11.6: an index may differ only at a boundary tie, by one
                from torch_aura.reference.aura import unpack_codes

                # the bits argument (aura_append's results: k_codes, k_norms, v_codes, v_norms, seq_lens)
                bits = args[{"aura_encode": 3, "aura_write_cache": 6}.get(name, 11 + i // 2)]
                D = args[0].shape[-1]
                diff = (unpack_codes(g, bits, D) - unpack_codes(r, bits, D)).abs()
                assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 0.01, label
                continue
            assert torch.equal(g, r), label
        elif g.dtype == torch.float32:
            _util.assert_max_rel(label, g, r)
        else:
            _util.assert_close(label, g.float(), r.float(), _util.RATIO[g.dtype])


def test_embedded_shaders_compile_without_warnings():
    # First in this file, so the host's first use compiles every library here (encode.mm turns
    # compiler warnings into Python warnings).
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in sorted(OPS):
            sample = SAMPLES[name]("cpu")[0]
            getattr(torch.ops.aura, name)(*_to(sample.args, "mps"))
        torch.mps.synchronize()
    noisy = [str(w.message) for w in caught if "compiled with warnings" in str(w.message)]
    assert not noisy, noisy


@pytest.mark.parametrize("name,sample", CASES, ids=IDS)
def test_op_on_mps_matches_the_reference(name, sample):
    _compare(name, _mps(name, sample.args), _reference(name, sample.args), sample.args)


@pytest.mark.parametrize("name,sample", CASES, ids=IDS)
def test_opcheck_on_mps(name, sample):
    torch.library.opcheck(getattr(torch.ops.aura, name).default, _to(sample.args, "mps"))


def test_encoder_regression_every_op_twice_between_stock_ops():
    # pytorch/pytorch#163721: opening a second encoder while the stream has one aborts. Stock ops
    # leave the stream's encoder open; ours must reuse it, twice in a row, and stay correct.
    x = torch.randn(1024, device="mps")
    for name, sample in CASES:
        args = _to(sample.args, "mps")
        y = (x * 2).sum()
        first = getattr(torch.ops.aura, name)(*_to(sample.args, "mps"))
        z = x.exp().mean()
        second = getattr(torch.ops.aura, name)(*args)
        torch.mps.synchronize()
        assert torch.isfinite(y) and torch.isfinite(z), name
        a = _results(name, args, first)
        b = _results(name, args, second)
        # in-place ops differ by design
        if name not in ("gdn_recurrent", "aura_write_cache", "aura_append", "flash_decode_out"):
            for u, w in zip(a, b):
                assert torch.equal(u.cpu().nan_to_num(), w.cpu().nan_to_num()), name


def test_status_says_emulator_verified():
    import torch_aura

    for name, row in torch_aura.backends.status().items():
        assert row["mps"] == "kernel (mps, emulator-verified)", (name, row["mps"])
