"""One gdn_chunk shape (ours, then FLA 0.6.0 when installed), profiled four ways: the profile behind
bench_gdn.py.

    python benchmarks/profile_gdn.py [--heads 16/32] [--lens 32768 | 8192x4 | varlen] [--host] [--kernels] [--memory]
    python benchmarks/profile_gdn.py --host-cpu [--recurrent B]   # no GPU: the launchers' Python host time
    ncu --nvtx --nvtx-include "prof/" --set full python benchmarks/profile_gdn.py --ncu

``--host``: host time per eager call (``bench_gdn.host_us``), host and event time per call inside
``do_bench``'s eager loop, and a cProfile of 50 calls (the Python functions that cost it).
``--anatomy`` (with ``--host`` or ``--host-cpu``): the planned call (``TORCH_AURA_GDN_PLAN``, turned on
for it) taken apart: the same call timed again with one part removed at a time (the op's dispatch,
checks and key; Triton's Python launcher around each C launch; the launches; the allocations), so the
differences are what each part costs (gdn.md §6.1).
``--kernels``: device time per kernel of one call (torch profiler), eager.
``--recurrent B``: host time per eager ``gdn_recurrent`` call (one token, batch B, the heads of
``--heads``) and its cProfile, instead of the chunk profiles; with ``--host-cpu``, launches stubbed as below:
the op through the dispatcher, its launcher called directly, and the launcher's parts.
``--host-cpu``: no GPU needed: the Python host time per ``gdn_chunk`` call (the Triton launchers called
directly, as the op's CUDA kernel calls them) with every launch stubbed on this CPU, plans off and on
(``TORCH_AURA_GDN_PLAN``, gdn.md §6.1): a stand-in driver modelled as a 132-SM sm_90 GPU, compiled variants
whose launchers do nothing, CPU tensors (their allocations are CPU ones, not the caching allocator's),
each tuner's first config, and a cProfile of the planned calls.
``--memory``: peak allocated and reserved bytes of one call over its inputs, with the overlapped
state pass and without (``TORCH_AURA_GDN_OVERLAP``), the caching allocator's segments by stream
(what the side stream keeps), and the same for four calls between model-sized allocations.
``--ncu``: one call of each inside the NVTX range ``prof`` for Nsight Compute. ``--trace DIR``: a
Chrome trace (host and device timelines) of five eager calls each, L2 flushed before every call as
``do_bench`` does, to see where an eager call's time goes between its kernels. K = V = 128, bf16 with
the L2 norm inside the op, as in bench_gdn.py. Both providers are called twice first, so Triton
compiles and our Tuner picks its configs outside what is measured. ``TORCH_AURA_GDN_OVERLAP=0``
compares the serial order where the overlapped pass would run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

import bench_gdn as B
import shapes


def parse_lens(text: str) -> list[int]:
    if text == "varlen":
        return next(c for c in shapes.GDN_CHUNK if c[0].startswith("varlen"))[1]
    n, _, count = text.partition("x")
    return [int(n)] * int(count or 1)


def eager_trace(call, path: Path) -> None:
    """Five eager calls as ``do_bench`` times them (a 256 MB L2 flush before each), host and device."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    print(f"  wrote {path}")


def eager_loop_split(call, reps: int = 40) -> tuple[float, float]:
    """``do_bench``'s eager loop (an L2 flush before each call, events around it), with the host's own
    clock around each call as well: median host us per call and median event us. When the host is the
    bound the two agree; an event time well above the host time means the device waited on something
    other than our launches."""
    import statistics
    import time

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    host, ev = [], []
    for _ in range(reps):
        flush.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        call()
        host.append((time.perf_counter() - t0) * 1e6)
        e1.record()
        ev.append((e0, e1))
    torch.cuda.synchronize()
    return statistics.median(host), statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)


def cprofile_top(call, calls: int = 50, rows: int = 18, sync: bool = True) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    if sync:
        torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(rows)
    return "\n".join(line for line in text.getvalue().splitlines() if line.strip())[:4000]


def plan_summary(p) -> str:
    """What a GDN plan (``plan._Plan``) replays per call."""
    return (f"{sum(op[0] == 'launch' for op in p.ops)} launches, "
            f"{sum(r is not None and r[0] in ('empty', 'zeros') for r in p.recipes)} allocations, "
            f"{sum(d is not None for op in p.ops if op[0] == 'launch' for _, _, d in op[7])} TMA descriptors, "
            f"{sum(r is not None and r[0] == 'view' for r in p.recipes)} views, "
            f"{sum(r is not None and r[0] == 'computed' for r in p.recipes)} computed")


def plan_anatomy(call, tensors, calls: int = 30, repeats: int = 5) -> None:
    """``--anatomy``: the planned ``gdn_chunk`` call's host time (through the dispatcher, under inference mode,
    and its CUDA kernel called directly); ``_Plan.run`` as shipped, then with each of its switches turned back
    (direct C launches, the pooled workspace, pointers as ints); then, through Triton's launchers, copies of
    the plan with one more part taken out each: ``CudaLauncher.__call__`` around the C launch (where a variant
    uses no scratch), the rest of the launcher object with its scratch allocations, the host descriptors, the
    launches themselves, the per-call ``_make`` results. Each row is the median of ``repeats`` ``host_us``
    runs and sets its switches itself; the differences between rows are what the parts cost. ``tensors``: the
    call's q, k, v, g, beta, initial state, cu_seqlens and chunk indices."""
    import copy
    import statistics

    from torch_aura.triton_kernels import _launch, _native
    from torch_aura.triton_kernels.gdn import chunk, plan

    inputs = plan.key_inputs(*tensors)
    device = inputs[0].device
    was, plan.ENABLED = plan.ENABLED, True
    try:
        call()
        call()  # records the plan, then replays it
        p = plan._plans.get(plan._key(inputs, device, None, True, False))
        if not p:
            print("  anatomy: no plan was kept for this call (a tuner timed, the interpreter, a hook?)")
            return

        def with_runs(make_run, pooled=False):
            q = copy.copy(p)
            q.ops = [op[:3] + (make_run(op[3]),) + op[4:] if op[0] == "launch" else op for op in p.ops]
            if pooled:  # each allocation made once, then the same tensor every call
                made, make = {}, p._make

                def _make(slots, s, dev, *rest):
                    if q.recipes[s][0] not in ("empty", "zeros"):
                        return make(slots, s, dev, *rest)
                    if s not in made:
                        made[s] = make(slots, s, dev, *rest)
                    return made[s]
                q._make = _make
            return q

        def direct(run):
            """Triton 3.6's ``CudaLauncher.__call__`` minus its frame: the C launch with the launcher's flags."""
            launcher = _launch.launcher_of(run)
            if launcher is None or launcher.global_scratch_size or launcher.profile_scratch_size:
                return run
            launch, coop, pdl = launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl
            return lambda gx, gy, gz, stream, fn, *rest: launch(gx, gy, gz, stream, fn, coop, pdl, None, None, *rest)

        def scratch_once(run):
            """The C launch with each variant's global scratch (in-kernel descriptors' workspace), which
            ``CudaLauncher.__call__`` asks the allocator for at every launch, made once per grid."""
            launcher = _launch.launcher_of(run)
            if launcher is None:
                return run
            from triton.runtime import _allocation

            launch, coop, pdl = launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl
            held = {}

            def scratch(size, align, allocator, programs, stream):
                return allocator.get()(programs * launcher.num_ctas * size, align, stream) if size else None

            def f(gx, gy, gz, stream, fn, *rest):
                if (gx, gy, gz) not in held:
                    held[gx, gy, gz] = (
                        scratch(launcher.global_scratch_size, launcher.global_scratch_align, _allocation._allocator,
                                gx * gy * gz, stream),
                        scratch(launcher.profile_scratch_size, launcher.profile_scratch_align,
                                _allocation._profile_allocator, gx * gy * gz, stream))
                launch(gx, gy, gz, stream, fn, coop, pdl, *held[gx, gy, gz], *rest)
            return f

        @contextlib.contextmanager
        def descriptors_reused():
            """Triton 3.6 encodes each host TMA descriptor (``make_tensordesc_arg``: cuTensorMapEncodeTiled) at
            every launch; here one is reused while its base pointer and geometry repeat, as the caching
            allocator makes them repeat call after call."""
            try:
                from triton.backends.nvidia import driver as nv
            except ImportError:
                yield
                return
            real, memo = nv.make_tensordesc_arg, {}

            def cached(arg, metadata):
                key = (arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), arg.padding, id(metadata))
                if key not in memo:
                    memo[key] = real(arg, metadata)
                return memo[key]
            nv.make_tensordesc_arg = cached
            try:
                yield
            finally:
                nv.make_tensordesc_arg = real

        def skipped(run):
            return lambda *args: None

        @contextlib.contextmanager
        def switched(name, value):
            """``plan.<name>`` (NATIVE: ``_native.ENABLED``) set to ``value`` for one row: POINTERS_AS_INTS off hands
            the launcher tensors (each then gets data_ptr() and cuPointerGetAttribute), POOL_BUFFERS on carves one
            workspace."""
            owner, name = (_native, "ENABLED") if name == "NATIVE" else (plan, name)
            was_set = getattr(owner, name)
            setattr(owner, name, value)
            try:
                yield
            finally:
                setattr(owner, name, was_set)

        @contextlib.contextmanager
        def switched_all(**values):
            with contextlib.ExitStack() as stack:
                for name, value in values.items():
                    stack.enter_context(switched(name, value))
                yield

        def on(also=contextlib.nullcontext, **values):
            """A row's context: the plan switches it sets (each row explicit, so none depends on the defaults),
            inside ``also()``."""
            @contextlib.contextmanager
            def context():
                with also(), switched_all(**values):
                    yield
            return context

        shipped = dict(POINTERS_AS_INTS=True, POOL_BUFFERS=True, DIRECT_LAUNCH=True, NATIVE=True)
        in_python = {**shipped, "NATIVE": False}
        # the rows that take Triton's launcher apart replace each op's ``run``, which only the launcher path calls
        launchers = {**in_python, "DIRECT_LAUNCH": False}
        own = {**launchers, "POOL_BUFFERS": False}

        run = lambda: p.run(inputs, device)  # noqa: E731
        q, k, v, g, beta, h0, cu, ci = tensors
        # under --host-cpu ``call`` is chunk.gdn_chunk itself: there the first three rows time one call
        rows = [("the op (dispatch, checks, key, plan.run)", call, on(**shipped)),
                ("the op under torch.inference_mode()", call, on(torch.inference_mode, **shipped)),
                ("its CUDA kernel, no dispatcher", lambda: chunk.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True,
                                                                           False), on(**shipped)),
                ("plan.run (native: one C call)" if p.native else f"plan.run (in Python: {p.native_refused})", run,
                 on(**shipped)),
                ("plan.run in Python (ints, pooled, C launches direct)", run, on(**in_python)),
                ("plan.run, Triton's launchers", run, on(**launchers)),
                ("plan.run, launchers, own buffers", run, on(**own)),
                ("plan.run, launchers, own buffers, tensors", run, on(**{**own, "POINTERS_AS_INTS": False})),
                ("  C launches called directly", lambda q=with_runs(direct): q.run(inputs, device), on(**launchers)),
                ("  C launches, scratch made once", lambda q=with_runs(scratch_once): q.run(inputs, device),
                 on(**launchers)),
                ("    and host descriptors reused", lambda q=with_runs(scratch_once): q.run(inputs, device),
                 on(descriptors_reused, **launchers)),
                ("  launches skipped", lambda q=with_runs(skipped): q.run(inputs, device), on(**launchers)),
                ("  launches skipped, _make results kept",
                 lambda q=with_runs(skipped, True): q.run(inputs, device), on(**launchers))]
        print(f"  anatomy of the planned call ({plan_summary(p)}), host us, median of {repeats}:")
        times = []
        for name, fn, context in rows:
            with context() if context else contextlib.nullcontext():
                times.append(statistics.median(B.H.host_us(fn, calls=calls, device=device.type)
                                               for _ in range(repeats)))
            print(f"    {name:44s} {times[-1]:8.1f}")
        op, inference, kernel, planned, python, launched, owned, as_tensors, direct_run, scratch_run, reused_run, \
            no_launch, made_once = times
        print(f"    => the dispatcher {op - kernel:.1f} (inference mode saves {op - inference:.1f}); the key and the "
              f"plan lookup {kernel - planned:.1f}; the native replay (_native.ENABLED) saves "
              f"{python - planned:.1f} over the Python replay; there direct C launches (plan.DIRECT_LAUNCH) save "
              f"{launched - python:.1f}; the pooled workspace (plan.POOL_BUFFERS) {owned - launched:.1f}; "
              f"pointers as ints (plan.POINTERS_AS_INTS) {as_tensors - owned:.1f}; through Triton's launchers: "
              f"launches {launched - no_launch:.1f} (the launcher objects {launched - scratch_run:.1f}: the Python "
              f"frames of scratch-free variants {launched - direct_run:.1f}, the rest, per-launch scratch "
              f"allocations included, {direct_run - scratch_run:.1f}; host descriptors {scratch_run - reused_run:.1f};"
              f" the C launches {reused_run - no_launch:.1f}), the outputs' allocations and slot addresses "
              f"{no_launch - made_once:.1f}, the replay loop and the rest (the workspace allocation included) "
              f"{made_once:.1f}")
    finally:
        plan.ENABLED = was


def recurrent_host(batch: int, H_: int, HV: int, calls: int = 100, rounds: int = 7) -> int:
    """Host time of one eager gdn_recurrent step (one token per sequence, fp32 state pool, L2 norm in the op), as
    transformers' decode calls it: the op and the public wrapper, launched natively (the geometry's one C call) and
    through Triton's launcher (``_native.ENABLED`` off), each also under ``torch.inference_mode()``. The modes take
    turns over ``rounds`` rounds (a single run moves by several us with the host's state); medians of each."""
    import statistics

    import torch_aura
    from torch_aura.triton_kernels import _native

    (q, k, v, g, beta, _), _, _ = B.make_inputs([1] * batch, H_, HV, 128, 128)
    state = torch.zeros(batch, HV, 128, 128, device="cuda")

    def call():
        return torch.ops.aura.gdn_recurrent(q, k, v, g, beta, state, None, None, None, True, False)

    def public():
        return torch_aura.gdn_recurrent(q, k, v, g, beta, state, use_qk_l2norm=True)

    @contextlib.contextmanager
    def native(on: bool):
        was, _native.ENABLED = _native.ENABLED, on
        try:
            yield
        finally:
            _native.ENABLED = was

    modes = {f"{name}, {how}{', inference_mode' if inf else ''}": (fn, on, inf)
             for name, fn in (("the op (torch.ops.aura)", call), ("torch_aura.gdn_recurrent", public))
             for how, on in (("native", True), ("Triton's launcher", False)) for inf in (False, True)}
    for fn in (call, public):
        fn()
        fn()  # the second call launches through the geometry's native program
    torch.cuda.synchronize()
    times = {name: [] for name in modes}
    for _ in range(rounds):
        for name, (fn, on, inf) in modes.items():
            with native(on), torch.inference_mode() if inf else contextlib.nullcontext():
                times[name].append(B.H.host_us(fn, calls=calls))
    print(f"gdn_recurrent B{batch} {H_}/{HV}, K = V = 128: host us per eager call (queued behind a GPU sleep), median "
          f"of {rounds} rounds of {calls} calls, modes taking turns (fastest, slowest round):")
    for name, runs in times.items():
        print(f"  {name:64s} {statistics.median(runs):6.1f}  ({min(runs):.1f}, {max(runs):.1f})")
    print(cprofile_top(call))
    return 0


def recurrent_stubbed(batch: int, H_: int, HV: int, calls: int = 500, repeats: int = 15) -> int:
    """``--host-cpu --recurrent B``: host us per gdn_recurrent decode step with launches stubbed, as vLLM's packed
    decode calls it (q, k, v views of one row per sequence, fp32 gates, an fp32 ``[P, HV, V, K]`` pool at shuffled
    rows, L2 norm in the op): the op through the dispatcher (its launcher on the CPU key, as on CUDA), the launcher
    called directly, then each of the launcher's parts called as it calls them (median of ``repeats`` means)."""
    import statistics

    from torch_aura import triton_kernels
    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import launch_stub, recurrent

    K = V = 128
    with launch_stub.stubbed(verify=False, native=True), torch.library._scoped_library("aura", "IMPL") as lib:
        lib.impl("gdn_recurrent", triton_kernels._lazy(*triton_kernels.LAUNCHERS["gdn_recurrent"].split(":")), "CPU")
        mixed = torch.randn(batch, (2 * H_ + HV) * K, dtype=torch.bfloat16)
        q, k, v = (x.view(batch, 1, -1, K) for x in mixed.split([H_ * K, H_ * K, HV * V], dim=-1))
        g, beta, pool = torch.zeros(batch, 1, HV), torch.rand(batch, 1, HV), torch.zeros(2 * batch, HV, V, K)
        rows = torch.randperm(2 * batch)[:batch].to(torch.int32)
        args = (q, k, v, g, beta, pool, rows, None, K ** -0.5, True, True)
        launched = []
        launch, recurrent.launch = recurrent.launch, lambda *a, **kw: launched.append((a, kw)) or launch(*a, **kw)
        try:
            recurrent.gdn_recurrent(*args)  # compiles (stubbed); keeps the launch as the launcher made it
        finally:
            recurrent.launch = launch
        (kernel, grid, key, *rest), kw = launched[0]
        program = recurrent._geometry_of(*args)[-1].program  # what later calls launch (the driver stood in for)
        o = torch.empty((batch, 1, HV, V), dtype=q.dtype)
        print(f"gdn_recurrent B{batch} {H_}/{HV}, K = V = 128, bf16 views of one row, fp32 pool [{2 * batch}, {HV}, "
              f"V, K] at shuffled rows, L2 norm in the op; launches stubbed on the CPU ({torch.get_num_threads()} "
              f"threads), host us per call, median of {repeats} means of {calls} calls (fastest, slowest run):")
        parts = [("the op (torch.ops.aura, dispatcher + launcher)", lambda: torch.ops.aura.gdn_recurrent(*args)),
                 ("the launcher (recurrent.gdn_recurrent)", lambda: recurrent.gdn_recurrent(*args)),
                 ("  checks and key (_geometry_of: facts, a lookup)", lambda: recurrent._geometry_of(*args)),
                 ("  env read (debug_check_pool_rows)", lambda: recurrent.debug_check_pool_rows(rows, pool.shape[0])),
                 ("  allocation (torch.empty of o)", lambda dtype=q.dtype, device=q.device: torch.empty(
                     (batch, 1, HV, V), dtype=dtype, device=device)),
                 ("  launch (_launch.run_native: addresses, one C call)",
                  lambda: _launch.run_native(program, (q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(),
                                                       beta.data_ptr(), pool.data_ptr(), rows.data_ptr(), 0,
                                                       o.data_ptr()))),
                 ("beside: _launch.launch (Triton's launcher stubbed)",
                  lambda: _launch.launch(kernel, grid, key, *rest, **kw))]
        times = {}
        for name, fn in parts:
            runs = [B.H.host_us(fn, calls=calls, device="cpu") for _ in range(repeats)]
            times[name] = statistics.median(runs)
            print(f"  {name:52s} {times[name]:6.2f}  ({min(runs):.2f}, {max(runs):.2f})")
        op, launcher, *parts, _ = times.values()
        print(f"  => the dispatcher {op - launcher:.2f}; the parts {sum(parts):.2f} of the launcher's {launcher:.2f} "
              f"(the rest, its own lines, {launcher - sum(parts):.2f})")
        print("  cProfile of the launcher:")
        print(cprofile_top(lambda: recurrent.gdn_recurrent(*args), calls=calls, rows=14, sync=False))
    return 0


def stubbed_host(H_: int, HV: int, lens: list[int], calls: int = 200, repeats: int = 15, anatomy: bool = False) -> int:
    """``--host-cpu``: host us per gdn_chunk call with launches stubbed, plans off then on (the median of
    ``repeats`` means over ``calls`` calls, ``_harness.host_us``), and where the planned call's time goes."""
    import statistics

    from torch_aura.triton_kernels.gdn import chunk, launch_stub, plan

    with launch_stub.stubbed(verify=False, native=True):
        fixed = len(set(lens)) == 1
        B_, T = (len(lens), lens[0]) if fixed else (1, sum(lens))
        q, k = torch.randn(B_, T, H_, 128, dtype=torch.bfloat16), torch.randn(B_, T, H_, 128, dtype=torch.bfloat16)
        v = torch.randn(B_, T, HV, 128, dtype=torch.bfloat16)
        g, beta, h0 = torch.zeros(B_, T, HV), torch.rand(B_, T, HV), torch.zeros(len(lens), HV, 128, 128)
        cu = ci = None
        if not fixed:
            from torch_aura.reference.gdn import chunk_indices_from_cu_seqlens

            cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
            ci = chunk_indices_from_cu_seqlens(cu)

        def call():
            return chunk.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True, False)

        print(f"{H_}/{HV} {'x'.join(map(str, lens[:1]))}{'' if len(lens) == 1 else f' ({len(lens)} sequences)'}, "
              f"K = V = 128, bf16, L2 norm in the op: pass {B.segment_plan(lens, HV, 128) or 'serial'}; "
              f"launches stubbed on the CPU ({torch.get_num_threads()} threads), {calls} calls x {repeats}")
        result = {}
        for on in (False, True):
            plan.ENABLED = on
            call()
            call()  # compiles (stubbed), records the plan
            runs = [B.H.host_us(call, calls=calls, device="cpu") for _ in range(repeats)]
            result[on] = statistics.median(runs)
            print(f"  plans {'on ' if on else 'off'}: {result[on]:7.1f} us per call (fastest run {min(runs):.1f})")
        print(f"  planned / unplanned: {result[True] / result[False]:.2f}")
        p = next(p for p in plan._plans.values() if p is not None)
        print(f"  the plan: {plan_summary(p)}")
        allocs = [r for r in p.recipes if r is not None and r[0] in ("empty", "zeros")]
        runs = [B.H.host_us(lambda: [torch.empty(r[1], dtype=r[2]) for r in allocs], calls=calls, device="cpu")
                for _ in range(repeats)]
        alloc_us = statistics.median(runs)
        print(f"  its allocations alone (CPU torch.empty of the same shapes, which both paths make): {alloc_us:.1f} us (fastest {min(runs):.1f}); "
              f"beside them: plans off {result[False] - alloc_us:.1f} us, on {result[True] - alloc_us:.1f} us")
        plan.ENABLED = True
        print("  cProfile of the planned calls:")
        print(cprofile_top(call, calls=calls, rows=14, sync=False))
        if anatomy:
            plan_anatomy(call, (q, k, v, g, beta, h0, cu, ci), calls=calls)
    return 0


def memory_report(call, who: str) -> None:
    """Peak bytes of ``call`` above what is live before it, and the allocator's segments per stream
    afterwards: a pool the side stream keeps is memory the main stream cannot reuse."""
    import os

    gib = 1 << 30
    for overlap in ("1", "0"):
        os.environ["TORCH_AURA_GDN_OVERLAP"] = overlap
        for calls in (1, 4):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            for _ in range(calls):
                other = torch.empty(2 * gib, dtype=torch.int8, device="cuda")  # a layer's other temporaries
                out = call()
                del other, out
            torch.cuda.synchronize()
            streams: dict[int, int] = {}
            for seg in torch.cuda.memory_snapshot():
                streams[seg["stream"]] = streams.get(seg["stream"], 0) + seg["total_size"]
            print(f"  {who} overlap={overlap} x{calls}: peak {(torch.cuda.max_memory_allocated() - base) / gib:.2f} GiB "
                  f"over the inputs, reserved {torch.cuda.max_memory_reserved() / gib:.2f} GiB; segments by stream "
                  + ", ".join(f"{s}: {b / gib:.2f} GiB" for s, b in sorted(streams.items())))
    os.environ.pop("TORCH_AURA_GDN_OVERLAP")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", default="16/32", help="q/k heads / v heads (default 16/32)")
    p.add_argument("--lens", default="32768", help="one length, NxCOUNT (fixed length), or 'varlen'")
    p.add_argument("--host", action="store_true")
    p.add_argument("--host-cpu", action="store_true", help="host time with launches stubbed on this CPU, "
                   "plans off and on (no GPU)")
    p.add_argument("--anatomy", action="store_true", help="with --host or --host-cpu: the planned call's host "
                   "time taken apart")
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--ncu", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--recurrent", type=int, metavar="B", help="profile gdn_recurrent at batch B instead")
    p.add_argument("--no-fla", action="store_true", help="profile ours only")
    p.add_argument("--trace", metavar="DIR", help="write <DIR>/gdn_<who>_eager.json (torch profiler, CPU + CUDA)")
    args = p.parse_args(argv)
    H_, HV = (int(x) for x in args.heads.split("/"))
    if args.recurrent:
        return (recurrent_stubbed if args.host_cpu else recurrent_host)(args.recurrent, H_, HV)
    lens = parse_lens(args.lens)
    if args.host_cpu:
        return stubbed_host(H_, HV, lens, anatomy=args.anatomy)
    (q, k, v, g, beta, h0), cu, ci = B.make_inputs(lens, H_, HV, 128, 128)
    calls = {"ours": lambda: torch.ops.aura.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True, False)}
    fla_chunk, _, version = B.fla_or_none()
    if fla_chunk is not None and not args.no_fla:
        cu64, ci64 = (None, None) if cu is None else (cu.long(), ci.long())
        calls["fla"] = lambda: fla_chunk(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True, cu_seqlens=cu64, chunk_indices=ci64)
    elif fla_chunk is None:
        print(f"FLA not profiled: {version}")
    for call in calls.values():
        call()
        call()
    torch.cuda.synchronize()
    print(f"{H_}/{HV} {args.lens}: pass {B.segment_plan(lens, HV, 128) or 'serial'}")
    if args.ncu:
        torch.cuda.nvtx.range_push("prof")
        for call in calls.values():
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    for who, call in calls.items():
        if args.host:
            print(f"  {who}: host {B.H.host_us(call):.1f} us per eager call (queued behind a GPU sleep)")
            h, e = eager_loop_split(call)
            print(f"  {who}: in do_bench's eager loop: host {h:.1f} us per call, events {e:.1f} us")
            print(cprofile_top(call))
            if args.anatomy and who == "ours":
                plan_anatomy(call, (q, k, v, g, beta, h0, cu, ci))
        if args.memory:
            memory_report(call, who)
        if args.kernels:
            for name, us in B.kernel_breakdown(call):
                print(f"  {who} {us:9.1f} us  {name}")
        if args.trace:
            eager_trace(call, Path(args.trace) / f"gdn_{who}_eager.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
