"""Gated DeltaNet: torch_aura's Triton kernels vs FLA 0.6.0 (when installed) vs the reference.

Prefill (``gdn_chunk`` vs FLA ``chunk_gated_delta_rule``) on the Qwen3-Next shapes of
``shapes.GDN_CHUNK`` and decode (``gdn_recurrent`` vs FLA ``fused_recurrent_gated_delta_rule``)
at the batch sizes of ``shapes.GDN_RECURRENT``. Inputs as in a Qwen3-Next layer: bf16 q/k/v with
the L2 norm applied inside the op, fp32 g = logsigmoid(randn) / 16 with 25% of the heads at g = 0
(FlashQLA's benchmark), fp32 beta, an fp32 initial state, final state returned. Every provider is
checked against the reference before it is timed; eager (L2 flushed) and CUDA-graph times are
both reported, with tokens/s and FLA/ours ratios, and the targets.md gates as PASS / MISS.

    python benchmarks/bench_gdn.py [--out DIR] [--profile] [--tp [--heads 8/16 ...] [--cases 4x8k ...]]

Writes ``gdn_<gpu>.md`` (committed under benchmarks/results/) and raw JSONL rows. ``--tp`` instead
runs the tensor-parallel shard sweep (``TP_HEADS`` x ``TP_CASES``: what one GPU of a TP2/4/8
Qwen3-Next deployment sees, where the sequence-parallel state pass applies) and writes
``gdn_tp_<gpu>.md``; with ``--profile`` it adds the kernel breakdown at 2/4 heads, 1x32k. A sweep
split over several GPUs of one host (``CUDA_VISIBLE_DEVICES`` and ``--heads`` per process) becomes
one table with ``--render-from A/raw/gdn_tp_<gpu>.jsonl B/raw/gdn_tp_<gpu>.jsonl [--out DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_aura
from torch_aura.reference import gdn as ref
from torch_aura.testing import rel_rms

import _harness as H
import shapes


DTYPE = torch.bfloat16
# Qwen3-Next's 16/32 heads (q/k, v) on one GPU and split over TP2, TP4, TP8; K = V = 128
TP_HEADS = [(16, 32), (8, 16), (4, 8), (2, 4)]
TP_CASES = [("1x8k", [8192]), ("1x32k", [32768]), ("1x128k", [131072]), ("4x8k", [8192] * 4),
            next(c for c in shapes.GDN_CHUNK if c[0].startswith("varlen"))]
TP_PROFILE = ((2, 4), "1x32k")
# 16/32 heads at 1x128k (a whole model's heads, not a shard) is left out: the fp32 reference that
# checks each row before timing does not fit in 80 GB there.
TP_MAX_TOKEN_HEADS = 131072 * 16
CHECK_RATIO = 5e-3  # gdn.md §5: chunk vs reference
PEER_CHECK_RATIO = 1e-2  # FLA rounds at slightly different points (log2 G, tf32 merge)


def make_inputs(lens, H_, HV, K, V, seed=0):
    """q, k, v, g, beta, h0 and (cu_seqlens, chunk_indices) for packed varlen, else Nones."""
    g_ = torch.Generator(device="cuda").manual_seed(seed)
    fixed = len(set(lens)) == 1
    B, T = (len(lens), lens[0]) if fixed else (1, sum(lens))
    q = torch.randn(B, T, H_, K, device="cuda", dtype=DTYPE, generator=g_)
    k = torch.randn(B, T, H_, K, device="cuda", dtype=DTYPE, generator=g_)
    v = torch.randn(B, T, HV, V, device="cuda", dtype=DTYPE, generator=g_)
    g = F.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=g_)) / 16
    g[..., torch.arange(HV, device="cuda") % 4 == 0] = 0.0  # 25% of heads without decay
    beta = torch.rand(B, T, HV, device="cuda", generator=g_).sigmoid()
    h0 = torch.randn(len(lens), HV, K, V, device="cuda", generator=g_)
    if fixed:
        return (q, k, v, g, beta, h0), None, None
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    return (q, k, v, g, beta, h0), cu, torch_aura.gdn_chunk_indices(cu)


def segment_plan(lens, HV, V) -> int:
    """Chunks per segment of our sequence-parallel state pass at this shape (0: the serial pass)."""
    from torch_aura.triton_kernels.gdn import segments

    fixed = len(set(lens)) == 1
    nt = [-(-n // 64) for n in lens]
    return segments._segment_plan(torch.device("cuda"), len(lens), HV, V, nt[0] if fixed else 0, sum(nt), not fixed)


def fla_or_none():
    if importlib.util.find_spec("fla") is None:
        return None, None, "not installed"
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        return None, None, f"import failed: {type(e).__name__}: {e}"


def time_pair(fn):
    fn()
    fn()  # compile and tune outside any capture
    torch.cuda.synchronize()
    eager = H.time_us(fn)
    try:
        graph = H.time_us(fn, graph=True)
    except Exception as e:  # noqa: BLE001 - a peer that cannot be captured is reported, not fatal
        print(f"    graph capture failed: {type(e).__name__}: {str(e)[:120]}")
        graph = float("nan")
    return eager, graph


def measure_peer(row: dict, call, refs, ratio: float) -> None:
    """Check the peer's outputs against the reference ones, then time it (eager and graph) and
    record FLA/ours ratios; a peer that fails or raises is recorded as such, never timed."""
    try:
        outs = call()
        row["fla_err_vs_ref"] = max(rel_rms(o, r) for o, r in zip(outs, refs))
        if row["fla_err_vs_ref"] < ratio:
            row["fla_us"], row["fla_graph_us"] = time_pair(call)
            row["fla_host_us"] = H.host_us(call)
    except Exception as e:  # noqa: BLE001 - the peer's failure is a result, not a crash
        row["fla_error"] = f"{type(e).__name__}: {str(e)[:160]}"
    if "ours_us" in row and "fla_us" in row:
        row["speedup"] = row["fla_us"] / row["ours_us"]
        row["speedup_graph"] = row["fla_graph_us"] / row["ours_graph_us"]


def bench_chunk(fla_chunk, profile: bool):
    H_, HV, K, V = shapes.GDN_HEADS
    return [chunk_row(fla_chunk, name, lens, H_, HV, K, V, profile and name == "1x32k", name == "1x4k")
            for name, lens in shapes.GDN_CHUNK]


def bench_tp(fla_chunk, profile: bool, heads=None, cases=None, done=None):
    """The TP shard sweep: every head split of ``TP_HEADS`` at every ``TP_CASES`` length (or the ones
    named in ``heads`` ("8/16") and ``cases``); ``done(rows)`` after each row, so that a run cut short
    (a device call's time limit) still leaves the rows measured so far."""
    rows = []
    for H_, HV in TP_HEADS:
        for name, lens in TP_CASES:
            if sum(lens) * HV > TP_MAX_TOKEN_HEADS or (heads and f"{H_}/{HV}" not in heads) \
                    or (cases and name not in cases):
                continue
            rows.append(chunk_row(fla_chunk, name, lens, H_, HV, 128, 128, profile and ((H_, HV), name) == TP_PROFILE,
                                  False))
            if done is not None:
                done(rows)
    return rows


def chunk_row(fla_chunk, name, lens, H_, HV, K, V, profile: bool, time_ref: bool) -> dict:
    """One gdn_chunk case: ours and FLA checked against the reference, then timed eager and as a graph."""
    (q, k, v, g, beta, h0), cu, ci = make_inputs(lens, H_, HV, K, V)
    tokens = sum(lens)

    def ours():
        return torch.ops.aura.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True, False)

    o, s = ours()
    o_ref, s_ref = ref.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True, False)
    err = max(rel_rms(o, o_ref), rel_rms(s, s_ref))
    row = {"case": name, "tokens": tokens, "H": H_, "HV": HV, "K": K, "V": V, "err_vs_ref": err,
           "correct": err < CHECK_RATIO, "cps": segment_plan(lens, HV, V)}
    if row["correct"]:
        row["ours_us"], row["ours_graph_us"] = time_pair(ours)
        row["ours_host_us"] = H.host_us(ours)
        row["ours_Mtok_s"] = tokens / row["ours_us"]
    if fla_chunk is not None:
        cu64 = None if cu is None else cu.long()
        ci64 = None if ci is None else ci.long()

        def fla():
            return fla_chunk(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu64, chunk_indices=ci64)

        measure_peer(row, fla, (o_ref, s_ref), PEER_CHECK_RATIO)
    if time_ref:
        row["ref_us"] = H.time_us(lambda: ref.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True, False))
    if profile:
        row["ours_kernels"] = kernel_breakdown(ours)
        if fla_chunk is not None and "fla_us" in row:
            row["fla_kernels"] = kernel_breakdown(fla)
    print(f"{H_:>2}/{HV:<2} {name:>15}: ours {row.get('ours_us', float('nan')):8.1f} us (graph {row.get('ours_graph_us', float('nan')):8.1f})"
          f" | FLA {row.get('fla_us', float('nan')):8.1f} us (graph {row.get('fla_graph_us', float('nan')):8.1f})"
          f" | x{row.get('speedup', float('nan')):.2f} / x{row.get('speedup_graph', float('nan')):.2f}"
          f" | err {err:.1e} FLA err {row.get('fla_err_vs_ref', float('nan')):.1e} {row.get('fla_error', '')}"
          f" | host {row.get('ours_host_us', float('nan')):.0f} / {row.get('fla_host_us', float('nan')):.0f} us"
          f" | pass {row['cps'] or 'serial'}", flush=True)
    del q, k, v, g, beta, h0, o, s, o_ref, s_ref
    gc.collect()  # captured graphs of this row hold their memory pools until collected
    torch.cuda.empty_cache()
    return row


def bench_recurrent(fla_rec):
    H_, HV, K, V = shapes.GDN_HEADS
    rows = []
    for B in shapes.GDN_RECURRENT:
        (q, k, v, g, beta, pool), _, _ = make_inputs([1] * B, H_, HV, K, V, seed=1)
        q, k = F.normalize(q.float(), dim=-1).to(DTYPE), F.normalize(k.float(), dim=-1).to(DTYPE)
        idx = torch.arange(B, dtype=torch.int32, device="cuda")
        state_bytes = 2 * B * HV * K * V * 4  # read + write of the fp32 state
        pool_ref = pool.clone()
        o_ref = ref.gdn_recurrent(q, k, v, g, beta, pool_ref, idx)
        work = pool.clone()
        o = torch.ops.aura.gdn_recurrent(q, k, v, g, beta, work, idx)
        err = max(rel_rms(o, o_ref), rel_rms(work, pool_ref))
        row = {"case": f"B{B}", "B": B, "err_vs_ref": err, "correct": err < 2e-3, "state_MB": state_bytes / 1e6}
        if row["correct"]:
            # the pool is updated in place each call; timing repeats the step on evolving (bounded) states
            ours = lambda: torch.ops.aura.gdn_recurrent(q, k, v, g, beta, work, idx)  # noqa: E731
            row["ours_us"], row["ours_graph_us"] = time_pair(ours)
            row["ours_TBs"] = state_bytes / row["ours_us"] / 1e6
            row["ours_graph_TBs"] = state_bytes / row["ours_graph_us"] / 1e6
        if fla_rec is not None:
            # keywords: FLA's fifth positional parameter is gk (per-key decay), not beta
            fla = lambda: fla_rec(q, k, v, g=g, beta=beta, initial_state=pool, output_final_state=True)  # noqa: E731
            measure_peer(row, fla, (o_ref, pool_ref), 2e-3)
        if B == 1:
            row["ref_us"] = H.time_us(lambda: ref.gdn_recurrent(q, k, v, g, beta, pool_ref, idx))
        rows.append(row)
        print(f"recurrent B{B:>4}: ours {row.get('ours_us', float('nan')):7.1f} us (graph {row.get('ours_graph_us', float('nan')):7.1f},"
              f" {row.get('ours_TBs', float('nan')):.2f} TB/s) | FLA {row.get('fla_us', float('nan')):7.1f} us"
              f" (graph {row.get('fla_graph_us', float('nan')):7.1f}) | err {err:.1e} {row.get('fla_error', '')}", flush=True)
    return rows


def kernel_breakdown(fn) -> list[tuple[str, float]]:
    """Device time per kernel name (us per call) of one call, from the torch profiler."""
    fn()
    torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for name, (_, ms) in H.kernel_times(lambda: [fn() for _ in range(3)], "cuda").items():
        totals[name[:60]] = totals.get(name[:60], 0.0) + ms * 1e3 / 3
    return sorted(totals.items(), key=lambda kv: -kv[1])[:10]


def gates(chunk_rows, rec_rows):
    out = []
    by = {r["case"]: r for r in chunk_rows if "speedup" in r}
    for mode, key in (("eager", "speedup"), ("CUDA graph", "speedup_graph")):
        vals = [by[c][key] for c in by]
        out.append((f"gdn_chunk >= 1.5x FLA, {mode} (stretch 2.5x)",
                    "PASS" if vals and min(vals) >= 1.5 and len(by) == len(chunk_rows) else "MISS",
                    ", ".join(f"{c}: x{by[c][key]:.2f}" for c in by) or "FLA not measured"))
    rec = {r["B"]: r for r in rec_rows if r["correct"]}
    if 1 in rec:
        r = rec[1]
        out.append(("gdn_recurrent <= 10 us at B=1 (graph / eager)", "PASS" if r["ours_graph_us"] <= 10 else "MISS",
                    f"{r['ours_graph_us']:.1f} / {r['ours_us']:.1f} us"))
    big = [r for b, r in rec.items() if b >= 32]
    if big:
        out.append(("gdn_recurrent >= 2.7 TB/s of state at B >= 32 (eager)",
                    "PASS" if all(r["ours_TBs"] >= 2.7 for r in big) else "MISS",
                    ", ".join(f"B{r['B']}: {r['ours_TBs']:.2f}" for r in big)))
    return out


def _f(x, fmt=".1f"):
    return "n/a" if x is None or x != x else format(x, fmt)


def render(facts, copy_tbs, fla_version, chunk_rows, rec_rows) -> str:
    H_, HV, K, V = shapes.GDN_HEADS
    lines = [
        f"# Gated DeltaNet on {facts['gpu']}", "",
        f"torch {facts['torch']}, CUDA {facts['cuda']}, triton {facts['triton']}, FLA {fla_version}, "
        f"commit `{facts['commit']}`. Generated by `benchmarks/bench_gdn.py` (do not edit by hand).", "",
        f"Heads {H_} q/k, {HV} v, K = V = {K}; bf16 q/k/v, L2 norm inside the op, fp32 g (25% of heads at g = 0), "
        f"beta and initial state; final state returned. Times are medians in microseconds: eager = "
        f"`do_bench` (L2 flushed), graph = `do_bench_cudagraph`. Ratio = FLA time / ours. Every provider "
        f"was checked against the reference first (rel RMS shown). Copy ceiling this run: {copy_tbs:.2f} TB/s.", "",
        "## gdn_chunk (prefill)", "",
        "| case | tokens | ours | ours graph | FLA | FLA graph | ratio | ratio graph | ours Mtok/s | err ours / FLA |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in chunk_rows:
        lines.append(f"| {r['case']} | {r['tokens']} | {_f(r.get('ours_us'))} | {_f(r.get('ours_graph_us'))} | "
                     f"{_f(r.get('fla_us'))} | {_f(r.get('fla_graph_us'))} | {_f(r.get('speedup'), '.2f')}x | "
                     f"{_f(r.get('speedup_graph'), '.2f')}x | {_f(r.get('ours_Mtok_s'), '.2f')} | "
                     f"{r['err_vs_ref']:.1e} / {_f(r.get('fla_err_vs_ref'), '.1e')} |")
    ref_row = next((r for r in chunk_rows if "ref_us" in r), None)
    if ref_row:
        lines += ["", f"Reference (pure PyTorch) at {ref_row['case']}: {ref_row['ref_us']:.0f} us eager."]
    for r in chunk_rows:
        for who in ("ours", "fla"):
            if f"{who}_kernels" in r:
                lines += ["", f"Kernel breakdown, {who}, {r['case']} (us per call):", ""]
                lines += [f"- `{n}`: {t:.1f}" for n, t in r[f"{who}_kernels"]]
    lines += ["", "## gdn_recurrent (decode, one token, fp32 state pool)", "",
              "| B | state MB (r+w) | ours | ours graph | ours TB/s (eager / graph) | FLA | FLA graph | ratio | ratio graph |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rec_rows:
        lines.append(f"| {r['B']} | {r['state_MB']:.1f} | {_f(r.get('ours_us'))} | {_f(r.get('ours_graph_us'))} | "
                     f"{_f(r.get('ours_TBs'), '.2f')} / {_f(r.get('ours_graph_TBs'), '.2f')} | {_f(r.get('fla_us'))} | "
                     f"{_f(r.get('fla_graph_us'))} | {_f(r.get('speedup'), '.2f')}x | {_f(r.get('speedup_graph'), '.2f')}x |")
    lines += ["", "## Targets (docs/targets.md)", "", "| gate | result | measured |", "|---|---|---|"]
    lines += [f"| {w} | {res} | {vals} |" for w, res, vals in gates(chunk_rows, rec_rows)]
    return "\n".join(lines) + "\n"


def tp_gates(rows):
    """issue 26's targets at the TP shard shapes: >= 2x FLA as a graph and >= 1.5x eager at every
    split of the heads; >= 2.5x at the full 16/32 heads."""
    out = []
    for label, sel, eager_min, graph_min in (("TP shards (8/16, 4/8, 2/4)", lambda r: r["HV"] < 32, 1.5, 2.0),
                                             ("16/32 heads", lambda r: r["HV"] == 32, 2.5, 2.5)):
        group = [r for r in rows if sel(r)]
        done = [r for r in group if "speedup" in r]
        for mode, key, lo in (("eager", "speedup", eager_min), ("CUDA graph", "speedup_graph", graph_min)):
            ok = done and len(done) == len(group) and min(r[key] for r in done) >= lo
            worst = min(done, key=lambda r: r[key]) if done else None
            out.append((f"gdn_chunk {label} >= {lo}x FLA, {mode}", "PASS" if ok else "MISS",
                        f"min x{worst[key]:.2f} at {worst['H']}/{worst['HV']} {worst['case']}" if worst
                        else "FLA not measured"))
    return out


def render_tp(facts, copy_tbs, fla_version, rows) -> str:
    lines = [
        f"# Gated DeltaNet at tensor-parallel shard shapes on {facts['gpu']}", "",
        f"torch {facts['torch']}, CUDA {facts['cuda']}, triton {facts['triton']}, FLA {fla_version}, "
        f"commit `{facts['commit']}`. Generated by `benchmarks/bench_gdn.py --tp` (do not edit by hand).", "",
        "Heads q/k / v as one GPU of Qwen3-Next's 16/32 sees them at TP1/2/4/8, K = V = 128; bf16 q/k/v, L2 norm "
        "inside the op, fp32 g (25% of heads at g = 0), beta and initial state; final state returned. Times are "
        "medians in microseconds: eager = `do_bench` (L2 flushed), graph = `do_bench_cudagraph`. Ratio = FLA time "
        "/ ours. Every provider was checked against the reference first (rel RMS shown). `pass`: our state pass, "
        f"serial or sequence-parallel with that many 64-token chunks per segment. Copy ceiling this run: "
        f"{copy_tbs:.2f} TB/s. `host`: host time per eager call, ours / FLA (`_harness.host_us`); where it "
        "exceeds the graph time, eager calls wait for the host.", "",
        "| heads | case | tokens | pass | ours | ours graph | FLA | FLA graph | ratio | ratio graph | host ours / FLA "
        "| err ours / FLA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['H']}/{r['HV']} | {r['case']} | {r['tokens']} | {r['cps'] or 'serial'} | "
                     f"{_f(r.get('ours_us'))} | {_f(r.get('ours_graph_us'))} | {_f(r.get('fla_us'))} | "
                     f"{_f(r.get('fla_graph_us'))} | {_f(r.get('speedup'), '.2f')}x | "
                     f"{_f(r.get('speedup_graph'), '.2f')}x | {_f(r.get('ours_host_us'), '.0f')} / "
                     f"{_f(r.get('fla_host_us'), '.0f')} | {r['err_vs_ref']:.1e} / {_f(r.get('fla_err_vs_ref'), '.1e')} |")
    for r in rows:
        for who in ("ours", "fla"):
            if f"{who}_kernels" in r:
                lines += ["", f"Kernel breakdown, {who}, {r['H']}/{r['HV']} {r['case']} (us per call):", ""]
                lines += [f"- `{n}`: {t:.1f}" for n, t in r[f"{who}_kernels"]]
    lines += ["", "## Targets (issue 26)", "", "| gate | result | measured |", "|---|---|---|"]
    lines += [f"| {w} | {res} | {vals} |" for w, res, vals in tp_gates(rows)]
    return "\n".join(lines) + "\n"


def render_tp_from(paths, out_dir) -> int:
    """One TP table from the raw rows of several ``--tp`` runs at one commit on one GPU model (a sweep
    split over the GPUs of one host: each GPU times its own head splits), rows in sweep order."""
    rows = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        print("--render-from: no rows in", *paths)
        return 1
    runs = {(r["commit"], r["gpu"], r["fla_version"]) for r in rows}
    if len(runs) != 1:
        print("--render-from: rows from different commits, GPUs or FLA versions:", sorted(runs))
        return 1
    order = [(h, hv, name) for h, hv in TP_HEADS for name, _ in TP_CASES]
    rows.sort(key=lambda r: order.index((r["H"], r["HV"], r["case"])))
    facts = {k: rows[0][k] for k in ("gpu", "torch", "cuda", "triton", "commit")}
    copy_tbs = min(r["copy_tbs"] for r in rows)
    md = render_tp(facts, copy_tbs, rows[0]["fla_version"], rows)
    print(f"wrote {H.write('gdn_tp', facts, rows, md, out_dir)}\n\n{md}")
    return 0 if all(r["correct"] for r in rows) else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--render-from" in argv:
        p = argparse.ArgumentParser(description="merge the raw rows of several --tp runs into one table")
        p.add_argument("--render-from", nargs="+", required=True, metavar="JSONL")
        p.add_argument("--out", type=Path, default=None)
        args = p.parse_args(argv)
        return render_tp_from(args.render_from, args.out)

    def extra_args(parser):
        parser.add_argument("--profile", action="store_true", help="per-kernel time breakdown at 1x32k")
        parser.add_argument("--tp", action="store_true",
                            help="the tensor-parallel shard sweep (16/32, 8/16, 4/8, 2/4 heads) instead")
        parser.add_argument("--heads", nargs="*", help="with --tp: only these head splits, e.g. 8/16 2/4")
        parser.add_argument("--cases", nargs="*", help="with --tp: only these cases, e.g. 1x8k 4x8k")

    started = H.start("bench_gdn", "gdn_chunk", __doc__, argv, extra_args=extra_args)
    if started is None:
        return 1
    args, facts, copy_tbs = started
    fla_chunk, fla_rec, fla_version = fla_or_none()
    print(f"{facts['gpu']} | torch {facts['torch']} | triton {facts['triton']} | FLA {fla_version} | "
          f"commit {facts['commit']} | copy {copy_tbs:.2f} TB/s")
    if args.tp:
        def save(rows):  # the run's copy ceiling and FLA version ride along for --render-from
            run = {**facts, "copy_tbs": copy_tbs, "fla_version": fla_version}
            return H.write("gdn_tp", run, rows, render_tp(facts, copy_tbs, fla_version, rows), args.out)

        rows = bench_tp(fla_chunk, args.profile, args.heads, args.cases, done=save)
        md = render_tp(facts, copy_tbs, fla_version, rows)
        path = save(rows)
        print(f"\nwrote {path}\n")
        print(md)
        return 0 if all(r["correct"] for r in rows) else 1
    chunk_rows = bench_chunk(fla_chunk, args.profile)
    rec_rows = bench_recurrent(fla_rec)
    md = render(facts, copy_tbs, fla_version, chunk_rows, rec_rows)
    path = H.write("gdn", facts, chunk_rows + rec_rows, md, args.out)
    print(f"\nwrote {path}\n")
    print(md)
    return 0 if all(r["correct"] for r in chunk_rows + rec_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
