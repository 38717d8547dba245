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


def test_recurrent_memo_checks_again_when_any_fact_changes(monkeypatch):
    """``recurrent._geometry_of`` skips the checks for a call whose key passed before: its key holds every fact of
    each tensor that the checks or the launch key read (shape, strides, dtype, device, 16-byte alignment) and every
    other argument, so a call that changes any one of them runs the checks again (a bad one raises what the
    unremembered call raises), and one that changes none runs no check."""
    from torch_aura._checks import gdn as gdn_checks
    from torch_aura.triton_kernels.gdn import launch_stub, recurrent

    checks = []
    real = gdn_checks.gdn_recurrent
    monkeypatch.setattr(gdn_checks, "gdn_recurrent", lambda *a: checks.append(a) or real(*a))
    B, H, HV, K, P = 3, 2, 4, 32, 6
    shapes = [(B, 1, H, K), (B, 1, H, K), (B, 1, HV, K), (B, 1, HV), (B, 1, HV), (P, HV, K, K), (B,)]
    dtypes = [torch.bfloat16] * 3 + [torch.float32] * 3 + [torch.int32]

    def good():
        return [torch.zeros(s, dtype=d) for s, d in zip(shapes, dtypes)] + [None, None, True, False]

    def outcome(fn, args):  # a geometry without its native-launch holder (per geometry, not a value)
        try:
            return fn(*args)[:-1]
        except ValueError as e:
            return str(e)

    def misaligned(x):
        y = torch.zeros(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)
        assert y.stride() == x.stride() and y.data_ptr() & 15
        return y

    changes = {"shape": lambda x: torch.zeros((x.shape[0] + 1, *x.shape[1:]), dtype=x.dtype),
               "strides": lambda x: torch.zeros((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype)[::2],
               "dtype": lambda x: x.to(torch.int64 if x.dtype == torch.int32 else torch.float16),
               "device": lambda x: x.to("meta"), "alignment": misaligned}
    variants = [(f"{name} of argument {i}", i, change) for i in range(7) for name, change in changes.items()]
    variants += [("cu_seqlens", 7, lambda _: torch.tensor([0, B], dtype=torch.int32)),
                 ("scale", 8, lambda _: 0.5), ("use_qk_l2norm", 9, lambda _: False),
                 ("state_v_first", 10, lambda _: True)]
    with launch_stub.stubbed(setattr=monkeypatch.setattr):
        recurrent._geometry_of.forget()
        first = recurrent._geometry_of(*good())
        for what, i, change in variants:
            assert recurrent._geometry_of(*good()) == first and len(checks) == 1, what  # other data: no check
            args = good()
            args[i] = change(args[i])
            got = outcome(recurrent._geometry_of, args)
            assert len(checks) == 2, f"{what}: served from the memo without its checks"
            assert got == outcome(recurrent._geometry, args), what
            del checks[1:]


@pytest.mark.parametrize("debug", [None, "0", "1"])
def test_recurrent_checks_pool_rows_on_the_host_under_debug(monkeypatch, debug):
    """The launcher's host check of its rows (``debug_check_pool_rows``) runs when TORCH_AURA_DEBUG is on, read
    at each call, and at no other time: duplicate rows raise then, before the launch, and launch otherwise."""
    from torch_aura.triton_kernels.gdn import launch_stub, recurrent

    if debug is None:
        monkeypatch.delenv("TORCH_AURA_DEBUG", raising=False)
    else:
        monkeypatch.setenv("TORCH_AURA_DEBUG", debug)
    q = torch.zeros(2, 1, 1, 16, dtype=torch.bfloat16)
    args = (q, q, q, torch.zeros(2, 1, 1), torch.zeros(2, 1, 1), torch.zeros(4, 1, 16, 16))
    launched = []
    with launch_stub.stubbed(setattr=monkeypatch.setattr):
        monkeypatch.setattr(recurrent, "launch", lambda *a, **kw: launched.append(a))  # the host side only
        recurrent.gdn_recurrent(*args, torch.tensor([3, -1], dtype=torch.int32))
        duplicate = torch.tensor([1, 1], dtype=torch.int32)
        if debug == "1":
            with pytest.raises(ValueError, match=r"state_indices: expected distinct pool rows in \[0, 4\)"):
                recurrent.gdn_recurrent(*args, duplicate)
        else:
            recurrent.gdn_recurrent(*args, duplicate)
    assert len(launched) == (1 if debug == "1" else 2)


def test_the_first_prompt_past_the_bucket_edge_compiles_nothing_whatever_came_first(monkeypatch):
    """The prep kernels' many-chunks bucket (gdn.md §6.4): each new w/u variant's first launch also compiles the
    other side's config for the same arguments, not once per tuner key. A process whose first calls passed
    other dtypes (the e2e bench's adapter timing: fp32 beta) and which then serves a model (bf16 beta)
    compiles the model's many-chunks variant at its first few-chunks call, launching it never, and the first
    prompt past the edge compiles nothing (on the H200 it stalled 0.76-1.03 s)."""
    from triton.runtime.jit import JITFunction

    from torch_aura.triton_kernels import _tune
    from torch_aura.triton_kernels.gdn import chunk, launch_stub, plan, prep

    monkeypatch.setattr(plan, "ENABLED", False)
    monkeypatch.delenv("TORCH_AURA_TUNE", raising=False)
    tuner_call = _tune.Tuner.__call__

    class Table:  # w/u's two sides as the shipped H200 table has them (other variants), every other key its first
        def get(self, tuner, key):
            return tuner.configs[(3 if not key[4] else 0) if tuner is prep._W_U else 0]
    H, HV, K, V = 16, 32, 128, 128
    few, many = 300, (-(-prep.MANY_CHUNKS_PER_SM * launch_stub.SMS // HV) + 1) * 64  # one chunk past the edge

    def call(T, beta_dtype):
        q, k, v, g, beta, _, _, _ = empty_chunk_inputs(1, T, H, HV, K, V, h0=False)
        chunk.gdn_chunk(q, k, v, g, beta.to(beta_dtype), None, None, None, None, True, False)
    log, compiles = [], []
    with launch_stub.stubbed(log, setattr=monkeypatch.setattr):
        monkeypatch.setattr(_tune.Tuner, "__call__", tuner_call)  # the real tuner, over the table above
        monkeypatch.setattr(_tune, "tune_table", lambda device: Table())
        for tuner in plan.TUNERS:
            monkeypatch.setattr(tuner, "cache", {})
            monkeypatch.setattr(tuner, "_other", {})
        stub = JITFunction._do_compile
        monkeypatch.setattr(JITFunction, "_do_compile",
                            lambda self, *a: compiles.append((self.__name__, a[4].num_warps)) or stub(self, *a))
        assert prep.many_chunks(-(-many // 64), HV, torch.device("cpu")) and not prep.many_chunks(5, HV, None)
        call(few, torch.float32)
        call(many, torch.float32)
        start = len(compiles)
        call(few, torch.bfloat16)  # the model's first call: its own w/u variant and the other side's
        w_u = [w for name, w in compiles[start:] if name == "_gdn_recompute_w_u_kernel"]
        assert sorted(w_u) == [2, 4], compiles[start:]
        launches = [e for e in log if e[0] == "launch" and e[1] == "_gdn_recompute_w_u_kernel"]
        start = len(compiles)
        call(many, torch.bfloat16)
        assert compiles[start:] == [], "the first prompt past the bucket's edge compiled"
        assert len([e for e in log if e[0] == "launch" and e[1] == "_gdn_recompute_w_u_kernel"]) == len(launches) + 1


def test_a_sibling_that_fails_to_compile_warns_and_the_launch_runs(monkeypatch):
    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import launch_stub, plan

    monkeypatch.setattr(plan, "ENABLED", False)
    log = []
    with launch_stub.stubbed(log, setattr=monkeypatch.setattr):
        before = _launch.siblings(({"num_warps": 3},))  # not a power of two: Triton refuses it
        try:
            with pytest.warns(UserWarning, match="could not ready its variant"):
                _chunk(1, 300, 2, 4, 128, 128)
        finally:
            _launch.siblings(before)
    assert [e for e in log if e[0] == "launch"]