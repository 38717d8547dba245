"""``python -m torch_aura``: the main job.

Runs the three families on the default device (CUDA, else MPS, else CPU) with embedded shapes and
prints one line per family: the checks (against an independent oracle: exact fp64 attention for
decode and AURA, the fp64 token-by-token recurrence for GDN; and, where a kernel serves the op,
against the pure-PyTorch reference), our time beside the peer a user already has on the same
device and inputs (SDPA; FLA's or transformers' GDN when importable), and the bandwidth or memory
saved. Exits 1 if any check fails. CPU shapes finish in under 30 s on two cores; GPU shapes are the
decode/prefill shapes of targets.md.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

import torch

import torch_aura
from torch_aura import reference
from torch_aura.testing import exact_decode_attention, max_rel, rel_rms

# (name, shapes on CPU, shapes on a GPU)
SHAPES = {
    "decode": (dict(B=2, Hq=32, Hkv=8, D=128, T=2048, dtype=torch.float32),
               dict(B=8, Hq=32, Hkv=8, D=128, T=8192, dtype=torch.bfloat16)),
    "aura": (dict(B=2, Hq=32, Hkv=8, D=128, T=1024, scheme="aura4v2", dtype=torch.float32),
             dict(B=8, Hq=32, Hkv=8, D=128, T=8192, scheme="aura4v2", dtype=torch.bfloat16)),
    "gdn": (dict(B=1, T=512, H=4, HV=8, K=128, V=128, dtype=torch.float32),
            dict(B=1, T=4096, H=16, HV=32, K=128, V=128, dtype=torch.bfloat16)),
}


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn()`` in seconds, after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def served_by_kernel(op: str, device: torch.device) -> bool:
    """Whether a kernel (not the reference) serves ``op`` here: only then is a comparison with the
    reference a test rather than the reference compared with itself."""
    return torch_aura.backends.has_kernel(op, device.type)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(1), b.double().flatten(1), dim=-1).mean().item()


# --------------------------------------------------------------------------------------- peers
def sdpa_decode(q, k, v):
    """The attention a user already has: SDPA over the same contiguous cache, one query token."""
    return torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]


def gdn_peer():
    """``(name, fn(q, k, v, g, beta) -> o)``: FLA's chunk kernel on CUDA when importable, else
    transformers' torch implementation when importable, else None."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return "FLA chunk_gated_delta_rule", lambda q, k, v, g, b: chunk_gated_delta_rule(q, k, v, g, b)[0], "cuda"
    except Exception:
        pass
    try:
        import transformers
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

        transformers.logging.set_verbosity_error()  # its "FLA is not installed" notice is not ours

        return ("transformers torch_chunk_gated_delta_rule",
                lambda q, k, v, g, b: torch_chunk_gated_delta_rule(q, k, v, g, b)[0], None)
    except Exception:
        return None


# --------------------------------------------------------------------------------------- families
# Each runner returns a Row: the op, the shape, its checks, our time, the peer's (name, time) on the
# same device and inputs, and a note (memory saved, bandwidth).
def run_decode(device, s, repeats):
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(s["B"], s["Hq"], s["D"], generator=g).to(device, s["dtype"])
    k = torch.randn(s["B"], s["Hkv"], s["T"], s["D"], generator=g).to(device, s["dtype"])
    v = torch.randn(s["B"], s["Hkv"], s["T"], s["D"], generator=g).to(device, s["dtype"])
    seq_lens = torch.full((s["B"],), s["T"], dtype=torch.int32, device=device)
    out, lse = torch_aura.flash_decode(q, k, v, seq_lens)
    tol = 1e-4 if s["dtype"] == torch.float32 else 2e-2
    exact = exact_decode_attention(q, k, v, seq_lens, scale=s["D"] ** -0.5)[0]
    checks = {"err vs exact": (max_rel(out, exact), tol)}
    if served_by_kernel("flash_decode", device):
        checks["err vs reference"] = (max_rel(out, reference.decode.flash_decode(q, k, v, seq_lens)[0]), tol)
    checks["SDPA agrees"] = (max_rel(sdpa_decode(q, k, v), exact), tol)
    t = timed(lambda: torch_aura.flash_decode(q, k, v, seq_lens), device, repeats)
    t_peer = timed(lambda: sdpa_decode(q, k, v), device, repeats)
    kv_bytes = 2 * s["B"] * s["T"] * s["Hkv"] * s["D"] * k.element_size()
    shape = f"B{s['B']} {s['Hq']}/{s['Hkv']} heads D{s['D']} T{s['T']} {_dt(s['dtype'])}"
    return "flash_decode", shape, checks, t, ("SDPA", t_peer), f"{kv_bytes / t / 1e9:.1f} GB/s of KV"


def run_aura(device, s, repeats):
    g = torch.Generator(device="cpu").manual_seed(0)
    B, Hq, Hkv, D, T = s["B"], s["Hq"], s["Hkv"], s["D"], s["T"]
    k = torch.randn(B, T, Hkv, D, generator=g).to(device, s["dtype"])
    v = torch.randn(B, T, Hkv, D, generator=g).to(device, s["dtype"])
    q = torch.randn(B, Hq, D, generator=g).to(device, s["dtype"])
    cache = torch_aura.AuraCache(s["scheme"], batch=B, kv_heads=Hkv, head_dim=D, capacity=T, device=device)
    cache.append(k, v)
    out, lse = cache.decode(q)
    seq_lens = torch.full((B,), T, dtype=torch.int32, device=device)
    kd, vd = k.transpose(1, 2), v.transpose(1, 2)
    exact, _ = exact_decode_attention(q, kd, vd, seq_lens)
    # Random isotropic data is the hard case for quantized attention (targets.md gates use
    # channel-structured data); the gate here only catches a broken pipeline.
    checks = {"cosine vs exact": (cosine(out, exact), None, 0.80)}
    if served_by_kernel("aura_decode", device):
        oracle = reference.aura.aura_decode(q, cache.k_codes, cache.k_norms, cache.v_codes, cache.v_norms,
                                            cache.seq_lens, cache.k_codebook, cache.v_codebook,
                                            cache.k_sign_mask, cache.v_sign_mask, cache.key_bits, cache.value_bits)[0]
        checks["err vs reference"] = (max_rel(out, oracle), 1e-4 if s["dtype"] == torch.float32 else 2e-2)
    t = timed(lambda: cache.decode(q), device, repeats)
    kd, vd = kd.contiguous(), vd.contiguous()
    t_peer = timed(lambda: sdpa_decode(q, kd, vd), device, repeats)
    saved = cache.dense_bytes(torch.bfloat16) / cache.memory_bytes()
    shape = f"{s['scheme']} B{B} {Hq}/{Hkv} heads D{D} T{T}"
    return ("aura_decode", shape, checks, t, (f"SDPA on the {_dt(s['dtype'])} cache", t_peer),
            f"KV {cache.memory_bytes() / 2**20:.1f} MiB, {saved:.2f}x smaller than bf16")


def run_gdn(device, s, repeats):
    g_ = torch.Generator(device="cpu").manual_seed(0)
    B, T, H, HV, K, V = s["B"], s["T"], s["H"], s["HV"], s["K"], s["V"]
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g_), dim=-1).to(device, s["dtype"])
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g_), dim=-1).to(device, s["dtype"])
    v = torch.randn(B, T, HV, V, generator=g_).to(device, s["dtype"])
    g = torch.nn.functional.logsigmoid(torch.rand(B, T, HV, generator=g_)).to(device)
    beta = torch.rand(B, T, HV, generator=g_).sigmoid().to(device)
    o, final = torch_aura.gdn_chunk(q, k, v, g, beta)
    state = torch.zeros(B, HV, K, V, device=device)
    o_rec = reference.gdn.gdn_recurrent(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                        state.double())
    tol = 5e-3
    checks = {"rms vs recurrence": (rel_rms(o, o_rec), tol)}
    if served_by_kernel("gdn_chunk", device):
        checks["rms vs reference"] = (rel_rms(o, reference.gdn.gdn_chunk(q, k, v, g, beta)[0]), tol)
    t = timed(lambda: torch_aura.gdn_chunk(q, k, v, g, beta), device, repeats)
    peer = gdn_peer()
    if peer is not None and (peer[2] is None or peer[2] == device.type):
        name, fn, _ = peer
        rep = HV // H  # the peers take as many q/k heads as v heads (models repeat them first)
        qp, kp = q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2)
        checks[f"{name.split()[0]} agrees"] = (rel_rms(fn(qp, kp, v, g, beta), o_rec), tol)
        peer_row = (name, timed(lambda: fn(qp, kp, v, g, beta), device, repeats))
    else:
        peer_row = ("FLA / transformers not installed", None)
    shape = f"B{B} T{T} {H}/{HV} heads K{K} V{V} {_dt(s['dtype'])}"
    return "gdn_chunk", shape, checks, t, peer_row, f"{_rate(B * T / t)} tokens/s"


RUNNERS = {"decode": run_decode, "aura": run_aura, "gdn": run_gdn}


def _dt(dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def _rate(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def backend_summary() -> list[str]:
    """One line per device: what serves the ops there (the full table: --status); then the Autograd key's
    kernel, the dispatcher's first stop of every eager call."""
    table = torch_aura.backends.status()
    lines = []
    for dev in ("cpu", "cuda", "mps"):
        labels = [row[dev] for row in table.values()]
        kernels = collections.Counter(lb for lb in labels if lb.startswith("kernel"))
        reasons = sorted({lb[len("reference ("):-1] for lb in labels if lb.startswith("reference (")})
        n_ref = sum(1 for lb in labels if lb.startswith("reference"))
        parts = [f"{label} for {n} ops" for label, n in kernels.items()]
        if n_ref:
            parts.append(f"reference for {n_ref} ops" + (f" ({'; '.join(reasons)})" if reasons else ""))
        lines.append(f"  {dev:<4} {', '.join(parts)}")
    lines.append(f"  autograd (forward-only, every device): {torch_aura._registry.AUTOGRAD_KERNEL}")
    return lines


def _device(text: str) -> torch.device:
    """argparse type: a device torch knows and this machine has."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (cpu, cuda, cuda:N or mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise argparse.ArgumentTypeError(f"{text!r}: {why} (torch {torch.__version__})")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text!r}: only {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available on this machine")
    if device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text!r}: torch_aura runs on cpu, cuda and mps")
    return device


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_aura", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=_device, default=None,
                        help="cpu, cuda[:N] or mps (default: the best available)")
    parser.add_argument("--family", action="append", choices=list(RUNNERS),
                        help="run only this family (repeatable; default: all)")
    parser.add_argument("--status", action="store_true", help="print which backend serves each op, then exit")
    args = parser.parse_args(argv)
    if args.status:
        print(torch_aura.backends.format_status())
        return 0
    device = args.device or default_device()
    on_gpu = device.type != "cpu"
    repeats = 20 if on_gpu else 2

    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    print(f"torch_aura {torch_aura.__version__} | torch {torch.__version__} | device {device}{threads}")
    print("backends (python -m torch_aura --status for every op):")
    print("\n".join(backend_summary()))
    print()
    header = ("family", "op", "shape", "checks", "ours", "peer (same device, same inputs)", "ours vs peer", "note")
    rows, failed = [], False
    for family in args.family or list(RUNNERS):
        op, shape, checks, seconds, (peer, peer_s), note = RUNNERS[family](device, SHAPES[family][on_gpu], repeats)
        marks = []
        for what, (value, *gate) in checks.items():
            hi, lo = (gate + [None, None])[:2]
            ok = (hi is None or value <= hi) and (lo is None or value >= lo)
            failed |= not ok
            marks.append(f"{what} {value:.1e} {'ok' if ok else 'FAIL'}")
        speed = "-" if peer_s is None else f"{peer_s / seconds:.2f}x {'faster' if peer_s > seconds else 'slower'}"
        rows.append((family, op, shape, "; ".join(marks), _ms(seconds),
                     peer if peer_s is None else f"{peer} {_ms(peer_s)}", speed, note))
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"\n(median of {repeats} calls each, after a warm-up; ours on CPU is the fast path of torch_aura.cpu "
          "where the backends line says kernel (cpu), the pure-PyTorch reference elsewhere)"
          if not on_gpu else f"\n(median of {repeats} calls each, after a warm-up)")
    print("all checks passed" if not failed else "SOME CHECKS FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
