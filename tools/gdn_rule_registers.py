"""Registers, spills and occupancy of the GDN decode rule, compiled for sm_90 without a GPU.

The rule streams its state (docs/gdn.md §6.1): how many programs an SM holds, so how many state bytes are in
flight, is set by its registers per thread. This compiles ``triton_kernels/gdn/recurrent.py``'s kernel exactly
as a launch would (Triton's own argument specialisation and the launcher's constexprs and options, at a
serving step's shapes) and reads ptxas's report (``ptxas -v``, the ptxas Triton ships).

    python tools/gdn_rule_registers.py                       # vLLM's pool, the bench's default rule variants
    python tools/gdn_rule_registers.py --layout transformers --variants auto,auto:one,64x4:one:r128

Variants use ``bench_vllm_gdn_ops.py --recurrent-tiles``'s syntax: ``auto`` or ``BVxW``, then ``:one``, ``:sN``
and ``:rN``. Occupancy counts the register file only (64K registers per SM, at most 32 programs); shared memory
and the scheduler are not modelled.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_vllm_gdn_ops import rule_settings, rule_settings_now  # noqa: E402  (one parser for both)

REGISTERS_PER_SM, PROGRAMS_PER_SM = 65536, 32
SHAPES = {"qwen3-next": (16, 32, 128, 128)}  # H, HV, K, V


def decode_args(layout: str, batch: int, shape: str = "qwen3-next") -> tuple[tuple, dict]:
    """The rule's launcher arguments for one decode step: ``vllm`` (its packed decode: q, k, v row views of the
    mixed projection, raw gates from ``[b | a]``, a bf16 ``[P, HV, V, K]`` pool, slots with null slot 0) or
    ``transformers`` (contiguous q, k, v, fp32 gates, an fp32 ``[B, HV, K, V]`` state)."""
    H, HV, K, V = SHAPES[shape]
    if layout == "vllm":
        mixed = torch.empty(batch, 2 * H * K + HV * V, dtype=torch.bfloat16)
        q, k = (mixed[:, i * H * K:(i + 1) * H * K].view(batch, 1, H, K) for i in range(2))
        v = mixed[:, 2 * H * K:].view(batch, 1, HV, V)
        ba = torch.empty(batch, 2 * HV, dtype=torch.bfloat16)
        pool = torch.empty(batch + 8, HV, V, K, dtype=torch.bfloat16)
        slots = torch.arange(1, batch + 1, dtype=torch.int32)
        return (q, k, v, ba[:, None, HV:], ba[:, None, :HV], pool, slots, None, None, True, True), dict(
            gates=(torch.empty(HV), torch.empty(HV)), null=0)
    q, k = torch.empty(batch, 1, H, K, dtype=torch.bfloat16), torch.empty(batch, 1, H, K, dtype=torch.bfloat16)
    v = torch.empty(batch, 1, HV, V, dtype=torch.bfloat16)
    g, beta = torch.empty(batch, 1, HV), torch.empty(batch, 1, HV)
    return (q, k, v, g, beta, torch.empty(batch, HV, K, V), None, None, None, True, False), {}


def compile_sm90(kernel, args: tuple, kwargs: dict):
    """``kernel[grid](*args, **kwargs)``'s variant compiled for sm_90, specialised as Triton's launch would
    specialise it (alignment, divisibility, ints equal to 1), without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers per thread, spill store bytes) from ``ptxas -v`` (the one Triton compiles with) on ``ptx``."""
    from triton.backends.nvidia.compiler import get_ptxas

    arch = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        done = subprocess.run([get_ptxas(90).path, f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, check=True)
    regs = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    spill = re.search(r"(\d+) bytes spill stores", done.stderr)
    return regs, int(spill.group(1)) if spill else 0


def measure(layout: str, batch: int, variant: str) -> dict:
    """One variant's compile facts: its tile, warps, registers, spills, programs per SM and state bytes in flight
    per SM (each program holds its whole ``[K, BV]`` tile)."""
    from torch_aura.triton_kernels.gdn import recurrent

    defaults = rule_settings_now()
    args, engine = decode_args(layout, batch)
    try:
        vars(recurrent).update(rule_settings(variant, defaults))
        recurrent._geometry_of.forget()
        gates = engine.get("gates", (None, None))
        extra = (*gates, engine["null"]) if engine else ()
        (shape, dtype, _), _, _, ints, options, _ = recurrent._geometry(*args, *extra)
        o = torch.empty(shape, dtype=dtype)
        q, k, v, g, beta, state, rows, cu = args[:8]
        launch_args = (q, k, v, g, beta, state, rows, cu, o, *gates, *ints)
        compiled = compile_sm90(recurrent._gdn_recurrent_kernel, launch_args, dict(options))
    finally:
        vars(recurrent).update(defaults)
        recurrent._geometry_of.forget()
    regs, spill = ptxas_report(compiled.asm["ptx"])
    warps = options["num_warps"]
    programs = min(PROGRAMS_PER_SM, REGISTERS_PER_SM // (regs * 32 * warps))
    tile_bytes = state.element_size() * args[0].shape[-1] * options["BV"]
    return {"variant": variant, "tile": f"{options['BV']}x{warps}", "one_token": options["ONE_TOKEN"],
            "registers": regs, "spill_bytes": spill, "programs_per_sm": programs,
            "state_kb_in_flight_per_sm": programs * tile_bytes / 1024}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", choices=("vllm", "transformers"), default="vllm")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--variants", type=lambda s: s.split(","),
                   default=["auto", "auto:one", "32x1", "32x1:one:r168", "32x1:one:r192"])
    args = p.parse_args(argv)
    print(f"GDN decode rule on sm_90, {args.layout} layout, B = {args.batch}\n")
    print("| variant | tile | one token | registers | spill bytes | programs per SM | state KB in flight per SM |")
    print("|---|---|---|---|---|---|---|")
    for variant in args.variants:
        r = measure(args.layout, args.batch, variant)
        print(f"| {r['variant']} | {r['tile']} | {r['one_token']} | {r['registers']} | {r['spill_bytes']} | "
              f"{r['programs_per_sm']} | {r['state_kb_in_flight_per_sm']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
