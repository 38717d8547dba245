"""The vLLM backend's attention (``integrations/vllm/_paged.py``) on CUDA tensors, driven with the
batch plan vLLM's metadata builds (vLLM itself need not be installed): decode,
speculative and prefill rows against fp64 attention over the pages, and the uniform one-token decode
step captured in a CUDA graph and replayed with new lengths, as vLLM replays it. Where vLLM's CUDA
build is installed, the dense write's one-launch path (vLLM's ``reshape_and_cache_flash``) against the
``index_copy_`` path, bit for bit, eagerly and in a CUDA graph."""

from __future__ import annotations

import os

import pytest
import torch

from _vllm_paged import BLOCK, HKV, HQ, make_attention, make_pages, run_batch
from torch_aura.integrations.vllm import _paged
from torch_aura.integrations.vllm._common import STATS
from torch_aura.integrations.vllm._paged import DensePages, index_copy_write, plan_batch, vllm_cache_write

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEV = "cuda"
FORMATS = {"dense": "dense", "aura8": (8, 8), "aura4v2": (4, 2)}
BATCHES = {
    "decode": ([1, 1, 1], [0, BLOCK - 1, 2 * BLOCK + 4], 3),
    "spec+prefill": ([3, 3, 13, BLOCK + 1], [5, BLOCK, 20, 0], 2),
    "prefill": ([BLOCK - 1, 1, 2 * BLOCK], [0, 40, BLOCK + 1], 0),
}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_batch_matches_attention_over_the_pages(batch, fmt, dtype, D):
    query_lens, context_lens, nd = BATCHES[batch]
    out, ref, *_ = run_batch(FORMATS[fmt], D, dtype, DEV, query_lens, context_lens, nd)
    n = ref.shape[0]
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out[:n].double(), ref, atol=tol, rtol=tol)
    assert (out[n:] == 7.0).all()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_uniform_decode_step_in_a_cuda_graph(fmt):
    """write + decode of one token per request, captured once and replayed with the lengths and
    slots of later steps written into the same tensors (vLLM's persistent buffers)."""
    D, R, dtype = 128, 4, torch.bfloat16
    scale = D ** -0.5
    pages = make_pages(FORMATS[fmt], D, dtype, DEV)
    attn = make_attention(FORMATS[fmt], D, scale)
    g = torch.Generator().manual_seed(0)
    table = (torch.randperm(pages.shape[0] - 1, generator=g) + 1)[:R * 8].view(R, 8).to(torch.int32).to(DEV)
    seq_lens = torch.zeros(R, dtype=torch.int32, device=DEV)
    starts = torch.arange(R + 1, dtype=torch.int32, device=DEV)
    slots = torch.zeros(R, dtype=torch.int64, device=DEV)
    q = torch.zeros(R, HQ, D, dtype=dtype, device=DEV)
    k = torch.zeros(R, HKV, D, dtype=dtype, device=DEV)
    v = torch.zeros_like(k)
    out = torch.zeros(R, HQ, D, dtype=dtype, device=DEV)
    plan = plan_batch(seq_lens=seq_lens, block_table=table, query_start_loc=starts, num_decodes=R,
                      num_decode_tokens=R, num_prefills=0, num_prefill_tokens=0, num_actual_tokens=R,
                      max_query_len=1, max_seq_len=8 * BLOCK, block_size=BLOCK)

    def step():
        attn.write(k, v, pages, slots)
        attn.forward(q, pages, plan, out)

    def set_step(t):  # token t of every request: its slot, its length, fresh q / k / v
        seq_lens.fill_(t + 1)
        slots.copy_(table[:, t // BLOCK].long() * BLOCK + t % BLOCK)
        for x in (q, k, v):
            x.normal_()

    # warm up (and allocate the dense path's lse buffer) outside the capture, as vLLM does
    set_step(0)
    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    eager_pages = pages.clone()
    for t in range(1, 3 * BLOCK + 2):  # across three page boundaries
        set_step(t)
        graph.replay()
        got = out.clone()
        replayed = pages.clone()
        pages.copy_(eager_pages)
        step()  # the same step eagerly from the same pages
        assert torch.equal(pages, replayed)
        torch.testing.assert_close(got, out, atol=0, rtol=0)
        eager_pages = pages.clone()


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("D", [64, 128, 256])
def test_prefill_runs_vllm_flash_attention_where_vllm_is_installed(fmt, D):
    """With vLLM's CUDA build present, a bf16 prefill (dense pages, or AURA pages dequantized) runs vLLM's
    FlashAttention over the pages' strides, and equals attention over the pages."""
    from torch_aura.integrations.vllm._common import STATS
    from torch_aura.integrations.vllm._paged import _flash_attn_varlen

    if _flash_attn_varlen(D) is None:
        pytest.skip("vLLM's CUDA build is not installed here: prefills run SDPA")
    before = STATS.flash_prefill
    query_lens, context_lens, nd = BATCHES["spec+prefill"]
    out, ref, *_ = run_batch(FORMATS[fmt], D, torch.bfloat16, DEV, query_lens, context_lens, nd)
    assert STATS.flash_prefill == before + 1
    torch.testing.assert_close(out[:ref.shape[0]].double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("fmt", ["aura8", "aura4v2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aura_prefill_in_groups_matches_attention_over_the_pages(fmt, dtype, monkeypatch):
    """Prefills reading more than ``AURA_DEQUANT_BYTES`` of dense pages run group by group (one
    page per group here: every request alone), each group one FlashAttention call where vLLM's CUDA
    build serves bf16, with the result of one call over all the pages."""
    D = 128
    monkeypatch.setattr(_paged, "AURA_DEQUANT_BYTES", 2 * BLOCK * HKV * D * dtype.itemsize)
    query_lens, context_lens, nd = BATCHES["prefill"]
    before = STATS.flash_prefill
    out, ref, *_, plan, _ = run_batch(FORMATS[fmt], D, dtype, DEV, query_lens, context_lens, nd)
    groups = plan.prefill.groups(1)
    assert len(groups) == len(query_lens) - nd
    if dtype == torch.bfloat16 and _paged._flash_attn_varlen(D) is not None:
        assert STATS.flash_prefill == before + len(groups)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out[:ref.shape[0]].double(), ref, atol=tol, rtol=tol)


def test_out_of_memory_inside_a_stable_abi_op_raises(tmp_path):
    """A CUDA allocation that fails inside one of our stable-ABI C++ ops must raise (torch.OutOfMemoryError)
    and leave the process alive: on the H200 (torch 2.11) one such failure inside vLLM ended the process
    with SIGSEGV instead (benchmarks/results/profiles/vllm_serve_flash_prefill_h200.md), and so did this test's
    script (profiles/vllm_tp2_first_h200.md; on the CPU, torch 2.11's and 2.13's stable shims turn an allocation
    failure inside such an op into a RuntimeError). The cause, from the native backtrace: the GPU hosts link
    libstdc++ statically and exported it, so formatting the error message crashed (tests/build/test_link_isolation.py;
    setup.py now hides the copy). Own process: a crash must not take the test session with it."""
    import shutil
    import subprocess
    import sys

    script = tmp_path / "oom.py"
    script.write_text(
        "import torch, torch_aura\n"
        "from torch_aura._checks.aura import packed_words\n"
        "from torch_aura.aura_cache import aura_tables\n"
        "assert torch_aura.backends.status()['aura_dequantize']['cuda'].startswith('kernel')\n"
        "kc, _, _, _, ks, _ = aura_tables(4, 2, 128, 0, 0, 'cuda')\n"
        "pw = packed_words(128, 4)\n"
        "codes = torch.zeros(1, 16, 8, pw, dtype=torch.int32, device='cuda').expand(1 << 24, 16, 8, pw)\n"
        "norms = torch.zeros(1, 16, 8, device='cuda').expand(1 << 24, 16, 8)\n"
        "try:\n"  # the control: torch's own allocation failing in this process
        "    torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('control: torch.empty raised OutOfMemoryError')\n"
        "try:\n"
        "    torch.ops.aura.aura_dequantize.default(codes, norms, kc, 4, ks, torch.bfloat16)\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('raised OutOfMemoryError')\n"
        "except RuntimeError as e:\n"
        "    print('raised RuntimeError', str(e)[:200])\n"
        "torch.cuda.synchronize()\n"
        "print('alive', float(torch.ones(2, device='cuda').sum()))\n")
    # unbuffered, with faulthandler: a crash shows how far the script got and the Python stack it died in
    # (the first run on the H200 ended with SIGSEGV and nothing on stdout)
    r = subprocess.run([sys.executable, "-u", "-X", "faulthandler", str(script)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        # the C++ frames of the crash: the shim's error text comes first in stderr and faulthandler's Python
        # stack last, so keep both ends; on a signal, the native stack at it (the GPU hosts have no gdb: a
        # handler compiled here prints it, tests/_native_backtrace.c), and gdb's where it is installed
        backtrace = native = ""
        if r.returncode < 0:
            import _native_backtrace as nb

            try:
                lib = nb.build(tmp_path)
            except nb.Unavailable as e:
                backtrace = f"native backtrace: not built ({e})"
            else:
                # installed after the imports and again just before the op: first in line whatever CUDA set up
                traced = script.with_name("oom_native.py")
                head, rest = script.read_text().split("\n", 1)
                call = "try:\n    torch.ops.aura.aura_dequantize.default("
                traced.write_text(head + "\n" + nb.install_line(lib)
                                  + rest.replace(call, nb.install_line(lib) + call))
                try:
                    t = subprocess.run([sys.executable, "-u", "-X", "faulthandler", str(traced)], capture_output=True,
                                       text=True, timeout=300)
                    backtrace = (f"native backtrace rerun: exit {t.returncode}, stdout {t.stdout.strip()[-300:]!r}\n"
                                 + (nb.section(t.stderr) or f"native backtrace: none printed; stderr tail: "
                                                               f"{t.stderr[-2000:]}"))
                except subprocess.TimeoutExpired:
                    backtrace = "native backtrace: the rerun timed out"
        if r.returncode < 0 and shutil.which("gdb"):
            try:
                g = subprocess.run(["gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable,
                                    "-u", str(script)], capture_output=True, text=True, timeout=600)
                native = "\n".join(g.stdout.splitlines()[-60:])
            except subprocess.TimeoutExpired:
                native = "gdb timed out"
        # which conditions the crash needs (the GPU hosts have no gdb): the caching allocator, and whether the
        # error crosses the dispatcher's Python kernels (inference mode skips the Autograd one)
        variants = {"no caching allocator": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                    "C++ stack traces": {"TORCH_SHOW_CPP_STACKTRACES": "1"}}
        outcomes = []
        for label, env in variants.items():
            v = subprocess.run([sys.executable, "-u", str(script)], capture_output=True, text=True, timeout=300,
                               env={**os.environ, **env})
            outcomes.append(f"{label}: exit {v.returncode}, stdout {v.stdout.strip()[-300:]!r}")
        inference = script.with_name("oom_inference.py")
        call = "torch.ops.aura.aura_dequantize.default("
        inference.write_text(script.read_text().replace(f"    {call}", f"    with torch.inference_mode(): {call}"))
        v = subprocess.run([sys.executable, "-u", str(inference)], capture_output=True, text=True, timeout=300)
        outcomes.append(f"under inference_mode: exit {v.returncode}, stdout {v.stdout.strip()[-300:]!r}")
        raise AssertionError(f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr head: {r.stderr[:4000]}\n"
                             f"stderr tail: {r.stderr[-2500:]}\n{backtrace}\ngdb: {native}\nvariants:\n"
                             + "\n".join(outcomes))
    lines = r.stdout.splitlines()
    assert lines[0].startswith("control: torch.empty raised") and lines[1].startswith("raised"), r.stdout
    assert lines[2] == "alive 2.0", r.stdout


@pytest.mark.sanitize
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_small_batch_for_compute_sanitizer(fmt):
    out, ref, *_ = run_batch(FORMATS[fmt], 64, torch.float32, DEV, [3, 1, 13, BLOCK + 1], [5, 0, 20, 0], 2)
    torch.testing.assert_close(out[:ref.shape[0]].double(), ref, atol=1e-4, rtol=1e-4)


# ------------------------------------------------- the dense write: vLLM's one launch vs index_copy_
@pytest.fixture
def cache_op():
    """vLLM's op, or a skip (a failure under AURA_REQUIRE_VLLM=1, as in tests/vllm_plugin)."""
    if _paged._reshape_and_cache_flash() is None:
        why = "no vLLM CUDA build here (torch.ops._C_cache_ops.reshape_and_cache_flash)"
        if os.environ.get("AURA_REQUIRE_VLLM") == "1":
            pytest.fail(why)
        pytest.skip(why)


def _write_case(dtype, H, D, N, page_pad, key_offset=0, nb=12, n=29, seed=0):
    """Random pages (LBNHC view over a raw buffer whose page stride is padded by ``page_pad``
    elements), ``n`` distinct real slots outside the null block 0 with -1 padding slots between
    them, and K / V as vLLM's [T, H, D] views of one qkv projection, T past the slots' length."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    C, page = 2 * D, N * H * 2 * D + page_pad
    raw = torch.randn(nb * page, generator=g, device=DEV).to(dtype)
    real = (torch.randperm((nb - 1) * N, generator=g, device=DEV) + N)[:n]
    slots = torch.full((n + 6,), -1, dtype=torch.int64, device=DEV)
    slots[torch.randperm(n + 6, generator=g, device=DEV)[:n]] = real
    T, Hq = slots.shape[0] + 3, 2 * H
    width = (Hq + 2 * H) * D + key_offset
    qkv = torch.randn(T, width, generator=g, device=DEV).to(dtype)[:, key_offset:]
    key = qkv[:, Hq * D:(Hq + H) * D].view(T, H, D)
    value = qkv[:, (Hq + H) * D:].view(T, H, D)

    def pages_of(buf):
        return buf.as_strided((nb, H, N, C), (page, C, H * C, 1))
    return raw, pages_of, key, value, slots, page, qkv


def _check_same_as_index_copy(raw, fused, reference, page):
    """Bit for bit beyond the null block 0; there the op skips -1 slots (index_copy_ parks them),
    so block 0 keeps its old bytes (``raw``: the pages before the write)."""
    assert torch.equal(fused[page:], reference[page:])
    assert torch.equal(fused[:page], raw[:page])
    assert not torch.equal(fused[page:], raw[page:])


@pytest.mark.parametrize("page_pad", ["unpadded", "pad16B", "pad2D"])
@pytest.mark.parametrize("N", [16, 32])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("H", [1, 2, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_dense_write_matches_index_copy(cache_op, dtype, H, D, N, page_pad):
    # pad2D: one K|V cell, not a whole token row unless H == 1 (index_copy_'s element path);
    # pad16B: 16 bytes, a hybrid model's padding the op still serves
    pad = {"unpadded": 0, "pad16B": 16 // torch.empty((), dtype=dtype).element_size(), "pad2D": 2 * D}[page_pad]
    raw, pages_of, key, value, slots, page, _ = _write_case(dtype, H, D, N, pad)
    fused, reference = raw.clone(), raw.clone()
    before = STATS.dense_fused_write
    DensePages(2 * H, D, D ** -0.5).write(key, value, pages_of(fused), slots)
    assert STATS.dense_fused_write == before + 1, "the write did not take vLLM's one-launch path"
    index_copy_write(key, value, pages_of(reference), slots)
    _check_same_as_index_copy(raw, fused, reference, page)


@pytest.mark.parametrize("case", ["odd-page-pad", "odd-key-offset"])
def test_dense_write_falls_back_where_the_op_would_misalign(cache_op, case):
    # a page stride (or a K / V row) off 16 bytes: the op's vector path would store misaligned,
    # so the write takes index_copy_ (and stays correct)
    D, H = 128, 2
    raw, pages_of, key, value, slots, page, _ = _write_case(
        torch.bfloat16, H, D, BLOCK, 3 if case == "odd-page-pad" else 0, key_offset=int(case == "odd-key-offset"))
    fused, reference = raw.clone(), raw.clone()
    n = slots.shape[0]
    assert not vllm_cache_write(key[:n], value[:n], pages_of(fused), slots, D)
    before = STATS.dense_fused_write
    DensePages(2 * H, D, D ** -0.5).write(key, value, pages_of(fused), slots)
    assert STATS.dense_fused_write == before
    index_copy_write(key, value, pages_of(reference), slots)
    # beyond the null block 0: there index_copy_ parks every -1 slot on one row, and on CUDA which of
    # those duplicate rows lands last is not defined (measured: two calls differ)
    assert torch.equal(fused[page:], reference[page:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_dense_write_in_a_cuda_graph(cache_op, dtype):
    """The one-launch write captured once, replayed with new slots (-1 padding included) and new
    K / V written into the same buffers, each replay against index_copy_ on a copy of the pages."""
    H, D, N = 8, 128, BLOCK
    raw, pages_of, key, value, slots, page, qkv = _write_case(dtype, H, D, N, 2 * D)
    fused, reference = raw.clone(), raw.clone()
    pages = pages_of(fused)
    attn = DensePages(2 * H, D, D ** -0.5)
    g = torch.Generator(device=DEV).manual_seed(1)
    nb = raw.shape[0] // page

    def set_step():
        n = slots.shape[0]
        slots.fill_(-1)
        slots[torch.randperm(n, generator=g, device=DEV)[:n - 4]] = \
            (torch.randperm((nb - 1) * N, generator=g, device=DEV) + N)[:n - 4]
        qkv.copy_(torch.randn(qkv.shape, generator=g, device=DEV).to(dtype))

    set_step()
    attn.write(key, value, pages, slots)  # warm-up outside the capture, as vLLM does
    index_copy_write(key, value, pages_of(reference), slots)
    before = STATS.dense_fused_write
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attn.write(key, value, pages, slots)
    assert STATS.dense_fused_write == before + 1, "the captured write is not vLLM's one-launch path"
    for _ in range(4):
        set_step()
        start = fused.clone()
        graph.replay()
        index_copy_write(key, value, pages_of(reference), slots)
        torch.cuda.synchronize()
        _check_same_as_index_copy(start, fused, reference, page)
