"""Split-K flash decoding: torch_aura's CUDA kernel vs PyTorch SDPA, side by side in one run.

For every shape of ``shapes.DECODE`` (the decode rows of docs/targets.md, plus paged page-16
variants) and of ``TP_SHARDS`` (one GPU's heads of a tensor-parallel model): build a bf16 cache with
every sequence at full length T, check ours against SDPA and (for T <= 32k) the pure-PyTorch
reference, then time ours and SDPA eagerly (cold L2) and as CUDA-graph replays. Reports
microseconds, KV bytes read per second, % of the measured copy bandwidth, the ratio to SDPA, paged
vs contiguous, and the targets.md gates as PASS / MISS.

    python benchmarks/bench_decode.py [--out DIR] [--cases SUBSTRING] [--schedules] [--splits]

``--schedules`` also times ours under each schedule of ``SCHEDULES`` (static, balanced, stream-K at one and
two CTAs per SM, and the adaptive rule between static and stream-K; docs/decode.md §4), each checked first,
in the same run as the automatic choice.
``--splits`` also times ours (graph) at each forced split count of ``SPLIT_SWEEP`` and at the counts
whose grid fills every SM (``filling_splits``): how far the automatic plan is from the best split on
this GPU.

Writes ``decode_<gpu>.md`` (committed under benchmarks/results/) and raw JSONL rows.
"""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F

import torch_aura  # noqa: F401  (defines the ops, loads the CUDA kernels)
from torch_aura.reference import decode as ref
from torch_aura.testing import rel_rms

import _harness as H
import shapes


DTYPE = torch.bfloat16

# Large models are served tensor-parallel: each GPU decodes Hq / TP query and Hkv / TP KV heads.
# name, B, Hq, Hkv, D, T, page (shapes.DECODE's columns)
TP_SHARDS = [
    (f"{model}-B{B}-T{T // 1024}k", B, Hq, Hkv, D, T, None)
    for model, Hq, Hkv, D in (("32/8-TP4", 8, 2, 128),   # a 32 q / 8 kv model (Llama-3-8B-like) on 4 GPUs
                              ("32/8-TP8", 4, 1, 128),   # ... on 8 GPUs
                              ("Qwen3N-TP2", 8, 1, 256))  # Qwen3-Next attention, 16 q / 2 kv, D = 256, on 2
    for B, T in ((1, 4096), (1, 32768), (8, 32768))
]


def make_inputs(B, Hq, Hkv, D, T, page, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, D, device="cuda", dtype=DTYPE, generator=g)
    k = torch.randn(B, Hkv, T, D, device="cuda", dtype=DTYPE, generator=g)
    v = torch.randn(B, Hkv, T, D, device="cuda", dtype=DTYPE, generator=g)
    seq_lens = torch.full((B,), T, dtype=torch.int32, device="cuda")
    if page is None:
        return q, k, v, seq_lens, None, k, v
    nb = T // page
    perm = torch.randperm(B * nb, device="cuda", generator=g)
    table = perm.reshape(B, nb).to(torch.int32)
    kp = torch.empty(B * nb, page, Hkv, D, device="cuda", dtype=DTYPE)
    vp = torch.empty_like(kp)
    kp[table.flatten().long()] = k.reshape(B, Hkv, nb, page, D).permute(0, 2, 3, 1, 4).reshape(B * nb, page, Hkv, D)
    vp[table.flatten().long()] = v.reshape(B, Hkv, nb, page, D).permute(0, 2, 3, 1, 4).reshape(B * nb, page, Hkv, D)
    return q, kp, vp, seq_lens, table, k, v


def main(argv=None) -> int:
    def cases_arg(parser):
        parser.add_argument("--cases", default="", help="run only the cases whose name contains one of these "
                            "comma-separated strings (a partial table: written only under --out, never over the "
                            "committed one)")
        parser.add_argument("--schedules", action="store_true", help="also time each schedule of SCHEDULES "
                            "(TORCH_AURA_DECODE_SCHEDULE), each checked against SDPA first")
        parser.add_argument("--splits", action="store_true", help="also time ours (graph) at each forced "
                            "num_splits of SPLIT_SWEEP, each checked against SDPA first")

    started = H.start("bench_decode", "flash_decode", __doc__, argv, cases_arg)
    if started is None:
        return 1
    args, facts, copy_tbs = started
    print(f"{facts['gpu']} | torch {facts['torch']} | CUDA {facts['cuda']} | triton {facts['triton']} | "
          f"commit {facts['commit']} | copy {copy_tbs:.2f} TB/s")
    rows, contiguous_us = [], {}
    for name, B, Hq, Hkv, D, T, page in shapes.DECODE + TP_SHARDS:
        if args.cases and not any(c in name for c in args.cases.split(",")):
            continue
        q, k, v, sl, table, kc, vc = make_inputs(B, Hq, Hkv, D, T, page)
        ours = lambda splits=0: torch.ops.aura.flash_decode(q, k, v, sl, table, None, splits)  # noqa: E731
        sdpa = lambda: F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True)  # noqa: E731
        out, lse = ours()
        want = sdpa()[:, :, 0]
        err_sdpa = rel_rms(out, want)
        err_ref = None
        if T <= 32768:
            ref_out, _ = ref.flash_decode(q, k, v, sl, table)
            err_ref = rel_rms(out, ref_out)
        ok = err_sdpa < 5e-3 and (err_ref is None or err_ref < 5e-3)
        row = {"case": name, "B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "T": T, "page": page, "dtype": "bf16",
               "err_vs_sdpa": err_sdpa, "err_vs_ref": err_ref, "correct": ok}
        kv_bytes = 2 * B * Hkv * T * D * q.element_size()
        row["kv_MB"] = kv_bytes / 1e6
        if ok:
            row["ours_us"], row["ours_graph_us"] = H.time_us(ours), H.time_us(ours, graph=True)
            row["sdpa_us"], row["sdpa_graph_us"] = H.time_us(sdpa), H.time_us(sdpa, graph=True)
            row["ours_host_us"], row["sdpa_host_us"] = H.host_us(ours), H.host_us(sdpa)
            row["ours_TBs"] = kv_bytes / row["ours_us"] / 1e6
            row["pct_copy"] = 100 * row["ours_TBs"] / copy_tbs
            row["speedup"] = row["sdpa_us"] / row["ours_us"]
            row["speedup_graph"] = row["sdpa_graph_us"] / row["ours_graph_us"]
            if args.schedules:
                time_schedules(row, ours, want)
            if args.splits:
                time_splits(row, ours, want)
            key = (B, Hq, Hkv, D, T)
            if page is None:
                contiguous_us[key] = (row["ours_us"], row["ours_graph_us"])
            elif key in contiguous_us:
                row["paged_vs_contig"] = row["ours_us"] / contiguous_us[key][0]
        rows.append(row)
        sched_text = "".join(f" | {s} {row[s + '_us']:.1f} / {row[s + '_graph_us']:.1f}"
                             for s in SCHEDULES if s + "_us" in row)
        print(f"{name:>22}: ours {row.get('ours_us', float('nan')):8.1f} us (graph {row.get('ours_graph_us', float('nan')):7.1f})"
              f" | sdpa {row.get('sdpa_us', float('nan')):8.1f} us (graph {row.get('sdpa_graph_us', float('nan')):7.1f})"
              f" | {row.get('ours_TBs', float('nan')):.2f} TB/s | x{row.get('speedup', float('nan')):.2f}"
              f" | host {row.get('ours_host_us', float('nan')):.1f} / {row.get('sdpa_host_us', float('nan')):.1f} us"
              f"{sched_text}"
              f" | err {err_sdpa:.1e}{'' if ok else '  WRONG'}", flush=True)
        del q, k, v, kc, vc
        torch.cuda.empty_cache()
        if not args.cases or args.out is not None:  # after every row: a run cut short keeps what it measured
            path = H.write("decode", facts, rows, render(facts, copy_tbs, rows), args.out)

    md = render(facts, copy_tbs, rows)
    if args.cases and args.out is None:
        print("\n(--cases without --out: nothing written)\n")
    elif rows:
        print(f"\nwrote {path}\n")
    print(md)
    return 0 if all(r["correct"] for r in rows) else 1


# each schedule --schedules times: the variables it sets (read per call, captured with the graph)
SCHEDULES = {
    "static": {"TORCH_AURA_DECODE_SCHEDULE": "static"},
    "balanced": {"TORCH_AURA_DECODE_SCHEDULE": "balanced"},
    "streamk": {"TORCH_AURA_DECODE_SCHEDULE": "streamk", "TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM": "1"},
    "streamk2": {"TORCH_AURA_DECODE_SCHEDULE": "streamk", "TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM": "2"},
    "adaptive": {"TORCH_AURA_DECODE_SCHEDULE": "adaptive"},  # the candidate rule for auto (decode.md §4)
}


def time_schedules(row: dict, ours, want) -> None:
    """Ours under each of SCHEDULES: checked against SDPA, then timed eager and as a graph."""
    for sched, variables in SCHEDULES.items():
        saved = {name: os.environ.get(name) for name in variables}
        os.environ.update(variables)
        try:
            err = rel_rms(ours()[0], want)
            row[f"{sched}_err"] = err
            if err < 5e-3:
                row[f"{sched}_us"], row[f"{sched}_graph_us"] = H.time_us(ours), H.time_us(ours, graph=True)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


SPLIT_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128)


def filling_splits(B: int, Hkv: int, sms: int) -> list[int]:
    """Split counts outside ``SPLIT_SWEEP`` whose grid (B x Hkv x S CTAs, head tiles of up to 8 query heads
    each) is a whole number of SM rounds: a power-of-two S leaves SMs idle on a GPU of 132 (B8 Hkv8 S2:
    128 CTAs), where S = 33 fills every one of them."""
    fill = sms // math.gcd(B * Hkv, sms)
    return [k * fill for k in (1, 2) if k * fill <= 128 and k * fill not in SPLIT_SWEEP]


def time_splits(row: dict, ours, want) -> None:
    """Graph time of ours at each forced split count (checked against SDPA first), those of ``SPLIT_SWEEP``
    and the SM-filling ones: row['splits'] maps num_splits -> us; the automatic plan's own time is
    row['ours_graph_us']."""
    row["splits"] = {}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in (*SPLIT_SWEEP, *filling_splits(row["B"], row["Hkv"], sms)):
        if rel_rms(ours(n)[0], want) < 5e-3:
            row["splits"][n] = H.time_us(lambda: ours(n), graph=True)


def gates(rows):
    """targets.md's flash_decode gates, evaluated on this run's rows."""
    by = {r["case"]: r for r in rows if r["correct"]}
    out = []

    def gate(what, cases, test, show):
        ok = [test(by[c]) for c in cases if c in by]
        vals = ", ".join(f"{c}: {show(by[c])}" for c in cases if c in by)
        out.append((what, "PASS" if ok and all(ok) else "MISS", vals))

    dense = [r["case"] for r in rows if r["page"] is None and r["D"] <= 256]
    gate("never slower than SDPA (D <= 256), eager", dense, lambda r: r["speedup"] >= 1.0, lambda r: f"x{r['speedup']:.2f}")
    gate("never slower than SDPA (D <= 256), CUDA graph", dense, lambda r: r["speedup_graph"] >= 1.0,
         lambda r: f"x{r['speedup_graph']:.2f}")
    gate(">= 1.3x SDPA graph time at B=1, T <= 8k", ["B1-T1k", "B1-T4k", "B1-T8k"],
         lambda r: r["speedup_graph"] >= 1.3, lambda r: f"x{r['speedup_graph']:.2f} ({r['ours_graph_us']:.1f} us)")
    gate(">= 2.90 TB/s when reading >= 256 MB", ["B1-T128k", "B8-T32k", "B32-T8k"],
         lambda r: r["ours_TBs"] >= 2.90, lambda r: f"{r['ours_TBs']:.2f} TB/s")
    gate(">= 2.5 TB/s at D=512", ["B1-T32k-D512"], lambda r: r["ours_TBs"] >= 2.5, lambda r: f"{r['ours_TBs']:.2f} TB/s")
    paged = [r["case"] for r in rows if r["page"] is not None]
    gate("paged (page 16) within 5% of contiguous", paged, lambda r: r.get("paged_vs_contig", 9) <= 1.05,
         lambda r: f"{r.get('paged_vs_contig', float('nan')):.2f}x")
    gate("host time per eager call <= 25 us", [r["case"] for r in rows], lambda r: r["ours_host_us"] <= 25,
         lambda r: f"{r['ours_host_us']:.1f} us")
    return out


def render(facts, copy_tbs, rows) -> str:
    lines = [
        f"# flash_decode on {facts['gpu']}",
        "",
        f"torch {facts['torch']}, CUDA {facts['cuda']}, triton {facts['triton']}, commit `{facts['commit']}`. "
        f"Generated by `benchmarks/bench_decode.py` (do not edit by hand).",
        "",
        f"bf16, every sequence at full length T; times are medians in microseconds: eager = "
        f"`triton.testing.do_bench` (L2 flushed before each call), graph = `do_bench_cudagraph` replays. "
        f"TB/s = K+V bytes read / eager time; copy ceiling measured in this run: {copy_tbs:.2f} TB/s "
        f"(device-to-device copy, read + write). Ours is `torch.ops.aura.flash_decode`; SDPA is "
        f"`F.scaled_dot_product_attention(enable_gqa=True)` on the contiguous cache. Every provider "
        f"was checked against SDPA (and the reference for T <= 32k) before timing. `host`: host time per "
        f"eager call, ours / SDPA (`_harness.host_us`).",
        "",
        "| case | B | Hq/Hkv | D | T | layout | ours | ours graph | SDPA | SDPA graph | speedup | speedup graph | ours TB/s | % copy | paged/contig | host ours / SDPA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["correct"]:
            lines.append(f"| {r['case']} | {r['B']} | {r['Hq']}/{r['Hkv']} | {r['D']} | {r['T']} | "
                         f"{'page ' + str(r['page']) if r['page'] else 'contiguous'} | WRONG (rel RMS {r['err_vs_sdpa']:.1e}) |"
                         + " |" * 10)
            continue
        pc = f"{r['paged_vs_contig']:.2f}" if "paged_vs_contig" in r else ""
        lines.append(
            f"| {r['case']} | {r['B']} | {r['Hq']}/{r['Hkv']} | {r['D']} | {r['T']} | "
            f"{'page ' + str(r['page']) if r['page'] else 'contiguous'} | {r['ours_us']:.1f} | {r['ours_graph_us']:.1f} | "
            f"{r['sdpa_us']:.1f} | {r['sdpa_graph_us']:.1f} | {r['speedup']:.2f}x | {r['speedup_graph']:.2f}x | "
            f"{r['ours_TBs']:.2f} | {r['pct_copy']:.0f}% | {pc} | {r['ours_host_us']:.1f} / {r['sdpa_host_us']:.1f} |")
    timed = [r for r in rows if any(s + "_us" in r for s in SCHEDULES)]
    if timed:
        lines += ["", "Ours under each schedule (`--schedules`, `TORCH_AURA_DECODE_SCHEDULE`; the table above is "
                  "the automatic choice), eager / graph us:", "",
                  "| case | " + " | ".join(SCHEDULES) + " | best over static, graph | best over SDPA, graph |",
                  "|---|" + "---|" * (len(SCHEDULES) + 2)]
        for r in timed:
            cells = [f"{r[s + '_us']:.1f} / {r[s + '_graph_us']:.1f}" if s + "_us" in r
                     else f"WRONG (rel RMS {r[s + '_err']:.1e})" if s + "_err" in r else "" for s in SCHEDULES]
            graphs = {s: r[s + "_graph_us"] for s in SCHEDULES if s + "_us" in r}
            best = min(graphs, key=graphs.get) if graphs else None
            over_static = f"{best} {r['static_graph_us'] / graphs[best]:.2f}x" if best and "static_us" in r else ""
            over_sdpa = f"{r['sdpa_graph_us'] / graphs[best]:.2f}x" if best else ""
            lines.append(f"| {r['case']} | " + " | ".join(cells) + f" | {over_static} | {over_sdpa} |")
    swept = [r for r in rows if r.get("splits")]
    if swept:
        lines += ["", "Ours at each forced `num_splits` (`--splits`), graph us; best against the automatic plan "
                  "and SDPA:", "", "| case | " + " | ".join(str(n) for n in SPLIT_SWEEP)
                  + " | SM-filling S: us | auto | best over auto | best over SDPA |",
                  "|---|" + "---|" * (len(SPLIT_SWEEP) + 4)]
        for r in swept:
            best = min(r["splits"].values())
            filling = ", ".join(f"{n}: {us:.1f}" for n, us in r["splits"].items() if n not in SPLIT_SWEEP) or "-"
            lines.append(f"| {r['case']} | " + " | ".join(f"{r['splits'][n]:.1f}" if n in r["splits"] else "-"
                                                      for n in SPLIT_SWEEP)
                         + f" | {filling} | {r['ours_graph_us']:.1f} | {r['ours_graph_us'] / best:.2f}x | "
                         f"{r['sdpa_graph_us'] / best:.2f}x |")
    lines += ["", "## Targets (docs/targets.md)", "", "| gate | result | measured |", "|---|---|---|"]
    lines += [f"| {w} | {res} | {vals} |" for w, res, vals in gates(rows)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
