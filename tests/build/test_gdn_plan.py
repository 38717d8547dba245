"""A planned ``gdn_chunk`` (``triton_kernels/gdn/plan.py``, ``TORCH_AURA_GDN_PLAN``) launches exactly what its
launchers launch.

No GPU: Triton's runtime runs against a stand-in driver modelled as an sm_90 device of 132 SMs, and every
compiled variant is a stand-in whose launcher records what it is given (grid and arguments). Each call of a
mix of geometries runs three times with fresh inputs, with plans off and on; every launch must match:
kernel, grid, each argument's value, a tensor's shape, strides, dtype and which input it is (or which
buffer of the call, numbered by first use), a TMA descriptor's geometry and base. ``_launch.VERIFY``
re-derives Triton's variant key at every planned launch too.
"""

from __future__ import annotations

import os

import pytest
import torch
from _gdn_plan_mix import GEOMETRIES, calls as _calls, inputs as _inputs

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="Triton's compiled-launch path; the interpreter tree runs kernels instead")


def _stubbed(monkeypatch, verify: bool):
    from torch_aura.triton_kernels.gdn import launch_stub

    real = torch.empty.__globals__  # nothing is computed: no NaN poisoning (tests/conftest.py)
    monkeypatch.setattr(torch, "empty", real.get("_real_empty", torch.empty))
    monkeypatch.setattr(torch, "empty_like", real.get("_real_empty_like", torch.empty_like))
    log = []
    with launch_stub.stubbed(log, verify=verify, setattr=monkeypatch.setattr) as fresh:
        yield log, fresh


@pytest.fixture
def stub(monkeypatch):
    """The launches stubbed (``gdn/launch_stub.py``, VERIFY on); yields the log of launches and stream
    steps and ``fresh()``, which empties the JIT, launch and plan caches."""
    yield from _stubbed(monkeypatch, verify=True)


@pytest.fixture
def stub_unverified(monkeypatch):
    """As ``stub``, VERIFY off: replays hand plain pointers to the launchers as ints (``POINTERS_AS_INTS``)."""
    yield from _stubbed(monkeypatch, verify=False)


def _normalise(log, inputs_of_call):
    """Each launch with its tensors named: ``("in", i)`` for input i of its call, ``("buf", n, offset)`` for
    the call's n-th buffer (by storage, in order of first use)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    out = []
    for call, entries in enumerate(log):
        inputs = inputs_of_call[call]
        storages = {}

        def name(t):
            for i, x in enumerate(inputs):
                if t is x:
                    return ("in", i)
            ptr = t.untyped_storage().data_ptr()
            storages.setdefault(ptr, len(storages))
            return ("buf", storages[ptr], t.storage_offset())

        def norm(a):
            if isinstance(a, torch.Tensor):
                return ("T", name(a), tuple(a.shape), a.stride(), a.dtype)
            if isinstance(a, TensorDescriptor):
                return ("D", norm(a.base), tuple(a.shape), tuple(a.strides), tuple(a.block_shape), a.padding)
            return ("V", type(a).__name__, a)

        for e in entries:
            out.append(e if e[0] == "event" else (call, e[1], e[2], tuple(norm(a) for a in e[3])))
    return out


def _run_all(log, repeats=3):
    """Every call of the mix ``repeats`` times (fresh inputs each), interleaved; returns the launches per
    call and each call's inputs."""
    from torch_aura.triton_kernels.gdn import chunk

    per_call, inputs_of_call = [], []
    for _ in range(repeats):
        for B, T, kw, l2, scale in _calls():
            args = _inputs(B, T, **kw)
            q, k, v, g, beta, h0, cu, ci = args
            start = len(log)
            o, final = chunk.gdn_chunk(q, k, v, g, beta, scale, h0, cu, ci, l2, kw.get("state_v_first", False))
            per_call.append(log[start:] + [("event", "out", tuple(o.shape), o.dtype, tuple(final.shape))])
            inputs_of_call.append(args)
    return per_call, inputs_of_call


@pytest.mark.parametrize("direct", [False, True], ids=["launcher-objects", "direct-launches"])
def test_planned_calls_launch_what_the_launchers_launch(stub, monkeypatch, direct):
    from torch_aura.triton_kernels.gdn import plan

    log, fresh = stub
    # buffer for buffer: pooled replays hand views of one workspace (their layout: the tests below); direct
    # launches of variants with in-kernel descriptors need the workspace too, so only the others go direct
    monkeypatch.setattr(plan, "POOL_BUFFERS", False)
    monkeypatch.setattr(plan, "DIRECT_LAUNCH", direct)
    monkeypatch.setattr(plan, "ENABLED", False)
    off, off_inputs = _run_all(log)
    fresh()
    log.clear()
    monkeypatch.setattr(plan, "ENABLED", True)
    replays = []
    real_run = plan._Plan.run
    monkeypatch.setattr(plan._Plan, "run", lambda self, *a: (replays.append(1), real_run(self, *a))[1])
    on, on_inputs = _run_all(log)
    assert len(off) == len(on)
    n_calls = len(off) // 3
    assert len(replays) == 2 * n_calls, "every call after a geometry's first should be planned"
    assert sum(p is not None for p in plan._plans.values()) == n_calls
    a, b = _normalise(off, off_inputs), _normalise(on, on_inputs)
    assert any(e[0] == "event" and e[1] == "enter" for e in a), "no call ran the pass beside w/u"
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"entry {i} differs:\n off {x}\n on  {y}"
    assert len(a) == len(b)
    for p in plan._plans.values():
        # every buffer of the pass beside w/u is made on the main stream before the side stream waits for
        # it ("wait"): zeros and computed slots run kernels (the flags, the chunk offsets) that the pass
        # reads; made after the wait, they raced it (NaN rows on the H200 inside a CUDA graph)
        region = False
        for op in p.ops:
            if op[0] == "event":
                if op[1] == "wait":
                    region = True
                    continue
                region = region and op[1] != "exit"
            if region:
                made = op[-2] if op[0] == "launch" else op[-1]
                assert not made, f"{[p.recipes[s][0] for s in made]} made after the side stream's wait"


@pytest.mark.parametrize("pooled,direct", [(False, False), (True, False), (True, True)],
                         ids=["own-buffers", "pooled-buffers", "pooled-direct"])
def test_replays_hand_each_pointer_as_the_int_of_the_tensor_the_launchers_passed(stub_unverified, monkeypatch,
                                                                                  pooled, direct):
    """Without VERIFY a replay passes each plain pointer argument as an int (Triton's launcher then skips
    data_ptr() and cuPointerGetAttribute): at every position where the recording passed a tensor, the
    replay passes the data pointer of the same input, or of a buffer it made (its own allocation, or its
    place in the pooled workspace) with that tensor's shape, strides and dtype; all else is unchanged."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from torch_aura.triton_kernels.gdn import chunk, plan

    log, _ = stub_unverified
    monkeypatch.setattr(plan, "ENABLED", True)
    monkeypatch.setattr(plan, "POOL_BUFFERS", pooled)
    monkeypatch.setattr(plan, "DIRECT_LAUNCH", direct)
    # (address, shape, strides, dtype) of every buffer a replay makes and every input it is given (the
    # chunk table is built from cu_seqlens before the plan's lookup); the objects are held so that no
    # address is reused within the test
    made, held = [], []
    real_make, real_run = plan._Plan._make, plan._Plan.run

    def make(self, slots, s, *a):
        x = real_make(self, slots, s, *a)
        held.append(x)
        if isinstance(x, torch.Tensor):
            made.append((x.data_ptr(), tuple(x.shape), x.stride(), x.dtype))
        else:  # a pooled buffer's address: an "empty" recipe, contiguous
            shape, dtype = self.recipes[s][1], self.recipes[s][2]
            made.append((int(x), tuple(shape), torch.empty(shape, device="meta").stride(), dtype))
        return x

    def run(self, inputs, device):
        held.extend(inputs)
        made.extend((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in inputs if t is not None)
        return real_run(self, inputs, device)
    monkeypatch.setattr(plan._Plan, "_make", make)
    monkeypatch.setattr(plan._Plan, "run", run)
    cases = [GEOMETRIES[3], GEOMETRIES[4], GEOMETRIES[6], GEOMETRIES[7], *list(_calls())[len(GEOMETRIES):]]
    pools = 0
    for B, T, kw, l2, scale in cases:
        args = _inputs(B, T, **kw)
        q, k, v, g, beta, h0, cu, ci = args
        runs = []
        for _ in range(2):  # recorded by the launchers, then replayed
            start = len(log)
            chunk.gdn_chunk(q, k, v, g, beta, scale, h0, cu, ci, l2, kw.get("state_v_first", False))
            runs.append([e for e in log[start:] if e[0] == "launch"])
        recorded, replayed = runs
        assert len(recorded) == len(replayed) and recorded
        ints = 0
        for x, y in zip(recorded, replayed):
            assert x[:3] == y[:3] and len(x[3]) == len(y[3])
            for a, b in zip(x[3], y[3]):
                if not isinstance(a, torch.Tensor):
                    if isinstance(a, TensorDescriptor):
                        assert isinstance(b, TensorDescriptor) and (a.shape, a.strides) == (b.shape, b.strides)
                    else:
                        assert a == b
                    continue
                assert type(b) is int, f"{x[1]}: a {type(b).__name__} where the launchers passed a tensor"
                ints += 1
                if any(a is t for t in args):
                    assert b == a.data_ptr()
                else:
                    assert (b, tuple(a.shape), a.stride(), a.dtype) in made, \
                        f"{x[1]}: {b:#x} is no buffer the replay made like {tuple(a.shape)}"
        assert ints
        pools += any(isinstance(x, plan._Address) for x in held)
    assert bool(pools) == pooled


def test_pooled_buffers_never_share_a_byte_while_both_are_live(stub, monkeypatch):
    """For every plan of the mix: each pooled buffer is live (made, not yet dropped) at every launch that
    reads it, holds its recorded bytes, and shares no byte with any other buffer live at a common op;
    first fit reuses what ended (the workspace is below the sum of its buffers where lifetimes allow)."""
    from torch_aura.triton_kernels.gdn import plan

    log, _ = stub
    monkeypatch.setattr(plan, "ENABLED", True)
    _run_all(log, repeats=1)  # each geometry's first call records its plan
    plans = [p for p in plan._plans.values() if p]
    assert plans and any(p.pool for p in plans)
    reused = False
    for p in plans:
        spans = {s: (p.pool[s], n, first, last) for s, (n, first, last) in p.pool_spans.items()}
        for i, op in enumerate(p.ops):
            if op[0] == "launch":
                for _, s, _ in op[7]:
                    if s in spans:
                        assert spans[s][2] <= i <= spans[s][3], f"slot {s} read at op {i} outside its span"
        for s, (o, n, a, b) in spans.items():
            assert o % plan._POOL_ALIGN == 0 and o + n <= p.pool_bytes
            for t, (o2, n2, a2, b2) in spans.items():
                if s < t and a <= b2 and a2 <= b:
                    assert o + n <= o2 or o2 + n2 <= o, f"slots {s} and {t} overlap while both live"
        reused |= p.pool_bytes < sum(-(-n // plan._POOL_ALIGN) * plan._POOL_ALIGN for n, _, _ in p.pool_spans.values())
    assert reused


def test_direct_launches_take_their_scratch_from_the_workspace(stub, monkeypatch):
    """``DIRECT_LAUNCH``: a replay calls every variant's C launch itself, none through the launcher object; a
    variant with in-kernel descriptors is handed its scratch at its span of the replay's workspace (the
    layout test above checks the spans), the others none."""
    from torch_aura.triton_kernels.gdn import launch_stub, plan

    log, _ = stub
    monkeypatch.setattr(plan, "ENABLED", True)
    monkeypatch.setattr(plan, "POOL_BUFFERS", True)
    monkeypatch.setattr(plan, "DIRECT_LAUNCH", True)
    launched = launch_stub._workspace["c_launches"]
    replays, through_run = [], []
    real_run, real_launcher_call = plan._Plan.run, launch_stub._Launcher.__call__

    def run(self, *a):
        start = len(launched)
        out = real_run(self, *a)
        replays.append((self, [(name, c[:3], c[7]) for name, c in launched[start:]]))
        return out

    def launcher_call(self, *a):
        if launch_stub._workspace["replaying"]:
            through_run.append(self.name)
        return real_launcher_call(self, *a)
    monkeypatch.setattr(plan._Plan, "run", run)
    monkeypatch.setattr(launch_stub._Launcher, "__call__", launcher_call)
    _run_all(log, repeats=2)
    assert replays and not through_run, through_run
    scratched = side_scratched = 0
    for p, launched in replays:
        launches, bases = iter(launched), set()
        wait = side = None
        for i, op in enumerate(p.ops):
            if op[0] == "event":
                wait = i if op[1] == "wait" else wait
                side = op[1] == "enter" or (side and op[1] != "exit")
                continue
            name, (gx, gy, gz), scratch = next(launches)
            assert name == op[1].__name__
            key = p.direct[i][2]
            assert (scratch is None) == (key is None), (name, scratch, key)
            if key is None:
                continue
            # a side-stream launch's scratch is live from the side stream's wait to the end: the main stream's
            # w/u launch, after that wait in the ops, runs beside it and must not get the same bytes
            want = (gx * gy * gz * 128, *((wait, len(p.ops)) if side else (i, i)))
            assert p.pool_spans[key] == want, (name, p.pool_spans[key], want)
            bases.add(scratch - p.pool[key])
            scratched += 1
            side_scratched += bool(side)
        assert next(launches, None) is None, "a replay launched more than its plan holds"
        assert len(bases) <= 1, "one replay's scratch addresses are not offsets of one workspace"
    assert scratched and side_scratched, "no variant of the mix (on the side stream) had in-kernel descriptors"


def test_pooled_views_derive_the_variants_the_launchers_ran(stub, monkeypatch):
    """VERIFY replays with pooled buffers hand Triton views of the workspace: its variant key, re-derived at
    every planned launch, must equal the recorded one (the views are as aligned as the allocator's)."""
    from torch_aura.triton_kernels.gdn import plan

    log, _ = stub
    monkeypatch.setattr(plan, "ENABLED", True)
    monkeypatch.setattr(plan, "POOL_BUFFERS", True)
    replays = []
    real_run = plan._Plan.run
    monkeypatch.setattr(plan._Plan, "run", lambda self, *a: (replays.append(self.pool_bytes), real_run(self, *a))[1])
    _run_all(log, repeats=2)
    assert replays and any(replays)


def test_pack_lifetimes_reuses_only_what_has_ended():
    from torch_aura.triton_kernels.gdn.plan import _POOL_ALIGN as A, pack_lifetimes

    offsets, total = pack_lifetimes({1: (A, 0, 2), 2: (2 * A, 1, 3), 3: (A, 3, 5), 4: (A - 1, 4, 4)})
    # 3 takes 1's bytes once 1 ended, 4 (rounded up to A) 2's beside 3; 2 and 3 meet at op 3: apart
    assert offsets == {1: 0, 2: A, 3: 0, 4: A} and total == 3 * A
    assert pack_lifetimes({1: (A, 0, 3), 2: (A, 3, 4)}) == ({1: 0, 2: A}, 2 * A)  # live at a common op


def test_a_replay_skips_the_checks_its_recording_passed(stub, monkeypatch):
    """The checks run until a geometry has its plan, never on its replays; another geometry (here k's
    dtype) or an argument the key cannot read (a list for q) still meets the checks' named error."""
    from torch_aura.triton_kernels.gdn import chunk, plan

    monkeypatch.setattr(plan, "ENABLED", True)
    checked = []
    real = chunk._check_chunk
    monkeypatch.setattr(chunk, "_check_chunk", lambda *a: (checked.append(1), real(*a))[1])
    q, k, v, g, beta, h0, cu, ci = _inputs(1, 300)
    for _ in range(4):
        chunk.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True, False)
    assert len(checked) == 1 and sum(p is not None for p in plan._plans.values()) == 1
    with pytest.raises(ValueError, match="^k: expected dtype bfloat16"):
        chunk.gdn_chunk(q, k.float(), v, g, beta, None, h0, cu, ci, True, False)
    with pytest.raises(ValueError, match="^q: expected a Tensor"):
        chunk.gdn_chunk([q], k, v, g, beta, None, h0, cu, ci, True, False)
    assert len(checked) == 3


def test_plan_cache_is_bounded_and_keyed_on_what_launchers_read(stub, monkeypatch):
    """A plan per geometry, at most ``_MAX_PLANS``; the per-call environment is in the key."""
    from torch_aura.triton_kernels.gdn import chunk, plan

    monkeypatch.setattr(plan, "ENABLED", True)
    monkeypatch.setattr(plan, "_MAX_PLANS", 4)
    for T in range(100, 110):
        chunk.gdn_chunk(*_inputs(1, T)[:5], None, None, None, None, True, False)
    assert 0 < len(plan._plans) <= 4
    plan._plans.clear()
    args = _inputs(1, 300)
    chunk.gdn_chunk(*args[:5], None, args[5], None, None, True, False)
    monkeypatch.setenv("TORCH_AURA_GDN_OVERLAP", "0")
    chunk.gdn_chunk(*args[:5], None, args[5], None, None, True, False)
    assert len(plan._plans) == 2


def test_calls_that_cannot_be_planned_run_as_usual(stub, monkeypatch):
    """Launches through Triton (fast launches off, a launch hook) and tuning calls keep no plan."""
    from triton import knobs

    from torch_aura.triton_kernels import _launch, _tune
    from torch_aura.triton_kernels.gdn import chunk, plan

    log, _ = stub
    monkeypatch.setattr(plan, "ENABLED", True)
    args = _inputs(1, 300)
    monkeypatch.setattr(_launch, "ENABLED", False)
    chunk.gdn_chunk(*args[:5], None, args[5], None, None, True, False)
    chunk.gdn_chunk(*args[:5], None, args[5], None, None, True, False)
    assert not plan._plans
    monkeypatch.setattr(_launch, "ENABLED", True)
    hook_calls = []
    knobs.runtime.launch_enter_hook.add(hook_calls.append)
    try:
        chunk.gdn_chunk(*args[:5], None, args[5], None, None, True, False)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook_calls.append)
    assert not plan._plans  # (the stand-in launcher never calls the hook)

    def timing(self, key, launch, device):  # a tuner that times: its trial launches are not a plan
        self.timed += 1
        launch(self.configs[0])

    monkeypatch.setattr(_tune.Tuner, "__call__", timing)
    chunk.gdn_chunk(*args[:5], None, args[5], None, None, True, False)
    assert not plan._plans
    n = len(log)
    chunk.gdn_chunk(*args[:5], None, args[5], None, None, True, False)
    assert len(log) > n
