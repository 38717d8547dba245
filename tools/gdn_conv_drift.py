"""Which bf16 causal conv keeps a Qwen3-Next-shaped stack closer to fp32: ours or transformers' fallback?

transformers' torch fallback rounds the conv output to bf16 before SiLU; ``torch_aura.causal_conv1d``
accumulates and applies SiLU in fp32 and rounds once. Both runs use our GDN kernels (``enable``), so
the conv is the only difference; the truth is the same model in fp32. Prints the last-token logits'
cosine per prompt length (docs/gdn.md §6.2).

    python tools/gdn_conv_drift.py [--lens 4096,32768] [--device cuda]
"""

from __future__ import annotations

import argparse
import copy
import importlib

import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_aura.integrations import transformers as aura_tf

CONV_FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lens", default="4096,32768")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="small heads (a CPU smoke test)")
    a = p.parse_args()
    module = importlib.import_module("transformers.models.qwen3_next.modeling_qwen3_next")
    theirs = {n: getattr(module, n) for n in CONV_FUNCTIONS}
    heads = dict(linear_num_key_heads=2, linear_num_value_heads=4, num_attention_heads=4) if a.tiny else \
        dict(linear_num_key_heads=16, linear_num_value_heads=32, num_attention_heads=16)
    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"], vocab_size=4096,
        hidden_size=1024, intermediate_size=1024, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        num_experts=8, num_experts_per_tok=2, num_key_value_heads=2, head_dim=256, linear_key_head_dim=128,
        linear_value_head_dim=128, **heads)
    cfg._attn_implementation = "sdpa"
    fp32 = transformers.Qwen3NextForCausalLM(cfg).eval().to(a.device)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    aura_tf.enable(fp32)
    aura_tf.enable(bf16)
    ours = {n: getattr(module, n) for n in CONV_FUNCTIONS}

    def cos(x, y):
        return torch.nn.functional.cosine_similarity(x, y, dim=0).item()

    # the fp32 truth's attention layer: SDPA's math path would hold the T x T scores (64 GiB at 32k)
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if a.device == "cuda" else \
        [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    for T in map(int, a.lens.split(",")):
        ids = torch.randint(1, cfg.vocab_size, (1, T), device=a.device)
        with torch.inference_mode(), sdpa_kernel(fused):
            def last(model):
                return model(ids, use_cache=False, logits_to_keep=1).logits[0, -1].double()

            truth, with_ours = last(fp32), last(bf16)
            for name, fn in theirs.items():
                setattr(module, name, fn)
            with_theirs = last(bf16)
            for name, fn in ours.items():
                setattr(module, name, fn)
        print(f"T={T}: cosine to fp32 - bf16 with our conv {cos(with_ours, truth):.5f}, with transformers' conv "
              f"{cos(with_theirs, truth):.5f}; between them {cos(with_ours, with_theirs):.5f}", flush=True)


if __name__ == "__main__":
    main()
