"""The cached launch path (``triton_kernels/_launch.py``) runs the variant Triton would pick, and falls back.

No GPU: Triton's runtime runs in full against a stand-in driver modelled as an sm_90 device, and a compile
that returns a stand-in kernel whose launch only counts. With ``_launch.VERIFY`` every cached launch
re-derives Triton's own variant key and raises where the cached variant differs, over the GDN launchers
at random lengths, batch mixes, head dims and strided inputs.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from _gdn_check import empty_chunk_inputs

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="Triton's compiled-launch path; the interpreter tree runs kernels instead")


@pytest.fixture(params=[False, True], ids=["plan-off", "plan-on"])
def stub_device(monkeypatch, request):
    """The launches stubbed (``gdn/launch_stub.py``, VERIFY on); with ``plan-on`` gdn_chunk goes through its
    plans (``gdn/plan.py``), whose launches VERIFY checks too."""
    from torch_aura.triton_kernels.gdn import launch_stub, plan

    monkeypatch.setattr(plan, "ENABLED", request.param)
    with launch_stub.stubbed(setattr=monkeypatch.setattr):
        yield


def _chunk(B, T, H, HV, K, V, cu=None, dtype=torch.bfloat16, strided=False, h0=True, state_v_first=False):
    from torch_aura.triton_kernels.gdn import chunk

    q, k, v, g, beta, state, cu_t, _ = empty_chunk_inputs(B, T, H, HV, K, V, cu, dtype, strided, h0, state_v_first,
                                                          pad=16)
    chunk.gdn_chunk(q, k, v, g, beta, None, state, cu_t, None, True, state_v_first)


def _stages(B, T, H, HV, K, V, h0=True, state_v_first=False):
    """The stage ops fwd_h then fwd_o (h's layout follows ``state_v_first``) over B x T tokens."""
    from torch_aura.triton_kernels.gdn import chunk

    k, q = torch.empty(B, T, H, K, dtype=torch.bfloat16), torch.empty(B, T, H, K, dtype=torch.bfloat16)
    w, u = torch.empty(B, T, HV, K, dtype=torch.bfloat16), torch.empty(B, T, HV, V, dtype=torch.bfloat16)
    g_cum = torch.empty(B, T, HV)
    state = torch.zeros(B, HV, *((V, K) if state_v_first else (K, V))) if h0 else None
    h, v_new, _ = chunk.gdn_fwd_h(k, w, u, g_cum, state, None, None, state_v_first)
    chunk.gdn_fwd_o(q, k, v_new, h, g_cum, None, None, None, state_v_first)


def test_cached_launches_run_the_variant_triton_derives(stub_device):
    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import recurrent

    rng = random.Random(38)
    for _ in range(12):
        H, K, V = rng.choice(((2, 128, 128), (1, 100, 48), (3, 64, 80)))
        HV = H * rng.choice((1, 2))
        B, T = rng.choice((1, 2, 3)), rng.randint(1, 3000)
        # the state's layout and presence change strides the launchers pass as ints (== 1 is specialised)
        flags = dict(h0=rng.random() < 0.7, state_v_first=rng.random() < 0.5)
        _chunk(B, T, H, HV, K, V, strided=rng.random() < 0.5, **flags)
        lengths = [rng.choice((0, 1, rng.randint(1, 64), rng.randint(65, 2000))) for _ in range(rng.randint(1, 5))]
        lengths[-1] += sum(lengths) == 0
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        _chunk(1, cu[-1], H, HV, K, V, cu, **flags)
        _stages(B, T, H, HV, K, V, **flags)
        P = rng.randint(4, 40)
        q = torch.empty(B, 1, H, K, dtype=torch.bfloat16)
        sd = (V, K) if flags["state_v_first"] else (K, V)
        recurrent.gdn_recurrent(q, torch.empty_like(q), torch.empty(B, 1, HV, V, dtype=torch.bfloat16),
                                torch.empty(B, 1, HV), torch.empty(B, 1, HV), torch.zeros(P, HV, *sd),
                                torch.randperm(P)[:B].to(torch.int32), None, None, True, flags["state_v_first"])
    assert _launch._cache, "no launch was cached"


def test_repeat_calls_skip_triton_and_fallbacks_launch(stub_device, monkeypatch):
    """A second call of one shape launches every kernel through the cache, not through ``JITFunction.run``;
    with the path disabled (an unchecked Triton version) or a launch hook installed, every launch goes
    through Triton and still runs."""
    from triton.runtime.jit import JITFunction

    from torch_aura.triton_kernels import _launch

    runs = []
    real_run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **kw: (runs.append(self.__name__), real_run(self, *a, **kw))[1])
    _chunk(1, 4096, 2, 4, 128, 128)
    first = len(runs)
    assert first >= 4
    _chunk(1, 4096, 2, 4, 128, 128)  # plan-on: replayed
    _chunk(1, 3000, 2, 4, 128, 128)  # a new length: same variants
    assert len(runs) == first, runs[first:]
    monkeypatch.setattr(_launch, "ENABLED", False)
    _chunk(1, 4096, 2, 4, 128, 128)
    assert len(runs) == 2 * first
    monkeypatch.setattr(_launch, "ENABLED", True)
    from triton import knobs

    hook_calls = []
    knobs.runtime.launch_enter_hook.add(hook_calls.append)
    try:
        _chunk(1, 4096, 2, 4, 128, 128)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook_calls.append)
    assert len(runs) == 3 * first


def _same(a, b) -> bool:
    """One argument of two launches: the same tensor, or equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return type(a) is type(b) and a == b


def test_cached_launches_hand_the_c_launch_what_tritons_launcher_does(monkeypatch):
    """A cached launch of a variant without scratch calls Triton 3.6's C ``launch`` itself, skipping the launcher
    object's ``__call__``, and hands it every argument that object hands it given the same launch (the stub records
    both); a variant with in-kernel descriptors still goes through the object, which asks the allocator for the
    scratch. Against Triton's own first launch (``JITFunction.run``) only the hooks differ: Triton hands its idle
    chains, which the C launch calls to no effect, the cached launch None."""
    from triton.knobs import HookChain

    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import launch_stub, plan, recurrent

    monkeypatch.setattr(plan, "ENABLED", False)  # the launchers' own launches (plans: test_gdn_plan.py)
    with launch_stub.stubbed([], setattr=monkeypatch.setattr):
        launched = launch_stub._workspace["c_launches"]
        through_object = []
        real_call = launch_stub._Launcher.__call__

        def launcher_call(self, *a):
            through_object.append(self.name)
            return real_call(self, *a)
        monkeypatch.setattr(launch_stub._Launcher, "__call__", launcher_call)
        pairs, made, seen = [], [], [0]

        def relaunch(kernel, grid, args, kwargs, entry):  # _launch.recorder: after each launch
            if entry is None or not any(e is entry for e in made):  # Triton's own first launch made the entry
                made.append(entry)
            else:
                call, _, tail, _, run, function, packed = entry
                assert len(through_object) - seen[0] == (call is run), kernel.__name__  # direct: no __call__
                ours, n = launched[-1], len(grid)
                run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _launch.current()[2], function,
                    packed, None, None, None, *args, *tail)  # what the cached launch handed the launcher object before
                pairs.append((call is not run, run.global_scratch_size, ours, launched[-1]))
            seen[0] = len(through_object)
        monkeypatch.setattr(_launch, "recorder", relaunch)

        P, B, H, HV, K, V = 6, 3, 2, 4, 128, 128
        q = torch.empty(B, 1, H, K, dtype=torch.bfloat16)
        args = (q, torch.empty_like(q), torch.empty(B, 1, HV, V, dtype=torch.bfloat16), torch.empty(B, 1, HV),
                torch.empty(B, 1, HV), torch.zeros(P, HV, K, V), torch.randperm(P)[:B].to(torch.int32), None, None,
                True, False)
        for _ in range(2):
            recurrent.gdn_recurrent(*args)
        first, cached = launched[0], pairs[0][2]
        assert first[0] == cached[0] == "_gdn_recurrent_kernel" and len(first[1]) == len(cached[1])
        for i, (a, b) in enumerate(zip(first[1], cached[1])):
            if i in (11, 12):  # the hooks
                assert type(a) is HookChain and not a.calls and b is None
            elif i != 21:  # o: each call's own
                assert _same(a, b), (i, a, b)
        for T in (300, 4096, 8192):
            for _ in range(2):
                _chunk(1, T, H, HV, K, V)
        assert pairs
        for direct, scratch, (name, ours), (theirs_name, theirs) in pairs:
            assert name == theirs_name and len(ours) == len(theirs)
            assert direct == (not scratch), (name, scratch)
            for i, (a, b) in enumerate(zip(ours, theirs)):
                if i == 7 and scratch:  # the allocator's scratch, asked for at each launch
                    assert a.numel() == b.numel() == ours[0] * ours[1] * ours[2] * scratch
                else:
                    assert _same(a, b), (name, i, a, b)
        assert any(p[0] for p in pairs) and not all(p[0] for p in pairs), "no variant with scratch, or none without"


def test_compile_only_readies_every_variant_and_launches_nothing(monkeypatch):
    """``_launch.compile_only`` (the tuners' other bucket side): a gdn_chunk inside it compiles each variant a
    real call then runs, launching none; the real call after it compiles nothing more."""
    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import launch_stub, plan
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(plan, "ENABLED", False)
    log, compiles = [], []
    with launch_stub.stubbed(log, setattr=monkeypatch.setattr):
        stub = JITFunction._do_compile
        monkeypatch.setattr(JITFunction, "_do_compile", lambda self, *a: compiles.append(self.__name__) or stub(self, *a))
        with _launch.compile_only():
            _chunk(1, 300, 2, 4, 128, 128)
        readied = list(compiles)
        assert readied and not [e for e in log if e[0] == "launch"]
        _chunk(1, 300, 2, 4, 128, 128)
        assert compiles == readied and [e for e in log if e[0] == "launch"]
