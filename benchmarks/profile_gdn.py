"""One gdn_chunk call (ours, then FLA 0.6.0 when installed) at 1x32k, 16/32 heads, K = V = 128, bf16,
for Nsight Compute: the kernels' profile behind bench_gdn.py.

    ncu --nvtx --nvtx-include "prof/" --set full python benchmarks/profile_gdn.py

Both are called twice first (Triton compiles and our Tuner picks its configs there, outside the
profiled range); only the calls inside the NVTX range ``prof`` are meant to be profiled.
"""

import torch
import torch.nn.functional as F

import torch_aura  # noqa: F401  (registers torch.ops.aura)


def main() -> None:
    B, T, H, HV, K, V = 1, 32768, 16, 32, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(B, T, HV, V, device="cuda", dtype=torch.bfloat16, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=gen)) / 16
    beta = torch.rand(B, T, HV, device="cuda", generator=gen).sigmoid()
    h0 = torch.randn(B, HV, K, V, device="cuda", generator=gen)
    calls = [lambda: torch.ops.aura.gdn_chunk(q, k, v, g, beta, None, h0, None, None, True, False)]
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        calls.append(lambda: chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True))
    except ImportError as e:
        print(f"FLA not profiled: {e}")
    for call in calls:
        call()
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
