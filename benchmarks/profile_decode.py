"""One flash_decode call per shape, for Nsight Compute (the kernels' profile behind bench_decode.py).

    ncu --set full -k regex:"flash_decode|merge_attn" python benchmarks/profile_decode.py [CASE ...]
    python benchmarks/profile_decode.py --sweep [CASE ...]

--splits=N forces the split count of the profiled calls (default: the automatic plan).
--sweep instead times CUDA-graph replays of each case with every sequence empty (the fixed cost of
the launches), at full length with forced split counts, and split kernel alone (num_splits=1):
where the small-batch time goes without profiler clock locking or cache flushes.

CASE names a row of shapes.DECODE (default: B1-T1k B1-T32k B8-T32k B1-T32k-D512). Each case runs
once untimed first, so one-time setup (kernel attributes) stays out of the profiled launches.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes  # noqa: E402
from bench_decode import make_inputs  # noqa: E402

import torch_aura  # noqa: E402,F401

args = [a for a in sys.argv[1:] if not a.startswith("--")]
splits = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--splits=")), 0)  # 0: auto
wanted = args or ["B1-T1k", "B1-T32k", "B8-T32k", "B1-T32k-D512"]
by_name = {row[0]: row for row in shapes.DECODE}
if "--sweep" in sys.argv:
    from _harness import time_us

    for name in wanted:
        _, B, Hq, Hkv, D, T, page = by_name[name]
        q, k, v, sl, table, *_ = make_inputs(B, Hq, Hkv, D, T, page)
        empty = torch.zeros_like(sl)
        rows = [("empty, auto S", lambda: torch.ops.aura.flash_decode(q, k, v, empty, table, None, 0))]
        for S in (0, 1, 2, 4, 8, 16, 32, 64):
            rows.append((f"full, S={S or 'auto'}", lambda S=S: torch.ops.aura.flash_decode(q, k, v, sl, table, None, S)))
        print(name + ": " + " | ".join(f"{label} {time_us(fn, graph=True):.1f} us" for label, fn in rows), flush=True)
    sys.exit(0)

for name in wanted:
    _, B, Hq, Hkv, D, T, page = by_name[name]
    q, k, v, sl, table, *_ = make_inputs(B, Hq, Hkv, D, T, page)
    torch.ops.aura.flash_decode(q, k, v, sl, table, None, splits)  # warm-up (not profiled: see -c / --launch-skip)
    torch.cuda.synchronize()
    torch.ops.aura.flash_decode(q, k, v, sl, table, None, splits)
    torch.cuda.synchronize()
    print(f"profiled {name}: B={B} Hq={Hq} Hkv={Hkv} D={D} T={T} page={page}")

