"""GDN compiles once per plan, never per prompt length (issue 38).

Triton compiles a kernel once per *variant*: its constexprs, launch options and the specialisation
of every other argument (an int is specialised on ``== 1`` and ``% 16 == 0``, a pointer on its
alignment). Here the real launchers run on CPU tensors, modelled as an sm_90 GPU of 132 SMs, with
every kernel swapped for a recorder that asks Triton's own argument binder for the sm_90 target
which variant the launch would run, and launches nothing. After a warm-up that visits every plan
(serial and sequence-parallel pass, the pass beside w/u, both parallelism buckets, fixed length and
varlen), 20 random prompt lengths and batch mixes must add no variant and no tuning key.
"""

from __future__ import annotations

import contextlib
import os
import random

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="asks the compiler's binder; the interpreter tree runs kernels instead")

H, HV, K, V = 2, 4, 128, 128  # a tensor-parallel shard's heads: every plan of the pass is reachable
SMS = 132


class _Recorder:
    """Stands in for a ``JITFunction``: ``kernel[grid](*args, **kw)`` records the variant Triton would
    compile for sm_90 (its cache key: specialisation and options) and launches nothing."""

    def __init__(self, fn, variants):
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import CUDABackend
        from triton.runtime.jit import create_function_from_signature

        self.fn, self.variants = fn, variants
        self.bind = create_function_from_signature(fn.signature, fn.params, CUDABackend(GPUTarget("cuda", 90, 32)))

    def __getitem__(self, grid):
        return self._record

    def _record(self, *args, **kwargs):
        _, specialization, options = self.bind(*args, **kwargs)
        self.variants.add((self.fn.__name__, repr(specialization), repr(sorted(options.items()))))


@pytest.fixture(params=[False, True], ids=["plan-off", "plan-on"])
def recorded(monkeypatch, request):
    """Patch the GDN launchers onto recorders; returns ``(variants, tuning keys)``, both sets. Nothing
    is computed, so the suite's NaN poisoning of allocations (~1 GB per call here) is left out. With
    ``plan-on`` gdn_chunk goes through ``gdn/plan.py``, which plans nothing launched through stand-ins:
    every call runs the launchers."""
    real = torch.empty.__globals__  # the poisoning wrapper's module (tests/conftest.py) keeps the originals
    monkeypatch.setattr(torch, "empty", real.get("_real_empty", torch.empty))
    monkeypatch.setattr(torch, "empty_like", real.get("_real_empty_like", torch.empty_like))
    from torch_aura.triton_kernels import _tune
    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import _common, chunk, conv, plan, prep, recurrent, segments, state_pass

    monkeypatch.setattr(plan, "ENABLED", request.param)
    _launch.clear()
    variants, keys = set(), set()
    for mod in (chunk, prep, state_pass, segments, recurrent, conv):
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                monkeypatch.setattr(mod, name, _Recorder(obj, variants))
    hopper = _Recorder(state_pass._hopper_pass(), variants)
    monkeypatch.setattr(state_pass, "_hopper_pass", lambda: hopper)
    # an H100 / H200: TMA copies, the Gluon pass, 132 SMs for every plan decision
    monkeypatch.setattr(_common, "_tma_ready", lambda *xs: True)
    monkeypatch.setattr(state_pass, "_hopper_pass_ready", lambda k, tma_ready, with_o: with_o and tma_ready)
    monkeypatch.setattr(_common, "sm_count", lambda device: SMS)
    plan = segments._segment_plan
    monkeypatch.setattr(segments, "_segment_plan", lambda device, *a: plan(torch.device("cuda"), *a))
    monkeypatch.setattr(state_pass, "_beside", lambda device, first: (first(), contextlib.nullcontext())[1])

    def first_config(self, key, launch, device):
        keys.add((self.name, key))
        launch(self.configs[0])

    monkeypatch.setattr(_tune.Tuner, "__call__", first_config)
    return variants, keys


def _chunk_call(B, T, cu=None, dtype=torch.bfloat16):
    """gdn_chunk on B x T tokens (varlen: B = 1 and ``cu`` offsets); nothing is computed."""
    from torch_aura.triton_kernels.gdn import chunk

    q = torch.empty(B, T, H, K, dtype=dtype)
    v = torch.empty(B, T, HV, V, dtype=dtype)
    g, beta = torch.empty(B, T, HV), torch.empty(B, T, HV)
    N = B if cu is None else len(cu) - 1
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    chunk.gdn_chunk(q, torch.empty_like(q), v, g, beta, None, torch.zeros(N, HV, K, V), cu_t, None, True, False)


def _recurrent_call(B, T, P):
    from torch_aura.triton_kernels.gdn import recurrent

    q = torch.empty(B, T, H, K, dtype=torch.bfloat16)
    v = torch.empty(B, T, HV, V, dtype=torch.bfloat16)
    rows = torch.randperm(P)[:B].to(torch.int32)
    recurrent.gdn_recurrent(q, torch.empty_like(q), v, torch.zeros(B, T, HV), torch.zeros(B, T, HV),
                            torch.zeros(P, HV, K, V), rows, None, None, True, False)


C_CONV, W_CONV = 2 * H * K + HV * V, 4  # the conv runs over q | k | v of these heads; Qwen3-Next's 4 taps


def _conv_call(B, T, cu=None, pad=0):
    """causal_conv1d over B x T tokens (varlen: B = 1 and ``cu`` offsets) with a state, as a prefill runs it;
    ``pad`` > 0 reads the channels out of a wider projection (row stride (C + pad) * T: odd pads make its
    divisibility by 16 follow T)."""
    from torch_aura.triton_kernels.gdn import conv

    N = B if cu is None else len(cu) - 1
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    x = torch.empty(B, T, C_CONV + pad, dtype=torch.bfloat16)[..., :C_CONV]
    conv.causal_conv1d(x, torch.empty(C_CONV, W_CONV),
                       torch.empty(C_CONV, dtype=torch.bfloat16), torch.zeros(N, C_CONV, W_CONV), cu_t, "silu")


def _conv_update_call(B, L, P, pad=0):
    from torch_aura.triton_kernels.gdn import conv

    x = torch.empty(B, L, C_CONV + pad, dtype=torch.bfloat16)[..., :C_CONV]
    conv.causal_conv1d_update(x[:, 0] if L == 1 else x, torch.zeros(P, C_CONV, W_CONV), torch.empty(C_CONV, W_CONV),
                              torch.empty(C_CONV, dtype=torch.bfloat16), "silu", torch.randperm(P)[:B].to(torch.int32))


def _varlen(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def test_new_prompt_lengths_add_no_variant_and_no_tuning_key(recorded):
    from torch_aura.triton_kernels.gdn import warmup

    variants, keys = recorded
    # warm-up: the calls of torch_aura.gdn_warmup, which visit every plan of this head configuration
    for B, T, lengths in warmup.chunk_calls(HV, SMS):
        _chunk_call(B, T, None if lengths is None else _varlen(lengths))
    for B in warmup.recurrent_batches(HV, V, SMS):
        _recurrent_call(B, 1, B + 3)
    warm_variants, warm_keys = set(variants), set(keys)
    # per head config and dtype, the plans: solve and w/u per layout (fixed, varlen) and parallelism
    # bucket (w/u also per copy path: off beside the pass), the segment summary per layout, the pass
    # per layout, serial / sequence-parallel and one wave or not at 32-wide V tiles
    assert len(warm_keys) <= 20 and len(warm_variants) <= 32, (sorted(map(str, warm_keys)), len(warm_variants))

    rng = random.Random(38)
    for _ in range(20):
        B, T = rng.choice((1, 1, 2, 3, 4, 7, 40)), rng.randint(1, 20000)
        _chunk_call(B, T)
        lengths = [rng.choice((0, 1, rng.randint(1, 64), rng.randint(65, 5000))) for _ in range(rng.randint(1, 9))]
        lengths[-1] += sum(lengths) == 0  # at least one token in the packed row
        _chunk_call(1, sum(lengths), _varlen(lengths))
        _recurrent_call(rng.randint(1, 64), rng.choice((1, 1, 2, 5)), rng.randint(64, 300))
    new = sorted(variants - warm_variants)
    assert not new, "variants compiled only at new lengths:\n" + "\n".join(v[0] + " " + v[1] for v in new[:4])
    assert keys == warm_keys, f"tuning keys met only at new lengths: {sorted(keys - warm_keys)}"


@pytest.mark.parametrize("B,T", [(1, 300), (1, 8192), (8, 300)], ids=["beside-w_u", "sequence-parallel", "serial"])
def test_gdn_chunk_leaves_no_reference_cycle(recorded, B, T):
    """Every buffer of a call is freed when the call returns, not when the garbage collector runs: a
    cycle (a launch closure stored in the container it refers to) kept each GDN layer's prep buffers
    alive through a whole forward and raised a model's peak memory."""
    import gc

    _chunk_call(B, T)  # imports and first-use caches outside the count
    gc.collect()
    gc.disable()
    try:
        _chunk_call(B, T)
        assert gc.collect() == 0, "gdn_chunk left objects only the garbage collector can free"
    finally:
        gc.enable()


@pytest.mark.parametrize("prefill", ["taps", "window"])
@pytest.mark.parametrize("pad", [0, 5])
def test_conv_new_lengths_add_no_variant(recorded, monkeypatch, pad, prefill):
    """The front end's kernels: one variant each for fixed-length and packed prefills (either prefill kernel)
    and for the decode step, whatever the prompt lengths, batch mix, pool size or tokens per step, on contiguous
    inputs and on channel slices of a wider projection."""
    from torch_aura.triton_kernels.gdn import conv

    monkeypatch.setattr(conv, "PREFILL_KERNEL", prefill)
    kernel = {"taps": "_causal_conv1d_kernel", "window": "_causal_conv1d_window_kernel"}[prefill]
    variants, _ = recorded
    _conv_call(1, 100, pad=pad)
    _conv_call(1, 100, [0, 30, 30, 100], pad=pad)
    _conv_update_call(2, 1, 8, pad=pad)
    warm = set(variants)
    # fixed and packed for the conv and the state pass, one decode step
    assert sorted(v[0] for v in warm) == sorted([kernel] * 2 + ["_conv_state_kernel"] * 2
                                                + ["_causal_conv1d_update_kernel"]), warm
    rng = random.Random(40)
    for _ in range(20):
        _conv_call(rng.choice((1, 2, 3, 7, 40)), rng.randint(1, 20000), pad=pad)
        lengths = [rng.choice((0, 1, rng.randint(1, 64), rng.randint(65, 5000))) for _ in range(rng.randint(1, 9))]
        lengths[-1] += sum(lengths) == 0
        _conv_call(1, sum(lengths), _varlen(lengths), pad=pad)
        _conv_update_call(rng.randint(1, 64), rng.choice((1, 1, 2, 5)), rng.randint(64, 300), pad=pad)
    new = sorted(variants - warm)
    assert not new, "variants compiled only at new lengths:\n" + "\n".join(v[0] + " " + v[1] for v in new[:4])
