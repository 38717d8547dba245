"""One flash_decode call per shape, for Nsight Compute (the kernels' profile behind bench_decode.py).

    ncu --set full -k regex:"flash_decode|merge_attn" python benchmarks/profile_decode.py [CASE ...]
    python benchmarks/profile_decode.py --sweep [CASE ...]

--splits=N forces the split count of the profiled calls (default: the automatic plan).
--sdpa profiles SDPA on the contiguous cache instead (the peer's kernels under the same ncu filter:
run ncu with --nvtx --nvtx-include "profiled/" to catch only the profiled call).
--host times the host side of one eager call (``_harness.host_us``: calls queued behind a GPU sleep)
for the op as called, under inference_mode (no autograd kernel), as flash_decode_out into
preallocated buffers, with num_splits=1 (one launch, no workspace) and SDPA: where the host time goes.
--kernels lists, without ncu, every kernel one call of ours and of SDPA launches (torch.profiler:
name, grid, block, registers, shared memory, device time): which kernels the peer picked for a shape.
--flush times eager calls of ours and SDPA after each of two L2 flushes: triton's do_bench (writes 256 MB,
leaving the L2 full of dirty lines the timed call must write back) and a read of 256 MB (a clean, equally
cold L2), beside the graph replay: how much of the eager-minus-graph gap is the flush's write-back.
--sweep instead times CUDA-graph replays of each case with every sequence empty (the fixed cost of
the launches), the split kernel alone (num_splits=1), and at full length with the automatic and
forced split counts: where the small-batch time goes without profiler clock locking or cache flushes.

CASE names a row of shapes.DECODE or bench_decode.TP_SHARDS (default: B1-T1k B1-T32k B8-T32k B1-T32k-D512), or
is an ad-hoc shape "shape:B,Hq,Hkv,D,T[,page]". Each case runs once untimed first, so one-time setup (kernel
attributes) stays out of the profiled launches.
"""

import json
import sys

import torch
import torch.nn.functional as F

import torch_aura
from torch_aura._decode_plan import plan_split_floor

import shapes
from bench_decode import TP_SHARDS, make_inputs


args = [a for a in sys.argv[1:] if not a.startswith("--")]
splits = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--splits=")), 0)  # 0: auto
wanted = args or ["B1-T1k", "B1-T32k", "B8-T32k", "B1-T32k-D512"]
by_name = {row[0]: row for row in shapes.DECODE + TP_SHARDS}
for a in args:  # "shape:B,Hq,Hkv,D,T[,page]"
    if a.startswith("shape:"):
        dims = [int(x) for x in a[len("shape:"):].split(",")]
        by_name[a] = (a, *dims[:5], dims[5] if len(dims) > 5 else None)


def calls(name):
    """(ours, sdpa): one call each of the case's shapes (SDPA on the contiguous copy of the cache)."""
    _, B, Hq, Hkv, D, T, page = by_name[name]
    q, k, v, sl, table, kc, vc = make_inputs(B, Hq, Hkv, D, T, page)
    return (lambda: torch.ops.aura.flash_decode(q, k, v, sl, table, None, splits),
            lambda: F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True))


if "--host" in sys.argv:
    from _harness import host_us

    for name in wanted:
        _, B, Hq, Hkv, D, T, page = by_name[name]
        q, k, v, sl, table, kc, vc = make_inputs(B, Hq, Hkv, D, T, page)
        out, lse = torch.ops.aura.flash_decode(q, k, v, sl, table, None, 0)
        op, op_out = torch.ops.aura.flash_decode.default, torch.ops.aura.flash_decode_out.default
        rows = {
            "op": lambda: torch.ops.aura.flash_decode(q, k, v, sl, table, None, 0),
            "op overload": lambda: op(q, k, v, sl, table, None, 0),
            "op, 1 split": lambda: op(q, k, v, sl, table, None, 1),
            "out= op": lambda: op_out(q, k, v, sl, table, None, 0, out, lse),
            "SDPA": lambda: F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True),
            "empty x2": lambda: (torch.empty_like(out), torch.empty_like(lse)),
        }
        res = {label: host_us(fn, calls=200) for label, fn in rows.items()}
        with torch.inference_mode():
            res["op, inference_mode"] = host_us(rows["op"], calls=200)
        print(name + ": " + " | ".join(f"{k} {v:.1f} us" for k, v in res.items()), flush=True)
    sys.exit(0)

if "--kernels" in sys.argv:
    from torch.profiler import ProfilerActivity, profile

    for name in wanted:
        for who, fn in zip(("ours", "SDPA"), calls(name)):
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    print(f"{name} {who}: {e.name[:110]} {e.device_time:.1f} us", flush=True)
            # grid, block, registers and shared memory are in the trace's kernel args
            path = f"/tmp/profile_decode_{who}.json"
            prof.export_chrome_trace(path)
            for ev in json.load(open(path))["traceEvents"]:
                if ev.get("cat") == "kernel":
                    a = ev.get("args", {})
                    print(f"    grid {a.get('grid')} block {a.get('block')} regs {a.get('registers per thread')} "
                          f"smem {a.get('shared memory')} blocks/SM {a.get('blocks per SM')} "
                          f"occupancy {a.get('est. achieved occupancy %')}", flush=True)
    sys.exit(0)
if "--flush" in sys.argv:
    from _harness import time_us

    def read_flushed_us(fn, reps=100):
        """Median eager time of fn() after a 256 MB read (the L2 cold but clean)."""
        buf = torch.ones(64 * 2**20, device="cuda")
        sink = torch.empty((), device="cuda")
        fn()
        times = []
        for _ in range(reps):
            torch.sum(buf, 0, out=sink)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return sorted(s_.elapsed_time(e) for s_, e in times)[reps // 2] * 1e3

    for name in wanted:
        for who, fn in zip(("ours", "SDPA"), calls(name)):
            print(f"{name} {who}: eager, written flush {time_us(fn):.1f} us | eager, read flush "
                  f"{read_flushed_us(fn):.1f} us | graph {time_us(fn, graph=True):.1f} us", flush=True)
    sys.exit(0)

if "--sweep" in sys.argv:
    from _harness import time_us

    for name in wanted:
        _, B, Hq, Hkv, D, T, page = by_name[name]
        q, k, v, sl, table, *_ = make_inputs(B, Hq, Hkv, D, T, page)
        empty = torch.zeros_like(sl)
        rows = [("empty, auto S", lambda: torch.ops.aura.flash_decode(q, k, v, empty, table, None, 0)),
                ("full, S=1", lambda: torch.ops.aura.flash_decode(q, k, v, sl, table, None, 1))]
        # what the automatic plan would pick filling one or two CTAs per SM (decode_num_splits)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        floor = plan_split_floor(D, page is not None, page or 16)  # the floor the kernel's plan uses
        per_sm = {c: torch_aura.decode_num_splits(B, Hkv, sms, c, capacity=T, split_floor=floor) for c in (1, 2)}
        for S in sorted({0, 2, 4, 8, 16, 32, 64, 128, *per_sm.values()}):
            rows.append((f"full, S={S or 'auto'}", lambda S=S: torch.ops.aura.flash_decode(q, k, v, sl, table, None, S)))
        print(f"{name} (plan: S={per_sm[1]} at 1 CTA/SM, S={per_sm[2]} at 2): "
              + " | ".join(f"{label} {time_us(fn, graph=True):.1f} us" for label, fn in rows), flush=True)
    sys.exit(0)

for name in wanted:
    _, B, Hq, Hkv, D, T, page = by_name[name]
    fn = calls(name)[1 if "--sdpa" in sys.argv else 0]
    fn()  # warm-up (not profiled: see -c / --launch-skip, or --nvtx-include "profiled/")
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profiled")
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"profiled {name}: B={B} Hq={Hq} Hkv={Hkv} D={D} T={T} page={page}")

