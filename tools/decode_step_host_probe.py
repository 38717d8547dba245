"""Where an eager transformers decode step spends its host time, per attention implementation (issue 39).

A Llama-3-8B-shaped stack (LAYERS layers, random bf16 weights) prefilled with B x T tokens, then one-token
decode steps on a DynamicCache, for each of: SDPA without cuDNN, and the "aura" attention, taking turns over
``--rounds`` rounds (the host's state drifts between runs). Per variant:
  - the step's host time, queued behind a GPU sleep (the GPU never waits for the host, nor the host for it);
  - the step's wall time with a synchronize after it (what bench_e2e_transformers.py reports);
  - whether the step synchronizes with the device (torch.cuda.set_sync_debug_mode("warn"), warnings counted);
  - the host-side ops of one step, most expensive first (torch.profiler, CPU activity).

    python tools/decode_step_host_probe.py [--layers 4] [--batch 1] [--tokens 8192]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import bench_e2e_transformers as E
    from torch.profiler import ProfilerActivity, profile

    device = torch.device("cuda")
    model = E.build("llama3-8b", args.layers, False, device)
    ids, steps = E.prompts(model, args.batch, args.tokens, device)
    print(f"llama3-8b {args.layers} layers, B={args.batch} T={args.tokens}, DynamicCache, one-token steps")
    variants = ("default-no-cudnn", "aura-attn")
    caches, host, wall = {}, {v: [] for v in variants}, {v: [] for v in variants}
    with torch.inference_mode():
        for variant in variants:
            E.set_variant(model, variant)
            caches[variant] = E.new_cache(model, variant)
            model(ids, cache=caches[variant], use_cache=True, logits_to_keep=1)
        for _ in range(args.rounds):  # the variants take turns: the host's state drifts between runs
            for variant in variants:
                E.set_variant(model, variant)
                cache = caches[variant]
                for i in range(args.steps):
                    torch.cuda.synchronize()
                    torch.cuda._sleep(int(0.2 * 2e9))  # ~200 ms of device time: the step queues behind it
                    t0 = time.perf_counter()
                    model(steps[i % len(steps)], cache=cache, use_cache=True)
                    host[variant].append((time.perf_counter() - t0) * 1e3)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    model(steps[i % len(steps)], cache=cache, use_cache=True)
                    torch.cuda.synchronize()
                    wall[variant].append((time.perf_counter() - t0) * 1e3)
        for variant in variants:
            E.set_variant(model, variant)
            cache = caches[variant]

            def step():
                return model(steps[0], cache=cache, use_cache=True)
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step()
            torch.cuda.set_sync_debug_mode(0)
            syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
                torch.cuda.synchronize()
            h = statistics.median(host[variant])
            rounds = [round(statistics.median(host[variant][r * args.steps:(r + 1) * args.steps]), 2)
                      for r in range(args.rounds)]
            print(f"\n{variant}: host {h:.2f} ms per step behind a GPU sleep ({h / args.layers * 1e3:.0f} us per "
                  f"layer; rounds {rounds}), "
                  f"wall {statistics.median(wall[variant]):.2f} ms with a sync after it; synchronizing calls in one "
                  f"step: {len(syncs)}")
            for line in sorted(set(syncs))[:5]:
                print(f"  sync: {line}")
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=24, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
