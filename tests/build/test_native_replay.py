"""A plan replayed by ``native_replay.c`` (``_native.ENABLED``) hands the driver what Triton 3.6's launcher
hands it when the same plan replays in Python.

No GPU: the launches are stubbed (``gdn/launch_stub.py``); the C module is built by Triton's launcher builder
and its driver calls are stood in for (``record``), each appending what it was handed: a launch's grid,
block, shared memory, stream and parameter block, a TMA descriptor's encoding arguments, a stream step.
Each parameter block is decoded here, independently of ``_native.parameters``, from the variant's
signature and the arguments the Python replay handed Triton's C launch, following Triton's
``make_launcher`` (constexprs dropped, descriptors expanded, the two scratch pointers last).
"""

from __future__ import annotations

import os
import struct

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="Triton's compiled-launch path; the interpreter tree runs kernels instead")

from _gdn_plan_mix import GEOMETRIES, calls as _calls, inputs as _inputs  # noqa: E402

_INT = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H", "u32": "I",
        "u64": "Q"}


@pytest.fixture
def native(monkeypatch):
    """The launches stubbed with the native replay's driver stood in for; yields (the C module, its log)."""
    from torch_aura.triton_kernels import _native
    from torch_aura.triton_kernels.gdn import launch_stub, plan

    module = _native.module()
    if module is None:
        pytest.skip("native_replay.c did not build here (no C compiler)")
    real = torch.empty.__globals__  # nothing is computed: no NaN poisoning (tests/conftest.py)
    monkeypatch.setattr(torch, "empty", real.get("_real_empty", torch.empty))
    with launch_stub.stubbed([], verify=False, setattr=monkeypatch.setattr, native=True):
        monkeypatch.setattr(plan, "ENABLED", True)
        yield module, launch_stub.native_log


class _Names:
    """Labels for device addresses: an input of the call, a buffer the replay made (by slot), a place in the
    pooled workspace, null. Both replays of a call get the same inputs, so equal labels mean equal roles."""

    def __init__(self, inputs):
        self.inputs = [x for x in inputs]
        self.made: dict[int, int] = {}  # address -> slot
        self.held: list = []
        self.pools: list[tuple[int, int]] = []  # (base, bytes)

    def __call__(self, address):
        if address is None or address == 0:
            return ("null",)
        for i, x in enumerate(self.inputs):
            if x is not None and x.data_ptr() == address:
                return ("in", i)
        if address in self.made:
            return ("made", self.made[address])
        for base, n in self.pools:
            if base <= address < base + n:
                return ("pool", address - base)
        return ("unknown", address)


def _replay(monkeypatch, plan, call, native: bool):
    """One replay of ``call`` (its plan recorded), returning (the plan, the address labels)."""
    names, used = _Names(()), []
    real_make, real_run, real_empty = plan._Plan._make, plan._Plan.run, torch.empty

    def make(self, slots, s, *a):
        x = real_make(self, slots, s, *a)
        if isinstance(x, torch.Tensor):
            names.held.append(x)  # no later buffer of the call takes its address
            names.made.setdefault(x.data_ptr(), s)  # a view at its base's address is named by its base
        return x

    def empty(*a, **kw):
        x = real_empty(*a, **kw)
        if x.dtype == torch.uint8 and x.dim() == 1:  # the pooled workspace
            names.pools.append((x.data_ptr(), x.numel()))
        return x

    def run(self, inputs, device):
        used.append(self)
        names.inputs = list(inputs)  # the call's chunk table is built per call from cu_seqlens
        return real_run(self, inputs, device)
    from torch_aura.triton_kernels import _native

    with monkeypatch.context() as m:
        m.setattr(_native, "ENABLED", native)
        m.setattr(plan._Plan, "_make", make)
        m.setattr(plan._Plan, "run", run)
        m.setattr(torch, "empty", empty)
        call()
    assert len(used) == 1, "the call was not replayed"
    return used[0], names


def _expected(signature, meta, args, names):
    """Triton's parameters for ``args`` as ``(kind, value)``: ("ptr", label), ("int", fmt, value),
    ("float", fmt, value), ("map", encode arguments), following make_launcher and make_tensordesc_arg."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    from triton.tools.tensor_descriptor import TensorDescriptor

    out, metas = [], iter(meta or ())
    for ty, a in zip(signature, args, strict=True):
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc"):
            assert isinstance(a, TensorDescriptor)
            m = next(metas)
            base = a.base if isinstance(a.base, int) else a.base.data_ptr()
            strides = tuple(m["elem_size"] * s for s in reversed(a.strides[:-1]))
            fill = 1 if a.padding == "nan" else 0
            out.append(("map", (TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], len(a.shape), names(base),
                                tuple(reversed(a.shape)), strides, tuple(reversed(m["block_size"])), m["swizzle"],
                                fill)))
            out += [("int", "<i", s) for s in a.shape] + [("int", "<q", s) for s in a.strides]
        elif ty[0] == "*":
            out.append(("ptr", names(a if isinstance(a, int) or a is None else a.data_ptr())))
        elif ty in _INT:
            out.append(("int", "<" + _INT[ty], int(a)))
        elif ty == "fp32":
            out.append(("float", "<f", a))
        else:
            raise AssertionError(f"a parameter of type {ty}: extend this decoder")
    return out


def _decode(block, offsets, expected, encodes, names):
    """The parameters ``expected`` names, read from the recorded block at the recorded offsets."""
    got = []
    encodes = iter(encodes)
    for (kind, *rest), at in zip(expected, offsets, strict=True):
        if kind == "ptr":
            got.append(("ptr", names(struct.unpack_from("<Q", block, at)[0])))
        elif kind == "map":
            assert at % 128 == 0, "a CUtensorMap parameter off its 128-byte alignment"
            e = next(encodes)  # the stand-in encoding puts the base first in the map
            assert struct.unpack_from("<Q", block, at)[0] == e[3]
            got.append(("map", (e[1], e[2], names(e[3]), *e[4:])))
        else:
            fmt = rest[0]
            got.append((kind, fmt, struct.unpack_from(fmt, block, at)[0]))
    return got


def _expected_floats(expected):
    """fp32 values as the block holds them (rounded to float)."""
    return [(k, r[0], struct.unpack("<f", struct.pack("<f", r[1]))[0]) if k == "float" else (k, *r)
            for k, *r in expected]


def test_native_replays_hand_the_driver_what_triton_launchers_hand_it(native, monkeypatch):
    """Over the plan tests' whole mix of geometries (odd lengths, batches, varlen, both state layouts, the
    serial, sequence-parallel and overlapped passes, fp16/fp32, strided views), each launch of a native replay
    has the grid, block, shared memory, stream and parameters of the same launch replayed in Python, its TMA
    descriptors encoded from the same bases and geometry; the pass beside w/u forks and joins the side stream
    around its launch."""
    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import chunk, launch_stub, plan

    module, log = native
    c_launches = launch_stub._workspace["c_launches"]
    checked = overlapped = 0
    refused = []
    for B, T, kw, l2, scale in _calls():
        inputs = _inputs(B, T, **kw)
        q, k, v, g, beta, h0, cu, ci = inputs

        def call():
            return chunk.gdn_chunk(q, k, v, g, beta, scale, h0, cu, ci, l2, kw.get("state_v_first", False))
        call()  # recorded
        start = len(c_launches)
        p, py_names = _replay(monkeypatch, plan, call, native=False)
        python = c_launches[start:]
        if p.native is None:
            refused.append((B, T, kw, p.native_refused))
            continue
        start = len(log)
        _, c_names = _replay(monkeypatch, plan, call, native=True)
        entries = log[start:]
        launches = [e for e in entries if e[0] == "launch"]
        assert len(launches) == len(python)
        ops = [op for op in p.ops if op[0] == "launch"]
        for op, (name, c_args), rec in zip(ops, python, launches):
            gx, gy, gz, stream, function, coop, pdl, scratch, profile, packed, _, _, _, *args = c_args
            _, function_, grid, block_x, shared, stream_, cluster, coop_, pdl_, block, offsets = rec
            assert (function_, grid, block_x, shared, cluster, coop_, pdl_) == \
                (function, (gx, gy, gz), 32 * packed[0], packed[2], packed[1], int(coop), int(pdl)), name
            compiled = _launch.compiled_of(op[1], op[8])
            expected = _expected(list(compiled.src.signature.values()), compiled.metadata.tensordesc_meta, args,
                                 py_names)
            expected += [("ptr", py_names(scratch if isinstance(scratch, int) or scratch is None else 0)),
                         ("ptr", ("null",))]
            maps = sum(k == "map" for k, *_ in expected)
            encodes = [e for e in entries if e[0] == "encode"][:maps] if maps else []
            if maps:  # this replay's encodes for this launch: taken in order
                entries = entries[entries.index(encodes[-1]) + 1:]
            assert _decode(block, offsets, expected, encodes, c_names) == _expected_floats(expected), (name, B, T, kw)
        # stream steps: a fork before the pass beside w/u and a join after it, the pass on the side stream
        events = [op[1] for op in p.ops if op[0] == "event"]
        if events:
            overlapped += 1
            assert events == ["wait", "enter", "exit"]
            forks = [e for e in log[start:] if e[0] in ("record", "wait")]
            assert [e[0] for e in forks] == ["record", "wait", "record", "wait"]
            assert forks[0][2] == 0 and forks[1][1] == launch_stub.SIDE_STREAM.cuda_stream  # main -> side
            assert forks[2][2] == launch_stub.SIDE_STREAM.cuda_stream and forks[3][1] == 0  # side -> main
            enter = next(i for i, op in enumerate(p.ops) if op[0] == "event" and op[1] == "enter")
            exit_ = next(i for i, op in enumerate(p.ops) if op[0] == "event" and op[1] == "exit")
            on_side = [i for i, op in enumerate(p.ops) if op[0] == "launch" and enter < i < exit_]
            streams = [rec[5] for rec in launches]
            launch_at = [i for i, op in enumerate(p.ops) if op[0] == "launch"]
            assert [s for i, s in zip(launch_at, streams) if i in on_side] == [1] * len(on_side)
            assert all(s == 0 for i, s in zip(launch_at, streams) if i not in on_side)
        else:
            assert all(rec[5] == 0 for rec in launches)
        checked += 1
    assert overlapped, "no plan ran the pass beside w/u"
    assert not refused, f"plans of the mix that replay in Python: {refused}"
    assert checked == len(list(_calls()))


def test_descriptors_are_encoded_again_only_when_their_base_moves(native, monkeypatch):
    """A TMA descriptor's encoding depends on its base and the plan's fixed geometry only: a replay whose
    bases repeat copies the last encoding; one whose input moves encodes that input's descriptors again."""
    from torch_aura.triton_kernels.gdn import chunk

    module, log = native
    B, T, kw, l2, scale = GEOMETRIES[6]  # 1 x 8192, 2/4 heads: w/u reads seven host descriptors
    q, k, v, g, beta, h0, cu, ci = _inputs(B, T, **kw)
    keep = []

    def call(v=v):
        out = chunk.gdn_chunk(q, k, v, g, beta, scale, h0, cu, ci, l2, False)
        keep.append(out)  # the outputs stay allocated, so the next replay's pool keeps its address
        return out
    call()
    pools = []
    real_empty = torch.empty

    def empty(*a, **kw):
        x = real_empty(*a, **kw)
        if x.dtype == torch.uint8 and x.dim() == 1:
            pools.append(x)  # held: no later replay gets this workspace's address
        return x
    monkeypatch.setattr(torch, "empty", empty)

    start = len(log)
    call()
    first = [e for e in log[start:] if e[0] == "encode"]
    assert len(first) == 7
    monkeypatch.setattr(torch, "empty", real_empty)
    pool = pools[-1]
    # the same workspace address again: hand the replay the held one
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: pool if kw.get("dtype") == torch.uint8 and len(a) == 1
                        and a[0] == pool.numel() else real_empty(*a, **kw))
    start = len(log)
    call()
    assert not [e for e in log[start:] if e[0] == "encode"], "an encoding was not reused"
    moved = v.clone()
    start = len(log)
    call(moved)
    again = [e for e in log[start:] if e[0] == "encode"]
    assert again and all(e[3] == moved.data_ptr() for e in again), "only the moved input's descriptors re-encode"


@pytest.mark.parametrize("spec, message", [
    (((0, (1, 1, 1), 4, 1, 0, False, False, b"\0" * 8, (0,), ((0, 5, 0),), ()),), "address table"),
    (((0, (1, 1, 1), 4, 1, 0, False, False, b"\0" * 8, (8,), (), ()),), "outside its block"),
    (((0, (1, 1, 1), 4, 1, 0, False, False, b"\0" * 136, (0,), (),
       ((8, 0, 0, 9, 2, 3, 0, (64, 64), (128,), (64, 64)),)),), "misplaced"),
    ((7,), "stream step"),
])
def test_a_malformed_program_is_refused(native, spec, message):
    """The C Program checks every offset and index it will write through or read from when it is built."""
    module, _ = native
    with pytest.raises(ValueError, match=message):
        module.Program(spec, 2)


def test_pack_follows_tritons_scalar_encodings():
    """Scalars are stored as Triton's launcher stores them: ints at their width, fp32 as float, bf16 as the top
    half of the fp32 (truncated, Triton's pack_bf16), fp16 rounded; each at its natural alignment, the two
    scratch pointers last."""
    from torch_aura.triton_kernels import _native

    params = [("i1", True), ("i32", -3), ("i64", 2 ** 40), ("fp32", 0.1), ("bf16", 1.0 + 2 ** -9), ("fp16", 0.1),
              ("*fp32", _native.Pointer(3, 16)), ("u8", 255)]
    block, offsets, pointers, maps = _native.pack(params, _native.Pointer(4, 512))
    assert offsets == (0, 4, 8, 16, 20, 22, 24, 32, 40, 48)
    assert struct.unpack_from("<b", block, 0)[0] == 1 and struct.unpack_from("<i", block, 4)[0] == -3
    assert struct.unpack_from("<q", block, 8)[0] == 2 ** 40
    assert struct.unpack_from("<f", block, 16)[0] == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert block[20:22] == struct.pack("<f", 1.0 + 2 ** -9)[2:]  # truncated, not rounded up
    assert block[22:24] == struct.pack("<e", 0.1)
    assert block[32] == 255 and block[40:56] == bytes(16)
    assert pointers == ((24, 3, 16), (40, 4, 512)) and maps == ()


def test_plans_replay_in_python_where_the_module_cannot_build(monkeypatch):
    """No C compiler (or Python headers): ``module()`` warns once and returns None; plans are recorded as before
    and replay through Triton's launcher, launch for launch."""
    import triton.runtime.build as build

    from torch_aura.triton_kernels import _native
    from torch_aura.triton_kernels.gdn import chunk, launch_stub, plan

    def no_compiler(*a, **kw):
        raise RuntimeError("Failed to find C compiler")
    monkeypatch.setattr(build, "compile_module_from_src", no_compiler)
    _native.module.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="replay in Python: native_replay.c did not build"):
            assert _native.module() is None
        real = torch.empty.__globals__
        monkeypatch.setattr(torch, "empty", real.get("_real_empty", torch.empty))
        log = []
        with launch_stub.stubbed(log, verify=False, setattr=monkeypatch.setattr, native=True):
            monkeypatch.setattr(plan, "ENABLED", True)
            q, k, v, g, beta, h0, cu, ci = _inputs(1, 300)
            for _ in range(2):
                start = len(log)
                chunk.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci, True, False)
                launches = [e for e in log[start:] if e[0] == "launch"]
                assert launches
            (p,) = [p for p in plan._plans.values() if p]
            assert p.native is None and p.native_refused == "native_replay.c did not build"
    finally:
        _native.module.cache_clear()  # the next caller builds (or loads) the real module again


def _recurrent_calls():
    """gdn_recurrent geometries as decoders call it: batched, varlen with pool rows (one skipped), the [V, K] pool
    layout, strided q/k/v views of one projection row, fp16 / fp32, a multi-token step."""
    def make(B, T, H, HV, K, V, dt, rows=None, offsets=None, v_first=False, packed=False, seed=0):
        gen = torch.Generator().manual_seed(seed)
        if packed:  # q, k, v as views of one [B, T, (2H + HV) K] row, as vLLM's decode hands them over
            mixed = torch.randn(B, T, (2 * H + HV) * K, generator=gen).to(dt)
            q, k, v = (x.view(B, T, -1, K) for x in mixed.split([H * K, H * K, HV * V], dim=-1))
        else:
            q, k = (torch.randn(B, T, H, K, generator=gen).to(dt) for _ in range(2))
            v = torch.randn(B, T, HV, V, generator=gen).to(dt)
        g, beta = -torch.rand(B, T, HV, generator=gen), torch.rand(B, T, HV, generator=gen)
        P = 2 * (B if offsets is None else len(offsets) - 1) + 1
        pool = torch.zeros((P, HV, V, K) if v_first else (P, HV, K, V))
        si = None if rows is None else torch.tensor(rows, dtype=torch.int32)
        cu = None if offsets is None else torch.tensor(offsets, dtype=torch.int32)
        return (q, k, v, g, beta, pool, si, cu, None, True, v_first)
    return [make(3, 1, 2, 4, 32, 32, torch.float32),
            make(1, 7, 2, 2, 64, 48, torch.float16, rows=[4, -1, 0], offsets=[0, 3, 3, 7]),
            make(5, 1, 4, 8, 128, 128, torch.float16, rows=[9, 2, 5, 0, 7], v_first=True, packed=True),
            make(2, 2, 1, 3, 16, 24, torch.float32, rows=[1, 3])]


def _engine_gates(HV: int, seed: int) -> dict:
    """The launcher-only arguments of a serving engine's one-launch decode (``gates=``, ``null=``)."""
    gen = torch.Generator().manual_seed(seed)
    return {"gates": (torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)), "null": 0}


def test_recurrent_native_launches_hand_the_driver_what_tritons_launcher_hands_it(native, monkeypatch):
    """A gdn_recurrent geometry's first call launches through ``_launch`` and keeps the launch as a one-launch
    Program (``_launch.native_program``); each later call is that Program with its tensors' addresses. The driver
    gets the grid, block, shared memory, stream and every parameter Triton's C launch gets for the same call (the
    call with ``_launch.VERIFY`` on, which goes through Triton's launcher), the tensors at the call's own addresses
    (its output included, and a one-launch decode's gate vectors, other tensors than its first call's), and
    Triton's launcher is not called."""
    from torch_aura.triton_kernels import _launch
    from torch_aura.triton_kernels.gdn import launch_stub, recurrent

    module, log = native
    c_launches = launch_stub._workspace["c_launches"]
    packed_decode = _recurrent_calls()[2]
    calls = [(args, {}, {}) for args in _recurrent_calls()]
    calls.append((packed_decode, _engine_gates(8, 1), _engine_gates(8, 2)))  # vLLM's packed decode, one launch
    for args, first_kw, kw in calls:
        recurrent.gdn_recurrent(*args, **first_kw)  # the first call: through _launch, which keeps the Program
        engine = () if not kw else (*kw["gates"], kw["null"])
        holder = recurrent._geometry_of(*args, *engine)[-1]
        assert holder.program is not None, holder.refused
        tensors = [*args[:8], *engine[:2]]
        start, before = len(log), len(c_launches)
        o = recurrent.gdn_recurrent(*args, **kw)
        launches = [e for e in log[start:] if e[0] == "launch"]
        assert len(launches) == 1 and len(c_launches) == before, "not one native launch"
        with monkeypatch.context() as m:
            m.setattr(_launch, "VERIFY", True)  # run_native declines: the call goes through Triton's launcher
            o_py = recurrent.gdn_recurrent(*args, **kw)
        assert len(log) == start + len(launches) and len(c_launches) == before + 1
        name, c_args = c_launches[-1]
        gx, gy, gz, stream, function, coop, pdl, scratch, profile, packed, _, _, _, *py_args = c_args
        _, function_, grid, block_x, shared, stream_, cluster, coop_, pdl_, block, offsets = launches[0]
        assert (function_, grid, block_x, shared, stream_, cluster, coop_, pdl_) == \
            (function, (gx, gy, gz), 32 * packed[0], packed[2], stream, packed[1], int(coop), int(pdl))
        options = recurrent._geometry_of(*args, *engine)[4]  # the constexprs and num_warps
        kernel = recurrent._gdn_recurrent_kernel
        constexprs = sum(p.is_constexpr for p in kernel.params)  # the C launch's last arguments
        compiled = _launch.compiled_of(kernel, _launch._variant_key(kernel, py_args[:-constexprs], options))
        expected = _expected(list(compiled.src.signature.values()), None, py_args, _Names([*tensors, o_py]))
        expected += [("ptr", ("null",)), ("ptr", ("null",))]  # no scratch of either kind
        assert _decode(block, offsets, expected, [], _Names([*tensors, o])) == _expected_floats(expected), name


def test_recurrent_launches_go_through_triton_where_a_hook_reads_them(native, monkeypatch):
    """A launch hook (a profiler reads Triton's launch metadata) sends every call through Triton's launcher, the
    kept Program unused; without the hook the next call is native again."""
    from triton import knobs

    from torch_aura.triton_kernels.gdn import launch_stub, recurrent

    module, log = native
    c_launches = launch_stub._workspace["c_launches"]
    args = _recurrent_calls()[0]
    recurrent.gdn_recurrent(*args)
    seen = []
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda meta: seen.append(meta))
    start, before = len(log), len(c_launches)
    recurrent.gdn_recurrent(*args)
    assert len(c_launches) == before + 1 and seen and not [e for e in log[start:] if e[0] == "launch"]
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    recurrent.gdn_recurrent(*args)
    assert len(c_launches) == before + 1 and [e for e in log[start:] if e[0] == "launch"]
