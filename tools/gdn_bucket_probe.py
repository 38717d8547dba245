"""Does the first prompt past the GDN prep kernels' many-chunks bucket compile a Triton kernel? (GPU; gdn.md §6.4)

Replays, in one fresh process, the order that stalled the transformers stream on the H200: calls with an fp32
``beta`` on both sides of the bucket (the e2e bench's adapter timing), then the model's bf16 ``beta`` on the
few-chunks side and, last, past the edge (16/32 heads, K = V = 128, bf16, L2 norm in the op, B = 1). Prints
the kernels each call compiled; exits 1 if the last call compiled any.

    python tools/gdn_bucket_probe.py
"""

from __future__ import annotations

import sys

import torch
from triton import knobs

import torch_aura  # noqa: F401  (registers the ops)
from torch_aura.triton_kernels._tune import sm_count
from torch_aura.triton_kernels.gdn.prep import MANY_CHUNKS_PER_SM

H, HV, K, V = 16, 32, 128, 128


def main() -> int:
    compiled: list[str] = []
    knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit: (
        None if cache_hit else compiled.append(str(getattr(src, "name", "?"))))
    edge = -(-MANY_CHUNKS_PER_SM * sm_count(torch.device("cuda")) // HV) * 64  # tokens where the bucket flips
    calls = [(4096, torch.float32), (8 * edge, torch.float32), (1002, torch.bfloat16), (edge + 478, torch.bfloat16)]
    for T, beta_dtype in calls:
        q, k = (torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(1, T, HV, V, device="cuda", dtype=torch.bfloat16)
        g, beta = -torch.rand(1, T, HV, device="cuda"), torch.rand(1, T, HV, device="cuda").to(beta_dtype)
        start = len(compiled)
        torch.ops.aura.gdn_chunk(q, k, v, g, beta, None, None, None, None, True, False)
        torch.cuda.synchronize()
        side = "many" if T > edge else "few"
        print(f"1x{T:6d} ({side} chunks) beta {str(beta_dtype).replace('torch.', ''):8s} compiled "
              f"{compiled[start:] or 'nothing'}")
    last = compiled[start:]
    print("the first bf16 prompt past the edge compiled " + (f"{last}: a stall" if last else "nothing"))
    return 1 if last else 0


if __name__ == "__main__":
    sys.exit(main())
