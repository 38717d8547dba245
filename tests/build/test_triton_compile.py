"""Compile every Triton kernel to an sm_90 cubin on the CPU, through the real launchers.

The interpreter (tests/interp) runs kernels as numpy and misses what only the compiler sees:
non-constexpr globals, tl.dot operand shapes and dtypes, layout conversions, ptxas failures.
Triton's NVIDIA backend compiles without a GPU, so here every launcher runs on CPU tensors with
its kernels swapped for a compile-only stand-in that maps the launch's arguments to a signature
and calls ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``; every tuner config is compiled.
"""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="compiles real kernels; the interpreter tree runs them instead")

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int32: "*i32",
        torch.int64: "*i64", torch.bool: "*i1"}


class _CompileOnly:
    """Stands in for a ``JITFunction``: ``kernel[grid](*args, **kw)`` compiles instead of launching."""

    def __init__(self, fn, seen):
        self.fn, self.seen = fn, seen

    def __getitem__(self, grid):
        return self._compile

    def _compile(self, *args, num_warps=4, num_stages=2, maxnreg=None, **kwargs):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.tools.tensor_descriptor import TensorDescriptor

        values = dict(zip([p.name for p in self.fn.params], args)) | kwargs
        signature, constexprs = {}, {}
        for p in self.fn.params:
            v = values[p.name]
            if p.is_constexpr or v is None:  # an absent optional tensor is a constexpr None to Triton
                signature[p.name], constexprs[p.name] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                signature[p.name] = _PTR[v.dtype]
            elif isinstance(v, TensorDescriptor):  # the w/u kernel's host descriptors (fixed length)
                signature[p.name] = f"tensordesc<{_PTR[v.base.dtype][1:]}{list(v.block_shape)}>"
            elif isinstance(v, bool):
                signature[p.name] = "i1"
            elif isinstance(v, int):
                signature[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
            else:
                signature[p.name] = "fp32"
        key = (self.fn.__name__, tuple(sorted(signature.items())), tuple(sorted(constexprs.items())),
               num_warps, num_stages, maxnreg)
        if key in self.seen:
            return
        self.seen.add(key)
        if getattr(self.fn, "is_gluon", lambda: False)():  # the Hopper state pass (state_pass_sm90)
            from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
        options = {"num_warps": num_warps, "num_stages": num_stages}
        if maxnreg is not None:
            options["maxnreg"] = maxnreg
        compiled = triton.compile(ASTSource(self.fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                  options=options)
        assert "cubin" in compiled.asm, f"{self.fn.__name__}: no cubin"
        assert maxnreg is None or f".maxnreg {maxnreg}" in compiled.asm["ptx"], f"{self.fn.__name__}: no register cap"


@pytest.fixture
def compile_only(monkeypatch, request):
    """Patch the GDN kernel modules; with ``all_configs`` every tuner compiles each of its configs
    (bf16, the tuned production dtype, with the state pass's TMA copies), else only its default
    (compile time on 2 CI cores)."""
    from torch_aura.triton_kernels import _tune
    from torch_aura.triton_kernels.gdn import (_common, chunk, conv, gated_norm, gates, prep, recurrent, segments,
                                              state_pass)

    seen = set()
    for mod in (chunk, prep, state_pass, segments, recurrent, conv, gates, gated_norm):
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                monkeypatch.setattr(mod, name, _CompileOnly(obj, seen))

    all_configs = request.node.callspec.params.get("dtype") == torch.bfloat16
    if all_configs:  # the TMA paths too (state pass, w/u; CPU tensors never take them at run time)
        monkeypatch.setattr(_common, "_tma_ready", lambda *xs: True)
        # and the Gluon pass for Hopper, which only an sm_90 device selects at run time
        hopper = state_pass._hopper_pass()
        assert hopper is not None, "state_pass_sm90 failed to import (Gluon)"
        monkeypatch.setattr(state_pass, "_hopper_pass", lambda: _CompileOnly(hopper, seen))
        monkeypatch.setattr(state_pass, "_hopper_pass_ready", lambda k, tma_ready, with_o: with_o and tma_ready)

    def every_config(self, key, launch, device):
        for cfg in self.configs if all_configs else self.configs[:1]:
            launch(cfg)

    monkeypatch.setattr(_tune.Tuner, "__call__", every_config)
    return seen


def _gdn_inputs(dtype, B, T, H, HV, K, V):
    q = torch.randn(B, T, H, K, dtype=dtype)
    return q, torch.randn_like(q), torch.randn(B, T, HV, V, dtype=dtype), -torch.rand(B, T, HV), torch.rand(B, T, HV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gdn_kernels_compile_for_sm90(compile_only, monkeypatch, dtype):
    from torch_aura.triton_kernels.gdn import chunk, prep, recurrent, segments, state_pass

    K = V = 128
    q, k, v, g, beta = _gdn_inputs(dtype, 2, 100, 2, 4, K, V)
    h0 = torch.randn(2, 4, K, V)
    chunk.gdn_chunk(q, k, v, g, beta, None, h0, None, None, True, False)
    cu = torch.tensor([0, 30, 30, 100], dtype=torch.int32)
    qv, kv, vv, gv, bv = (x[:1] for x in (q, k, v, g, beta))
    chunk.gdn_chunk(qv, kv, vv, gv, bv, None, torch.randn(3, 4, V, K), cu, None, False, True)
    g_cum = chunk.gdn_chunk_cumsum(g)
    Ai = chunk.gdn_kkt_solve(k, g_cum, beta)
    w, u = chunk.gdn_recompute_w_u(k, v, beta, Ai.to(dtype), g_cum)
    h, v_new, _ = chunk.gdn_fwd_h(k, w.to(dtype), u.to(dtype), g_cum, h0)
    chunk.gdn_fwd_o(q, k, v_new.to(dtype), h.to(dtype), g_cum)
    recurrent.gdn_recurrent(q, k, v, g, beta, h0.clone())
    recurrent.gdn_recurrent(qv, kv, vv, gv, bv, torch.randn(3, 4, V, K), torch.tensor([2, -1, 0], dtype=torch.int32),
                            cu, None, True, True)
    ba = torch.randn(2, 8, dtype=dtype)  # vLLM's packed decode in one launch: [b | a] row views, its null slot
    recurrent.gdn_recurrent(q[:, :1], k[:, :1], v[:, :1], ba[:, None, 4:], ba[:, None, :4], torch.randn(3, 4, V, K),
                            torch.tensor([2, 0], dtype=torch.int32), None, None, True, True,
                            gates=(torch.randn(4), torch.randn(4)), null=0)
    # the sequence-parallel pass (segments._segment_plan chooses it on a GPU only): summary, scan and the
    # segmented pass (Triton and Gluon), fixed length and varlen, gdn_chunk and gdn_fwd_h
    monkeypatch.setattr(segments, "_segment_plan", lambda *a: 1)
    chunk.gdn_chunk(q, k, v, g, beta, None, h0, None, None, True, False)
    chunk.gdn_chunk(qv, kv, vv, gv, bv, None, torch.randn(3, 4, V, K), cu, None, False, True)
    chunk.gdn_fwd_h(k, w.to(dtype), u.to(dtype), g_cum, None)
    raw = {dict(key[2])["RAW_GATES"] for key in compile_only if key[0] == "_gdn_recurrent_kernel"}
    assert raw == {False, True}, f"decode rule variants compiled (RAW_GATES): {raw}"
    scan_paths = {dict(key[2])["IN_REGS"] for key in compile_only if key[0] == "_gdn_segment_scan_kernel"}
    assert scan_paths == {dtype != torch.float32}, f"segment scan paths compiled (IN_REGS): {scan_paths}"
    expected = {n for mod in (chunk, prep, state_pass, segments, recurrent) for n in vars(mod) if n.endswith("_kernel")}
    assert expected <= {key[0] for key in compile_only}, "a kernel was never compiled"
    if dtype == torch.bfloat16:
        hopper = {(dict(key[2])["IS_VARLEN"], dict(key[2])["STAGES"]) for key in compile_only
                  if key[0] == "gdn_state_pass_sm90_kernel"}
        assert hopper == {(False, 2), (False, 3), (True, 2), (True, 3)}, f"Hopper pass variants compiled: {hopper}"
        for kernel in ("gdn_state_pass_sm90_kernel", "_gdn_state_pass_kernel"):
            segmented = {dict(key[2])["IS_VARLEN"] for key in compile_only
                         if key[0] == kernel and ("SEGMENTED", True) in key[2]}
            assert segmented == {False, True}, f"{kernel}: segmented variants compiled (IS_VARLEN): {segmented}"
        for kernel in ("_gdn_state_pass_kernel", "_gdn_recompute_w_u_kernel"):
            assert any(key[0] == kernel and ("TMA", True) in key[2] for key in compile_only), \
                f"{kernel}'s TMA path was never compiled"


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
def test_gdn_overlapped_pass_compiles_for_sm90(compile_only, monkeypatch, dtype):
    """gdn_chunk with the Hopper pass beside w/u (state_pass._overlap_pass): the pass's WAIT variant, which
    spins on w/u's flags, and w/u's PUBLISH variant, fixed length and varlen. The side stream is
    stubbed out (CPU): w/u then the pass, in order."""
    import contextlib

    from torch_aura.triton_kernels.gdn import chunk, state_pass

    monkeypatch.setattr(state_pass, "_overlap_pass", lambda *a: True)
    monkeypatch.setattr(state_pass, "_beside", lambda device, first: (first(), contextlib.nullcontext())[1])
    q, k, v, g, beta = _gdn_inputs(dtype, 1, 100, 2, 4, 128, 128)
    chunk.gdn_chunk(q, k, v, g, beta, None, torch.randn(1, 4, 128, 128), None, None, True, False)
    cu = torch.tensor([0, 30, 30, 100], dtype=torch.int32)
    chunk.gdn_chunk(q, k, v, g, beta, None, None, cu, None, False, False)
    waits = {dict(key[2])["IS_VARLEN"] for key in compile_only
             if key[0] == "gdn_state_pass_sm90_kernel" and ("WAIT", True) in key[2]}
    publishes = {dict(key[2])["IS_VARLEN"] for key in compile_only
                 if key[0] == "_gdn_recompute_w_u_kernel" and ("PUBLISH", True) in key[2]}
    assert waits == {False, True} and publishes == {False, True}, (waits, publishes)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_conv_kernels_compile_for_sm90(compile_only, dtype, monkeypatch):
    """The front end's kernels (fixed tiles, no tuner) at Qwen3-Next's W = 4 and the extremes W = 1 and 8:
    fixed length and varlen, with and without bias, state and SiLU; one and several decode tokens, with and
    without pool indices; mixed dtypes (fp32 weights and state beside 16-bit x); both prefill kernels (the
    window one takes W <= 4)."""
    from torch_aura.triton_kernels.gdn import conv

    C = 1024
    x = torch.randn(2, 100, C + 64, dtype=dtype)[..., :C]  # a channel slice of a wider projection
    cu = torch.tensor([0, 30, 30, 100], dtype=torch.int32)
    for prefill in ("taps", "window"):
        monkeypatch.setattr(conv, "PREFILL_KERNEL", prefill)
        for W in (1, 4, 8):
            weight, bias = torch.randn(C, W), torch.randn(C, dtype=dtype)
            conv.causal_conv1d(x, weight, bias, torch.zeros(2, C, max(W - 1, 1)), None, "silu")
            conv.causal_conv1d(x[:1], weight, None, torch.zeros(3, C, W, dtype=dtype), cu, None)
            conv.causal_conv1d(x, weight)
            slots, has = torch.tensor([3, 0, -1], dtype=torch.int32), torch.tensor([True, False, True])
            conv.causal_conv1d(x[:1], weight, None, torch.zeros(5, C, W, dtype=dtype), cu, "silu", state_indices=slots,
                               has_state=has, null=0)  # a serving engine's pool in place
            pool = torch.zeros(5, C, max(W, 2))
            conv.causal_conv1d_update(x[:, 0], pool, weight, bias, "silu", torch.tensor([3, -1], dtype=torch.int32))
            conv.causal_conv1d_update(x[:, :3], pool, weight)
    compiled = {(key[0], dict(key[2]).get("W")) for key in compile_only}  # the state kernel has no W
    assert {name for name, _ in compiled} == {n for n in vars(conv) if n.endswith("_kernel")}, compiled
    assert {(k, W) for k in ("_causal_conv1d_kernel", "_causal_conv1d_update_kernel") for W in (1, 4, 8)} <= compiled
    assert {("_causal_conv1d_window_kernel", W) for W in (1, 4)} <= compiled
    pool_forms = {key[0] for key in compile_only if ("state_indices", "*i32") in key[1]}
    assert pool_forms == {"_causal_conv1d_kernel", "_causal_conv1d_window_kernel", "_conv_state_kernel",
                          "_causal_conv1d_update_kernel"}, pool_forms
    compile_only.clear()
    for bt, bc, warps in ((16, 256, 1), (64, 256, 4)):  # window geometries bench_vllm_gdn_ops.py sweeps by default
        monkeypatch.setattr(conv, "PREFILL_KERNEL", "window")
        monkeypatch.setattr(conv, "WINDOW_BT", bt)
        monkeypatch.setattr(conv, "WINDOW_BC", bc)
        monkeypatch.setattr(conv, "WINDOW_WARPS", warps)
        conv.causal_conv1d(x[:1], torch.randn(C, 4), None, torch.zeros(3, C, 3, dtype=dtype), cu, "silu")
    assert {dict(key[2])["BT"] for key in compile_only if key[0] == "_causal_conv1d_window_kernel"} == {16, 64}
    for block, warps in ((64, 2), (512, 4)):  # the decode conv's blocks bench_vllm_gdn_ops.py sweeps by default
        monkeypatch.setattr(conv, "UPDATE_BC", block)
        monkeypatch.setattr(conv, "UPDATE_WARPS", warps)
        pool = torch.zeros(5, C + 8, 3, dtype=dtype).transpose(1, 2)[:, :3, :C].transpose(1, 2)  # vLLM's layout
        slots = torch.tensor([3, 0], dtype=torch.int32)
        conv.causal_conv1d_update(x[:, 0], pool, torch.randn(C, 4), None, "silu", slots)
    assert {dict(key[2])["BC"] for key in compile_only if key[0] == "_causal_conv1d_update_kernel"} == {64, 512}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gates_kernel_compiles_for_sm90(compile_only, dtype):
    """vLLM's gates in one launch (gdn/gates.py): with and without pool rows (int32 and int64 slots), the
    projections as row views of vLLM's [b | a] buffer."""
    from torch_aura.triton_kernels.gdn import gates

    HV = 32
    ba = torch.randn(8, 2 * HV, dtype=dtype)
    A_log, dt_bias = torch.randn(HV), torch.randn(HV)
    gates.gdn_gates(ba[:, HV:], ba[:, :HV], A_log, dt_bias)
    for slot_dtype in (torch.int32, torch.int64):
        gates.gdn_gates(ba[:, HV:], ba[:, :HV], A_log, dt_bias, slots=torch.arange(8, dtype=slot_dtype), null=0)
    rows = {dict(key[2])["WITH_ROWS"] for key in compile_only if key[0] == "_gdn_gates_kernel"}
    assert rows == {False, True}, compile_only


@pytest.mark.parametrize("tile", [(32, 1, None, False, None), (64, 2, None, False, None), (64, 4, None, False, None),
                                  (16, 1, 1, False, None), (16, 1, None, True, None), (32, 1, None, True, 168)],
                         ids=["32x1", "64x2", "64x4", "16x1:s1", "16x1:one", "32x1:one:r168"])
def test_recurrent_tiles_the_ops_bench_sweeps_compile_for_sm90(compile_only, monkeypatch, tile):
    """bench_vllm_gdn_ops.py --recurrent-tiles: the decode rule at (V tile, warps) other than recurrent._tile's 16 x 1
    on vLLM's bf16 [P, HV, V, K] pool (one warp holding a 128 x 32 fp32 state tile: 128 values per thread), with
    one pipelining stage for its token loop (``:s1``), without the loop (``:one``, ``recurrent.ONE_TOKEN``), and
    with a register cap (``:r168``, ``recurrent.MAX_REGISTERS``: the PTX carries it)."""
    from torch_aura.triton_kernels.gdn import recurrent

    monkeypatch.setattr(recurrent, "_tile", lambda rows, V, BK, device, v_first=False: tile[:2])
    monkeypatch.setattr(recurrent, "LOOP_STAGES", tile[2])
    monkeypatch.setattr(recurrent, "ONE_TOKEN", tile[3])
    monkeypatch.setattr(recurrent, "MAX_REGISTERS", tile[4])
    recurrent._geometry_of.forget()
    q, k, v, g, beta = _gdn_inputs(torch.bfloat16, 4, 1, 2, 4, 128, 128)
    pool = torch.randn(6, 4, 128, 128, dtype=torch.bfloat16)
    recurrent.gdn_recurrent(q, k, v, g, beta, pool, torch.tensor([1, 3, -1, 5], dtype=torch.int32), None, None, True,
                            True)
    recurrent._geometry_of.forget()
    compiled = [key for key in compile_only if key[0] == "_gdn_recurrent_kernel"]
    assert {dict(key[2])["BV"] for key in compiled} == {tile[0]}
    assert {dict(key[2])["ONE_TOKEN"] for key in compiled} == {tile[3]}
    if tile[2] is not None:  # the launch options reached the compile
        assert {key[4] for key in compiled} == {tile[2]}, compiled
    assert {key[5] for key in compiled} == {tile[4]}, compiled


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_post_conv_kernel_compiles_for_sm90(compile_only, dtype):
    """vLLM's post-conv step in one launch (gdn/gates.py): Qwen3-Next's heads (16 q/k of 128, 32 v of 128) and
    a masked tail (K = 96, V = 80), with and without the l2 norm and exp(g), the conv output a row view."""
    from torch_aura.triton_kernels.gdn import gates

    for H, HV, K, V in ((16, 32, 128, 128), (3, 6, 96, 80)):
        C = 2 * H * K + HV * V
        x = torch.randn(8, C + 16, dtype=dtype)[:, 8:8 + C]
        ba = torch.randn(8, 2 * HV, dtype=dtype)
        for l2norm, g_exp in ((True, False), (False, True)):
            gates.gdn_post_conv(x, ba[:, HV:], ba[:, :HV], torch.randn(HV), torch.randn(HV), H, K, V, l2norm, g_exp)
    variants = {(dict(key[2])["K"], dict(key[2])["L2NORM"]) for key in compile_only
                if key[0] == "_gdn_post_conv_kernel"}
    assert variants == {(128, True), (128, False), (96, True), (96, False)}, compile_only


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gated_norm_kernel_compiles_for_sm90(compile_only, dtype):
    """The GDN layers' gated RMSNorm (gdn/gated_norm.py): weights in the activations' dtype (the rounded product)
    and in fp32, head dims 128 and 96 (a masked tail), the gate a row view of a wider projection."""
    from torch_aura.triton_kernels.gdn import gated_norm

    for D in (128, 96):
        o, z = torch.randn(8, D, dtype=dtype), torch.randn(8, D + 16, dtype=dtype)[:, 3:3 + D]
        for weight in (torch.ones(D, dtype=dtype), torch.ones(D)):
            gated_norm.gated_rms_norm(o, z, weight, 1e-6)
    variants = {(dict(key[2])["ROUND_P"], dict(key[2])["BD"]) for key in compile_only
                if key[0] == "_gated_rms_norm_kernel"}
    assert variants == {(dtype != torch.float32, 128)} | {(False, 128)}, variants
