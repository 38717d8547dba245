"""One aura_decode call per shape, for Nsight Compute (the kernels' profile behind bench_aura.py's numbers).

    ncu --set full -k regex:aura_flash_p1 -c 2 python benchmarks/profile_aura.py
"""

import torch

from bench_aura import build


for B, T in ((8, 32768), (1, 32768)):
    *_, aura_args, _ = build(B, 32, 8, 128, T, None, "aura4v2")
    torch.ops.aura.aura_decode(*aura_args, None, 0)
    torch.cuda.synchronize()
    print(f"profiled aura4v2 B={B} T={T}")
