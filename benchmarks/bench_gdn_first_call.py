"""Gated DeltaNet as a chat server meets it: the first call at each new prompt length (issue 38).

A stream of prefills of lengths never seen before (16/32 heads, K = V = 128, bf16, the L2 norm in
the op, as in a Qwen3-Next layer), each timed at its first call (compile and tuning included) and
again once warm, in fresh processes so that nothing is cached in memory:

* ``cold``: an empty Triton cache and no tuned table (what the very first run on a new GPU pays);
* ``warm``: a fresh process with the Triton cache and the tuned table that ``cold`` left behind
  (every later run on that machine); target: first call <= 2 s;
* ``warmup``: the same, after ``torch_aura.gdn_warmup`` (every plan compiled and tuned up front);
  target: every first call <= 1.2x the warm call of the same shape;
* FLA 0.6.0 (when installed), cold and warm, in the same run.

Every provider's output is checked against the reference on the first shape before anything is
timed. ``--write-table`` copies the tuned table this run built into the package's shipped tables
(``triton_kernels/tuned/<gpu>.json``).

    python benchmarks/bench_gdn_first_call.py [--out DIR] [--write-table]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _harness

HEADS, KV = (16, 32), 128
# (B, T): the stream; the first is the process's first call
STREAM = [(1, 1000), (1, 1500), (1, 7777), (2, 3000), (4, 16384), (1, 12345)]
STALL_RATIO, FIRST_CALL_S = 1.2, 2.0


def child(provider: str, warmup: bool, no_shipped_table: bool) -> dict:
    """Runs in a fresh process: the stream's first and warm times (seconds) for one provider."""
    import torch
    import torch.nn.functional as F

    import torch_aura
    from torch_aura.reference import gdn as ref
    from torch_aura.testing import rel_rms

    if no_shipped_table:
        from torch_aura.triton_kernels import _tune

        _tune.SHIPPED_TABLES = Path("/nonexistent")
    H, HV = HEADS
    if provider == "fla":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

        def call(q, k, v, g, beta):
            return fla_chunk(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)[0]
    else:
        def call(q, k, v, g, beta):
            return torch_aura.gdn_chunk(q, k, v, g, beta, use_qk_l2norm=True)[0]

    def inputs(B, T, seed=0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(B, T, H, KV, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(B, T, H, KV, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(B, T, HV, KV, device="cuda", dtype=torch.bfloat16, generator=gen)
        g = F.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=gen)) / 16
        return q, k, v, g, torch.rand(B, T, HV, device="cuda", generator=gen).sigmoid()

    out = {"provider": provider, "warmup_s": None, "rows": []}
    torch.empty(1, device="cuda")  # the CUDA context, outside the timed first call
    if warmup:
        report = torch_aura.gdn_warmup(H, HV, KV, KV, torch.bfloat16, "cuda", initial_state=False)
        out["warmup_s"], out["warmup_keys_timed"] = report.seconds, report.keys_timed
    for i, (B, T) in enumerate(STREAM):
        x = inputs(B, T)
        first, o = _harness.timed(lambda: call(*x), "cuda")
        if i == 0:  # correctness before any time is reported
            r = ref.gdn_chunk(*(t[:, :512] for t in x), use_qk_l2norm=True)[0]
            err = rel_rms(call(*(t[:, :512] for t in x)).float(), r.float())
            assert err < 1e-2, f"{provider}: rel RMS {err:.2e} against the reference"
        warm = [_harness.timed(lambda: call(*x), "cuda")[0] for _ in range(3)]
        out["rows"].append({"B": B, "T": T, "first_s": first, "warm_s": sorted(warm)[1]})
        del o
    return out


def run_child(provider, env, warmup=False, no_shipped_table=False) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps([provider, warmup, no_shipped_table])]
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"provider": provider, "error": (proc.stderr or proc.stdout)[-800:]}
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=_harness.RESULTS)
    parser.add_argument("--write-table", action="store_true")
    args = parser.parse_args(argv)
    import importlib.util

    import torch

    from torch_aura.triton_kernels import _tune

    work = Path(tempfile.mkdtemp(prefix="gdn_first_call_"))
    ours_env = {"TRITON_CACHE_DIR": str(work / "triton_ours"), _tune.TUNE_CACHE_ENV: str(work / "tune")}
    scenarios = [("ours", "cold", run_child("ours", ours_env, no_shipped_table=True)),
                 ("ours", "warm", run_child("ours", ours_env)),
                 ("ours", "warmup", run_child("ours", ours_env, warmup=True))]
    if importlib.util.find_spec("fla") is not None:
        fla_env = {"TRITON_CACHE_DIR": str(work / "triton_fla")}
        scenarios += [("fla", "cold", run_child("fla", fla_env)), ("fla", "warm", run_child("fla", fla_env))]
    gpu = torch.cuda.get_device_name()
    lines = [f"# gdn_chunk at new prompt lengths ({gpu})", "",
             f"torch_aura commit `{_harness.commit()}`, torch {torch.__version__}, Triton "
             f"{__import__('triton').__version__}; {HEADS[0]}/{HEADS[1]} heads, K = V = {KV}, bf16, L2 norm in the op. "
             "Seconds; each scenario is a fresh process (cold: empty Triton cache, no tuned table; warm: the "
             "caches cold left; warmup: warm plus `torch_aura.gdn_warmup` first). first / warm = the first call "
             "at that shape over the median of the next three.", "",
             "| provider | scenario | warm-up s | " + " | ".join(f"B{B} T{T}" for B, T in STREAM) + " |",
             "|---|---|---|" + "---|" * len(STREAM)]
    verdicts = []
    for provider, scenario, res in scenarios:
        if "error" in res:
            lines.append(f"| {provider} | {scenario} | failed: {res['error'][-200:].replace(chr(10), ' ')} |")
            continue
        cells = [f"{r['first_s']:.3f} / {r['warm_s'] * 1e3:.2f} ms ({r['first_s'] / r['warm_s']:.1f}x)"
                 for r in res["rows"]]
        wu = "-" if res.get("warmup_s") is None else f"{res['warmup_s']:.1f} ({res.get('warmup_keys_timed')} keys timed)"
        lines.append(f"| {provider} | {scenario} | {wu} | " + " | ".join(cells) + " |")
        if provider == "ours" and scenario == "warm":
            verdicts.append(f"- fresh process, warm caches: first call {res['rows'][0]['first_s']:.2f} s "
                            f"(target <= {FIRST_CALL_S} s): {'met' if res['rows'][0]['first_s'] <= FIRST_CALL_S else 'missed'}")
        if provider == "ours" and scenario == "warmup":
            worst = max(r["first_s"] / r["warm_s"] for r in res["rows"])
            verdicts.append(f"- after gdn_warmup: worst first / warm {worst:.2f}x (target <= {STALL_RATIO}x): "
                            f"{'met' if worst <= STALL_RATIO else 'missed'}")
    md = "\n".join(lines + [""] + verdicts) + "\n"
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    slug = _harness.gpu_slug(gpu)
    (args.out / f"gdn_first_call_{slug}.md").write_text(md)
    table = _tune.user_table_path(_tune.gpu_slug(torch.device("cuda")))
    made = work / "tune" / table.name
    if args.write_table and made.exists():
        _tune.SHIPPED_TABLES.mkdir(exist_ok=True)
        dest = _tune.SHIPPED_TABLES / f"{_tune.gpu_slug(torch.device('cuda'))}.json"
        shutil.copy(made, dest)
        print("tuned table written to", dest)
        if os.environ.get("OUT"):
            shutil.copy(made, Path(os.environ["OUT"]) / dest.name)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # run_child's fresh process
        print("RESULT", json.dumps(child(*json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
