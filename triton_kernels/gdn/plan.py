"""Plans: ``gdn_chunk``'s launches kept per geometry, the plan/run split of FlashInfer (gdn.md §6.1).

Every GDN layer of a forward calls ``gdn_chunk`` with one geometry (heads, dims, dtypes, B, T, the
varlen tensors' shapes, the strides), and every later forward at the same length repeats it. All that
the launchers compute in Python from it (which kernels, their grids, tuned configs, constexprs,
strides, buffer shapes, the cached launchers of ``_launch``) is then the same at every call: a plan
keeps it, and a call that finds its plan only allocates the buffers, builds the TMA descriptors that
embed their pointers, and calls each kernel's launcher with the new pointers.

A plan is not written by hand: the first call of a geometry runs the launchers as usual while
``_launch.recorder`` sees every launch (``_Recording``), and the plan is what they launched, with every
tensor argument replaced by a slot: an input of the call, or a buffer the call allocated (``empty``,
a view of one, ``zeros`` or a value computed from an input: the launchers ``note`` the last two),
allocated right before its first launch and dropped after its last, as the launchers drop them. The
stream switches of the pass beside w/u are noted as events (``note_event``). Nothing is planned
(the call just ran as usual) where a launch went through Triton without a cache entry (the
interpreter, a launch hook, a stand-in kernel, ``TORCH_AURA_FAST_LAUNCH=0``), a tuner timed configs,
the stream was capturing, or a tensor could not be given a slot.

A replay is one call into C where the plan allows it (``_native.ENABLED``): each launch's
parameter block is built once from the recorded arguments, as Triton's launcher would build it, and a
call patches in its buffers' addresses and TMA descriptors and launches them all without a Python call per
launch. Plans that hold large buffers of their own between launches, or a launch without a direct C launch,
replay in Python.

The key holds every fact the launchers read: each input's shape, strides, dtype and 16-byte alignment,
the varlen chunk table's shape (built before the lookup, as the launchers build it), scale, the flags,
the device and the environment variables read per call. On by default (``TORCH_AURA_GDN_PLAN=0`` turns
it off); ``tests/build/test_gdn_plan.py`` checks on the CPU that a planned call launches exactly what the
launchers launch, and ``tests/cuda/test_gdn_cuda.py -k planned`` that its replays equal them bit for bit.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import weakref

import torch

from ... import _env
from ..._checks.common import tensor_facts
from .. import _launch, _native
from . import _common

ENABLED = _env.get("TORCH_AURA_GDN_PLAN") and not _env.get("TRITON_INTERPRET")
_MAX_PLANS = 256  # bounded like _launch's cache: a plan per geometry, a forward needs one per length
_plans: dict[tuple, "_Plan | None"] = {}
_launch._on_clear.append(_plans.clear)

_N_INPUTS = 8  # q, k, v, g, beta, initial_state, cu_seqlens, chunk indices: slots 0-7
# ints skip the C launcher's data_ptr() call and cuPointerGetAttribute check per tensor (the key fixed
# the device); VERIFY replays keep tensors, which Triton's variant check reads (gdn.md 6.1)
POINTERS_AS_INTS = True
# one lifetime-packed workspace for the buffers only launches read, not an allocation each (gdn.md 6.1)
POOL_BUFFERS = True
_POOL_ALIGN = 512  # the caching allocator's alignment: what Triton's pointer specialisation (16) saw
# a replay calls each variant's C launch itself, the in-kernel descriptors' scratch carved from the pooled
# workspace instead of asked of the allocator at every launch (CudaLauncher.__call__): 82 us less host time
# per call on the H200, bit for bit the launchers' (gdn.md 6.1, sixth run); the spans are planned either way
DIRECT_LAUNCH = True
_NATIVE_HELD_BYTES = 1 << 20  # the most a native replay may hold for a whole call that a Python one frees sooner


# set by the launcher modules as they load (they import this one, never the other way): the tuners whose
# timing a recording must not keep, and state_pass._side_stream
TUNERS: list = []
side_stream = None


def _allocator_lent() -> bool:
    """Whether an allocator for in-kernel descriptors is set (``descriptor_workspace`` or the caller's)."""
    try:
        from triton.runtime import _allocation

        return not isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):
        return True


class _Address(int):
    """A pooled buffer's device address: an int to Triton's C launcher (taken as is), and ``data_ptr()``
    for a host TMA descriptor's base (``make_tensordesc_arg`` reads only that)."""

    def data_ptr(self) -> int:
        return int(self)


def pack_lifetimes(buffers: dict) -> tuple[dict, int]:
    """First-fit offsets for ``buffers`` (slot -> (bytes, first op, last op), ops inclusive), in order of
    first use: two buffers live at a common op never share a byte. Returns ({slot: offset}, total bytes)."""
    placed, offsets = [], {}
    for slot, (size, first, last) in sorted(buffers.items(), key=lambda kv: (kv[1][1], kv[0])):
        size = -(-size // _POOL_ALIGN) * _POOL_ALIGN
        offset = 0
        for lo, hi in sorted((o, o + n) for o, n, a, b in placed if a <= last and first <= b):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, size, first, last))
        offsets[slot] = offset
    return offsets, max((o + n for o, n, _, _ in placed), default=0)


class _Refuse(Exception):
    """This call cannot be planned: it ran as usual and no plan is kept."""


class _Recording:
    """Turns the launches of one call into a plan's ops as they happen, holding no tensor (weak
    references only), so the call frees its buffers as it would unrecorded."""

    def __init__(self, inputs):
        self.thread = threading.get_ident()
        self.slots: dict[int, tuple] = {}  # id(tensor) -> (weakref, slot)
        self.recipes: list = [None] * _N_INPUTS  # per slot: how a call makes it (None: an input)
        self.meta: list = [None] * _N_INPUTS  # per slot: (shape, stride, dtype, offset) as recorded
        self.ops: list = []
        self.compiled: dict[int, object] = {}  # op index -> its variant's CompiledKernel (signature, descriptors)
        self.workspace = False
        self.failed = None
        for i, x in enumerate(inputs):
            if x is not None:
                if id(x) in self.slots:
                    raise _Refuse("an input passed twice")
                self._bind(x, i)
        self.storages = {x.untyped_storage().data_ptr() for x in inputs if x is not None and x.numel()}

    def _bind(self, x, slot):
        self.slots[id(x)] = (weakref.ref(x), slot)

    def slot_of(self, x):
        got = self.slots.get(id(x))
        return got[1] if got is not None and got[0]() is x else None

    def _new(self, x, recipe) -> int:
        slot = len(self.recipes)
        self.recipes.append(recipe)
        self.meta.append((tuple(x.shape), x.stride(), x.dtype, x.storage_offset()))
        self._bind(x, slot)
        return slot

    def note(self, x, recipe):
        if threading.get_ident() == self.thread and self.failed is None:
            self._new(x, recipe)

    def event(self, name):
        if threading.get_ident() == self.thread and self.failed is None:
            self.ops.append(("event", name))

    def _tensor_slot(self, x) -> int:
        slot = self.slot_of(x)
        if slot is not None:
            return slot
        if not x.numel():
            raise _Refuse("an empty buffer")
        if x.untyped_storage().data_ptr() in self.storages:
            raise _Refuse("a view of an input")
        base = x._base
        if base is None:
            if x.storage_offset() or not x.is_contiguous():
                raise _Refuse("a strided buffer without a base")
            return self._new(x, ("empty", tuple(x.shape), x.dtype))
        b = self.slot_of(base)
        if b is None or self.recipes[b] is None:
            raise _Refuse("a view of a tensor the call did not allocate")
        return self._new(x, ("view", b, tuple(x.shape), x.stride(), x.storage_offset()))

    def __call__(self, kernel, grid, args, kwargs, entry):
        if threading.get_ident() != self.thread or self.failed is not None:
            return
        try:
            if entry is None:
                raise _Refuse(f"{getattr(kernel, '__name__', kernel)} launched without a cache entry")
            from triton.tools.tensor_descriptor import TensorDescriptor

            _, _, tail, variant, run, function, packed = entry
            values = [*args, *tail]
            holes = []
            for pos, a in enumerate(values):
                if isinstance(a, torch.Tensor):
                    holes.append((pos, self._tensor_slot(a), None))
                    values[pos] = None
                elif isinstance(a, TensorDescriptor):
                    d = (tuple(a.shape), tuple(a.strides), list(a.block_shape), a.padding)
                    holes.append((pos, self._tensor_slot(a.base), d))
                    values[pos] = None
            n = len(grid)
            self.workspace |= _allocator_lent()
            self.compiled[len(self.ops)] = _launch.compiled_of(kernel, variant)
            self.ops.append(("launch", kernel, (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1), run,
                             function, packed, values, holes, variant, len(args), dict(kwargs)))
        except _Refuse as e:
            self.failed = str(e)


class _Plan:
    """What ``run`` replays: ``ops`` (launches and stream events), with each slot's recipe, the slots
    to allocate before each op and drop after it, and the output slots."""

    def __init__(self, rec: _Recording, outputs: tuple[int, ...]):
        self.recipes, self.outputs, self.workspace = rec.recipes, outputs, rec.workspace
        self.n_slots = len(self.recipes)
        ops = rec.ops
        makes = [[] for _ in ops]
        drops = [[] for _ in ops]
        made, last = set(), {}
        side, wait = False, None
        side_from = [None] * len(ops)  # a side-stream launch: the op from which its stream overlaps the main one
        for i, op in enumerate(ops):
            if op[0] == "event":
                if op[1] == "wait":
                    wait = i
                elif op[1] == "enter":
                    side = True
                elif op[1] == "exit":
                    side, wait = False, None
                continue
            side_from[i] = wait if side else None
            for _, s, _ in op[7]:
                chain = [s]  # a view's base is made before it (its recipe reads it)
                while self.recipes[chain[-1]] is not None and self.recipes[chain[-1]][0] == "view":
                    chain.append(self.recipes[chain[-1]][1])
                for c in reversed(chain):
                    if self.recipes[c] is None:
                        continue
                    if c not in made:
                        made.add(c)
                        # between "wait" and "exit": made on the main stream before the side stream waits
                        # for it, as the launchers make every buffer before state_pass._beside (a zeros or
                        # computed slot runs kernels that the pass on the side stream must see finished)
                        makes[i if wait is None else wait].append(c)
                    last[c] = None if side else i  # used on the side stream: kept to the end, as today
        for s, i in last.items():
            if i is not None and s not in outputs:
                drops[i].append(s)
        if any(s not in made for s in outputs if self.recipes[s] is not None):
            raise _Refuse("an output no launch wrote")
        self.ops = [(*op, makes[i], drops[i]) if op[0] == "launch" else (*op, makes[i]) for i, op in enumerate(ops)]
        self.has_steps = any(op[0] == "event" for op in ops)
        self.direct, scratch = self._direct_launches(side_from)
        self.pool_spans = {**self._pool_spans(makes, last, outputs, len(ops)), **scratch}
        self.pool, self.pool_bytes = pack_lifetimes(self.pool_spans)
        self.native, self.native_made, why = self._native_program(rec.compiled)
        self.native_refused = why  # why this plan replays in Python (None: it need not)

    def _native_program(self, compiled) -> tuple:
        """``(_native's Program, the slots a native replay makes before its one C call, in address-table order,
        None)``, or ``(None, (), why)`` where the plan needs what only the Python replay does: a launch through
        Triton's launcher object, or large buffers of its own made and dropped between launches. The replay makes
        each buffer it does not pool (outputs; flags, offsets and segment tables of a few KB) before the call, not
        right before its first launch: on the same stream, so each is still ready before that launch, but held
        for the whole call (``_NATIVE_HELD_BYTES`` bounds what that adds to the call's peak)."""
        made = [s for ss in (op[-2] if op[0] == "launch" else op[-1] for op in self.ops) for s in ss]
        own = [s for s in made if s not in self.pool]
        held = sum(math.prod(self.recipes[s][1]) * self.recipes[s][2].itemsize for s in own
                   if s not in self.outputs and self.recipes[s][0] in ("empty", "zeros"))
        if held > _NATIVE_HELD_BYTES:
            return None, (), f"{held} bytes of buffers made and dropped between launches"
        address = {s: (s, 0) for s in range(_N_INPUTS)}
        address.update({s: (_N_INPUTS + j, 0) for j, s in enumerate(own)})
        pool_entry = _N_INPUTS + len(own)
        address.update({s: (pool_entry, at) for s, at in self.pool.items()})
        specs = []
        for i, (op, call) in enumerate(zip(self.ops, self.direct)):
            if op[0] == "event":
                specs.append(_native.step(op[1]))
                continue
            kernel = compiled.get(i)
            if call is None or kernel is None:
                return None, (), f"{getattr(op[1], '__name__', op[1])} has no direct C launch"
            _, grid, _, function, packed, values, holes = op[1:8]
            args = list(values)
            for pos, s, d in holes:
                args[pos] = _native.Pointer(*address[s]) if d is None else _native.Descriptor(*address[s], *d)
            _, prefix, key = call
            scratch = None if key is None else _native.Pointer(pool_entry, self.pool[key])
            try:
                specs.append(_native.launch_spec(kernel, function, packed, prefix, grid, args, scratch))
            except (ValueError, AttributeError) as e:
                return None, (), f"{getattr(op[1], '__name__', op[1])}: {e}"
        mod = _native.module()
        if mod is None:
            return None, (), "native_replay.c did not build"
        if pool_entry + 1 > mod.MAX_ADDRESSES:
            return None, (), "more buffers than the native replay's address table"
        return mod.Program(tuple(specs), pool_entry + 1), tuple(own), None

    def _direct_launches(self, side_from) -> tuple[list, dict]:
        """Per op, what :data:`DIRECT_LAUNCH` calls instead of the launcher object: (Triton 3.6's C ``launch``, its
        prefix, the key of its scratch span or None) from ``_launch.direct_launch``, or None where it gives none (a
        variant that profiles, or aligns its scratch beyond the pool's). A variant with in-kernel descriptors gets
        a scratch span: grid x its scratch per program, live at its own launch only (the next launch on the stream
        starts after it ends); on the side stream, from the side stream's "wait" to the end, as the buffers it
        reads: it overlaps the main stream's w/u launch made after that wait. Span keys are negative: never a
        slot."""
        direct, spans, n_ops = [None] * len(self.ops), {}, len(self.ops)
        for i, op in enumerate(self.ops):
            call = _launch.direct_launch(op[3], op[4], op[5], _POOL_ALIGN) if op[0] == "launch" else None
            if call is None:
                continue
            launch, prefix, scratch = call
            gx, gy, gz = op[2]
            size = gx * gy * gz * scratch
            key = -1 - i if size else None
            if size:
                spans[key] = (size, i, i) if side_from[i] is None else (size, side_from[i], n_ops)
            direct[i] = (launch, prefix, key)
        return direct, spans

    def _pool_spans(self, makes, last, outputs, n_ops) -> dict:
        """The "empty" buffers that only launches read (:data:`POOL_BUFFERS`): slot -> (bytes, the op it is
        made at, its last op: the end for those the pass beside w/u uses, kept to the end as the launchers
        keep them)."""
        bases = {r[1] for r in self.recipes if r is not None and r[0] == "view"}
        first = {s: i for i, ss in enumerate(makes) for s in ss}
        buffers = {}
        for s, i in first.items():
            r = self.recipes[s]
            if r[0] == "empty" and s not in outputs and s not in bases:
                end = last[s]
                buffers[s] = (math.prod(r[1]) * r[2].itemsize, i, n_ops if end is None else end)
        return buffers

    def _make(self, slots, s, device, workspace=None, as_tensors=True):
        r = self.recipes[s]
        if workspace is not None and s in self.pool:
            at = self.pool[s]
            if not as_tensors:
                return _Address(workspace.data_ptr() + at)
            return workspace[at:at + self.pool_spans[s][0]].view(r[2]).view(r[1])
        kind = r[0]
        if kind == "empty":
            return torch.empty(r[1], dtype=r[2], device=device)
        if kind == "view":
            return slots[r[1]].as_strided(r[2], r[3], r[4])
        if kind == "zeros":
            return torch.zeros(r[1], dtype=r[2], device=device)
        return r[1](*[slots[i] for i in r[2]])  # "computed": fn(*input slots)

    def run(self, inputs, device):
        if self.native is not None and _native.ENABLED and POOL_BUFFERS and DIRECT_LAUNCH and not _launch.VERIFY:
            return self._replay_native(inputs, device)
        slots = [*inputs, *[None] * (self.n_slots - _N_INPUTS)]
        drv, dev, stream = _launch.current()
        verify = _launch.VERIFY
        # the launchers lend Triton an allocator for in-kernel descriptors; the replay must too
        lent = _common.descriptor_workspace(device) if self.workspace else contextlib.nullcontext()
        with lent:
            return self._replay(slots, device, drv, dev, stream, verify)

    def _replay_native(self, inputs, device):
        slots = [*inputs, *[None] * (self.n_slots - _N_INPUTS)]
        for s in self.native_made:
            slots[s] = self._make(slots, s, device)
        pool = torch.empty(self.pool_bytes, dtype=torch.uint8, device=device) if self.pool_bytes else None
        addresses = (*[0 if x is None else x.data_ptr() for x in inputs],
                     *[slots[s].data_ptr() for s in self.native_made], 0 if pool is None else pool.data_ptr())
        _, _, stream = _launch.current()
        side = side_stream(device).cuda_stream if self.has_steps else 0
        self.native.replay(addresses, stream, side)  # the pool is held until every launch is queued
        return tuple(slots[s] for s in self.outputs)

    def _replay(self, slots, device, drv, dev, stream, verify):
        from triton.tools.tensor_descriptor import TensorDescriptor

        ctx = side = None
        as_tensors = verify or not POINTERS_AS_INTS
        pool = (torch.empty(self.pool_bytes, dtype=torch.uint8, device=device)
                if POOL_BUFFERS and self.pool_bytes else None)  # held until the replay returns
        direct = self.direct if DIRECT_LAUNCH else itertools.repeat(None)
        base = pool.data_ptr() if pool is not None else 0
        try:
            for op, call in zip(self.ops, direct):
                if op[0] == "event":
                    for s in op[2]:
                        slots[s] = self._make(slots, s, device, pool, as_tensors)
                    stream, ctx, side = self._event(op[1], device, ctx, side)
                    stream = drv.get_current_stream(dev) if stream is None else stream
                    continue
                _, kernel, (gx, gy, gz), run, function, packed, values, holes, variant, n_args, kwargs, makes, \
                    drops = op
                for s in makes:
                    slots[s] = self._make(slots, s, device, pool, as_tensors)
                a = values.copy()
                for pos, s, d in holes:
                    if d is None:
                        a[pos] = slots[s] if as_tensors else slots[s].data_ptr()
                    else:
                        t = TensorDescriptor.__new__(TensorDescriptor)
                        t.base, t.shape, t.strides, t.block_shape, t.padding = slots[s], d[0], d[1], d[2], d[3]
                        a[pos] = t
                if verify:
                    got = _launch._variant_key(kernel, a[:n_args], kwargs)
                    if got != variant:
                        raise AssertionError(f"{kernel.__name__}: planned launch ran variant {variant}, Triton "
                                             f"derives {got}")
                if call is not None and (call[2] is None or pool is not None):
                    launch, prefix, key = call
                    if key is not None:
                        at = _launch.SCRATCH
                        prefix = (*prefix[:at], base + self.pool[key], *prefix[at + 1:])
                    launch(gx, gy, gz, stream, *prefix, *a)
                else:
                    run(gx, gy, gz, stream, function, packed, None, None, None, *a)
                for s in drops:
                    slots[s] = None
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        return tuple(slots[s] for s in self.outputs)

    @staticmethod
    def _event(name, device, ctx, side):
        """``state_pass._beside``'s stream steps, in its order: the side stream waits for the main one
        ("wait"; the w/u launch follows on the main stream), the pass launches on the side stream
        ("enter"), the main stream waits for it ("exit")."""
        if name == "wait":
            side = side_stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            return None, ctx, side
        if name == "enter":
            ctx = torch.cuda.stream(side)
            ctx.__enter__()
            return None, ctx, side
        ctx.__exit__(None, None, None)
        torch.cuda.current_stream(device).wait_stream(side)
        return None, None, side


# ------------------------------------------------------------------ what the launchers call
def note_zeros(x: torch.Tensor) -> None:
    """``x`` was allocated by ``torch.zeros`` (a plan makes it so each call)."""
    rec = _launch.recorder
    if rec is not None and isinstance(rec, _Recording):
        rec.note(x, ("zeros", tuple(x.shape), x.dtype))


def note_computed(x: torch.Tensor, fn, *of: torch.Tensor) -> None:
    """``x = fn(*of)``, ``of`` inputs of the call (a plan computes it so each call)."""
    rec = _launch.recorder
    if rec is not None and isinstance(rec, _Recording):
        slots = [rec.slot_of(t) for t in of]
        if None in slots or any(s >= _N_INPUTS for s in slots):
            rec.failed = "computed from a buffer"
            return
        rec.note(x, ("computed", fn, slots))


def note_event(name: str) -> None:
    rec = _launch.recorder
    if rec is not None and isinstance(rec, _Recording):
        rec.event(name)


# ------------------------------------------------------------------------------ gdn_chunk
# the variables the recorded launches depend on (the overlap, the SM share the grids assume, tuning)
_KEYED_VARIABLES = ("TORCH_AURA_GDN_OVERLAP", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "TORCH_AURA_TUNE")


def _key(inputs, device, scale, use_qk_l2norm, state_v_first):
    # the current device too: _launch's entries are per current device, as the launches run there
    current = torch.cuda.current_device() if device.type == "cuda" else None
    return (device, current, tensor_facts(inputs, True), scale, use_qk_l2norm, state_v_first,
            *_env.raw(_KEYED_VARIABLES))


def key_inputs(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices) -> tuple:
    """The call's eight tensor slots as a plan keys and replays them (slots 0-7)."""
    if cu_seqlens is not None:  # the launchers' chunk table: its length is part of the geometry
        from ._common import _varlen_plan

        chunk_indices = _varlen_plan(q.shape[1], q.shape[0], cu_seqlens, chunk_indices)[0]
    else:
        chunk_indices = None
    return (q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices)


def chunk(body, check, q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices, use_qk_l2norm,
          state_v_first):
    """``body(...)`` (``chunk._gdn_chunk``, the launchers) through this geometry's plan: replayed where one
    exists, else ``check(...)`` (the arguments' checks) and ``body`` run and, where it can be, ``body`` is
    recorded into one. A replay skips ``check``: its plan was recorded from a call that passed it, and the
    key holds every fact the checks read (each tensor's shape, strides, dtype and device, the scalars)."""
    args = (q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices, use_qk_l2norm, state_v_first)
    if not (_launch.ENABLED and _launch.hooks_idle()) or _launch.recorder is not None:
        check(*args)
        return body(*args)
    try:
        device = q.device
        inputs = key_inputs(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices)
        key = _key(inputs, device, scale, use_qk_l2norm, state_v_first)
    except Exception:  # an argument the key cannot read: the checks name it
        check(*args)
        raise
    try:
        plan = _plans.get(key, False)
    except TypeError:  # an unhashable scale
        key, plan = None, None
    if plan:
        return plan.run(inputs, device)
    check(*args)
    # the launchers take the chunk table key_inputs built (from cu_seqlens where the caller passed none)
    built = (*inputs[:5], scale, initial_state, cu_seqlens, inputs[7], use_qk_l2norm, state_v_first)
    rec = None
    if plan is not None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        try:
            rec = _Recording(inputs)
        except _Refuse:
            pass
    if rec is None:
        return body(*built)
    timed = sum(t.timed for t in TUNERS)
    _launch.recorder = rec
    try:
        out = body(*built)
    finally:
        _launch.recorder = None
    if sum(t.timed for t in TUNERS) != timed:
        return out  # a tuner timed configs: the launches recorded are its trials; plan the next call
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    try:
        if rec.failed is not None or not rec.ops:
            raise _Refuse(rec.failed)
        outputs = tuple(rec.slot_of(x) for x in out)
        if None in outputs:
            raise _Refuse("an output no launch saw")
        _plans[key] = _Plan(rec, outputs)
    except _Refuse:
        _plans[key] = None  # this geometry runs as usual from now on
    return out


def clear() -> None:
    _plans.clear()
