"""Causal conv kernel-vs-reference checks shared by tests/interp (Triton interpreter, CPU) and tests/cuda.

An ``impl`` is anything with ``causal_conv1d`` and ``causal_conv1d_update`` as attributes (the Triton
launchers, or the public ``torch_aura`` wrappers on CUDA tensors). ``check_op`` runs it and the
reference on copies of the same arguments and compares the output by relative RMS (the fp32 sums run
in another order, then one rounding to x's dtype) and every argument afterwards exactly: the state
rows are copies of inputs, and nothing else may change.
"""

from __future__ import annotations

import torch
from _util import RATIO, assert_close

from torch_aura.reference import gdn as ref


def check_op(impl, name: str, args: tuple) -> torch.Tensor:
    """``impl.<name>(*args)`` against the reference on CPU copies; returns the kernel's output."""
    copies = [a.detach().cpu().clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = getattr(ref, name)(*copies)
    out = getattr(impl, name)(*args)
    assert out.dtype == expected.dtype, f"{name}: dtype {out.dtype} != reference {expected.dtype}"
    assert_close(f"{name} y", out.float().cpu(), expected.float(), RATIO[out.dtype])
    for i, (a, c) in enumerate(zip(args, copies)):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.cpu(), c), f"{name}: argument {i} {tuple(a.shape)} differs from the reference's"
    return out


def _x(gen, device, shape, dtype, layout):
    """Token-major ``[rows, tokens, C]`` input: ``"slice"`` (channels 3..3+C of a wider projection, as
    q | k | v are), ``"strided"`` (every other token of a time-major buffer) or ``"contiguous"``."""
    R, T, C = shape
    if layout == "slice":
        return torch.randn(R, T, C + 5, generator=gen).to(device, dtype)[..., 3:3 + C]
    if layout == "strided":
        return torch.randn(2 * T, R, C, generator=gen).to(device, dtype)[::2].transpose(0, 1)
    return torch.randn(R, T, C, generator=gen).to(device, dtype)


def _state(gen, device, rows, C, S, dtype, layout):
    """A state ``[rows, C, S]``: ``"rows"`` (each row's S entries adjacent) or ``"transposed"`` (a view of a
    ``[rows, S, C]`` buffer, vLLM's conv pool: the channels adjacent, the entries C apart)."""
    if layout == "transposed":
        return torch.randn(rows, S, C, generator=gen).to(device, dtype).transpose(1, 2)
    return torch.randn(rows, C, S, generator=gen).to(device, dtype)


def conv_args(device, B, T, C, W, dtype, *, offsets=None, S=None, bias=True, activation="silu", layout="slice",
              state_dtype=torch.float32, state_layout="rows", weight_dtype=torch.float32, cu_dtype=torch.int32,
              seed=0) -> tuple:
    """``causal_conv1d``'s arguments: x ``[B, T, C]`` (``layout``), weight ``[C, W]``, bias, a state
    ``[N, C, S]`` (``state_layout``; None without ``S``), ``cu_seqlens`` from ``offsets`` (then B == 1), the
    activation."""
    gen = torch.Generator().manual_seed(seed)
    N = B if offsets is None else len(offsets) - 1
    x = _x(gen, device, (B, T, C), dtype, layout)
    weight = torch.randn(C, W, generator=gen).to(device, weight_dtype)
    b = torch.randn(C, generator=gen).to(device, dtype) if bias else None
    state = None if S is None else _state(gen, device, N, C, S, state_dtype, state_layout)
    cu = None if offsets is None else torch.tensor(offsets, dtype=cu_dtype, device=device)
    return x, weight, b, state, cu, activation


def update_args(device, N, L, C, W, S, P, dtype, *, rows=None, bias=True, activation="silu", one_token=False,
                pool_dtype=torch.float32, pool_layout="rows", seed=0) -> tuple:
    """``causal_conv1d_update``'s arguments: x ``[N, L, C]`` (``[N, C]`` with ``one_token``, L = 1), a pool
    ``[P, C, S]`` (``pool_layout``, as ``_state``), weight ``[C, W]``, bias, the activation, ``state_indices``
    from ``rows`` (-1 skips)."""
    gen = torch.Generator().manual_seed(seed)
    x = _x(gen, device, (N, L, C), dtype, "slice")
    if one_token:
        x = x[:, 0]
    pool = _state(gen, device, P, C, S, pool_dtype, pool_layout)
    weight = torch.randn(C, W, generator=gen).to(device)
    b = torch.randn(C, generator=gen).to(device) if bias else None
    idx = None if rows is None else torch.tensor(rows, dtype=torch.int32, device=device)
    return x, pool, weight, b, activation, idx


def check_case(impl, device, name: str, case: dict) -> torch.Tensor:
    """``check_op`` on the arguments that a case's keywords describe (``conv_args`` / ``update_args``)."""
    return check_op(impl, name, (conv_args if name == "causal_conv1d" else update_args)(device, **case))


def case_id(case: dict) -> str:
    """A readable pytest id of a case's keyword arguments, e.g. ``B2-T33-C9-W4-fp16-S5-state_dtype-fp16``."""
    short = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    parts = []
    for k, v in case.items():
        if isinstance(v, torch.dtype):
            parts.append(short.get(v, str(v)) if k == "dtype" else f"{k}-{short.get(v, v)}")
        elif isinstance(v, list):
            parts.append(f"{k}{len(v)}")
        elif isinstance(v, str):
            parts.append(v)
        elif v is None or isinstance(v, bool):
            parts.append(f"{k}-{v}")
        else:
            parts.append(f"{k}{v}")
    return "-".join(parts)


def check_pool_prefill(conv, device, offsets, C, W, S, dtype, rows, has, null=0, pool_dtype=None):
    """The prefill launcher's pool form (``state_indices=``, ``has_state=``, ``null=``: a serving engine's state
    pool served in place) against its plain form on the rows gathered out of the pool, zeros where a sequence is
    skipped (-1, ``null``) or has no state, and scattered back where it is not skipped: the output and the pool
    bit for bit, the skipped rows untouched. ``conv``: the module ``triton_kernels.gdn.conv``; ``rows``, ``has``:
    one per sequence; the pool is vLLM's ``[P, S, C]`` seen as ``[P, C, S]``."""
    gen = torch.Generator().manual_seed(len(offsets) * 10 + C)
    P = max(max(rows) + 1, null + 1, 2)
    x, weight, bias, _, cu, act = conv_args(device, 1, offsets[-1], C, W, dtype, offsets=offsets)
    pool = _state(gen, device, P, C, S, pool_dtype or dtype, "transposed")
    idx = torch.tensor(rows, dtype=torch.int32, device=device)
    has_t = torch.tensor(has, dtype=torch.bool, device=device)
    live = (idx >= 0) & (idx != null)
    gather = idx.clamp(min=0).long()
    state = torch.where((live & has_t)[:, None, None], pool[gather], torch.zeros((), dtype=pool.dtype, device=device))
    want = conv.causal_conv1d(x, weight, bias, state, cu, act)
    pool_want = pool.clone()
    pool_want[gather[live]] = state[live]
    pool_got = pool.clone()
    got = conv.causal_conv1d(x, weight, bias, pool_got, cu, act, state_indices=idx, has_state=has_t, null=null)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    assert torch.equal(pool_got, pool_want), "the pool differs from the gathered rows scattered back"
    untouched = [r for r in range(P) if r not in {int(i) for i in idx[live]}]
    assert torch.equal(pool_got[untouched], pool[untouched]), "a row no live sequence names was written"
    return got
