"""The GDN launchers on a CPU with Triton's launches stubbed: developer tooling, not a backend.

Triton's runtime runs in full (binding, variant keys, the cached launchers of ``_launch``, the plans of
``plan``) against a stand-in driver modelled as an sm_90 device of 132 SMs, as a CUDA build of torch makes
Triton's driver; every compiled variant has Triton's own launcher object over a stand-in of its C launch,
which runs nothing and, given a log, records what it was handed: each Python line of a real launch runs.
Used by the launch tests (``tests/build/test_gdn_launch.py``, ``test_gdn_plan.py``) and by
``benchmarks/profile_gdn.py --host-cpu`` (the launchers' host time without a GPU).

    with stubbed(log) as fresh:   # log: a list of ("launch", name, grid, args) and ("event", name)
        chunk.gdn_chunk(...)      # CPU tensors; nothing is computed
        fresh()                   # empty the JIT, launch and plan caches
"""

from __future__ import annotations

import builtins
import contextlib
import threading
import types

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaLauncher
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from .. import _launch, _native, _tune
from . import _common, chunk, plan, prep, recurrent, segments, state_pass

SMS = 132  # an H100 SXM: the sequence-parallel plan depends on the SM count
SIDE_STREAM = types.SimpleNamespace(cuda_stream=1)  # state_pass's side stream as the native replay reads it


def _torch_current_device():
    """``torch.cuda.current_device`` as a CUDA build of torch runs it once CUDA is initialised: torch's own code
    (its lazy-init check, then ``torch._C._cuda_getDevice``) over stand-ins of its C calls (device 0, no bad fork)."""
    c_calls = types.SimpleNamespace(_cuda_getDevice=int)  # int() is 0, and a C call as torch's is
    namespace = {"__builtins__": builtins, "_initialized": True, "_is_in_bad_fork": bool, "_tls": threading.local(),
                 "torch": types.SimpleNamespace(_C=c_calls)}
    for fn in (torch.cuda.is_initialized, torch.cuda._lazy_init, torch.cuda.current_device):
        namespace[fn.__name__] = types.FunctionType(fn.__code__, namespace, fn.__name__)
    return namespace["current_device"], c_calls._cuda_getDevice


_current_device, _raw_current_device = _torch_current_device()


class _Launcher(CudaLauncher):
    """Triton 3.6's launcher object (``CompiledKernel.run``): its ``__call__`` is Triton's own (the scratch from the
    allocators, then the C ``launch``); ``launch`` stands in for the C function: it runs nothing, calls the hooks
    it is handed as the C one does, and, given a log, records what it was handed."""

    def __init__(self, name: str, log: list | None, scratch: int):  # not CudaLauncher's, which builds the C module
        self.name, self.log = name, log
        self.num_ctas, self.launch_cooperative_grid, self.launch_pdl = 1, False, False
        self.global_scratch_size, self.global_scratch_align = scratch, 128
        self.profile_scratch_size, self.profile_scratch_align = 0, 1

    def launch(self, gx, gy, gz, stream, function, cooperative, pdl, scratch, profile_scratch, packed, meta, enter,
               exit_, *args):
        if self.global_scratch_size and scratch is None:  # the kernel's in-kernel descriptors would have no memory
            raise RuntimeError(f"{self.name}: launched without the scratch its descriptors need")
        if enter is not None:
            enter(meta)
        if self.log is not None:
            self.log.append(("launch", self.name, (gx, gy, gz), args))
            _workspace["c_launches"].append((self.name, (gx, gy, gz, stream, function, cooperative, pdl, scratch,
                                                         profile_scratch, packed, meta, enter, exit_, *args)))
        if exit_ is not None:
            exit_(meta)


# Triton's device-side TMA element types (CompiledKernel.metadata.tensordesc_meta) of the descriptors' dtypes
_TMA_ELEMENT = {"fp16": 6, "fp32": 7, "bf16": 10}


def _tensordesc_meta(signature: dict) -> list | None:
    """What Triton's sm_90 lowering records for each host descriptor parameter (it becomes a CUtensorMap)."""
    meta = []
    for ty in signature.values():
        if isinstance(ty, str) and ty.startswith("tensordesc"):
            dtype, block = ty[ty.index("<") + 1:ty.index("[")], ty[ty.index("[") + 1:ty.index("]")]
            meta.append({"swizzle": 3, "elem_size": {"fp32": 4}.get(dtype, 2), "elem_type": _TMA_ELEMENT[dtype],
                         "block_size": [int(b) for b in block.split(",")], "fp4_padded": False})
    return meta or None


class _Kernel:
    """A compiled variant (Triton's ``CompiledKernel``): ``run`` is its launcher object; ``src.signature`` and
    ``metadata.tensordesc_meta`` as Triton keeps them (the native replay reads them). A variant compiled while
    the launchers lend a descriptor workspace has in-kernel descriptors: 128 B of global scratch per program,
    which Triton's launcher asks the allocator for at every launch (a real launch fails without it)."""

    function, packed_metadata = 0, (4, 1, 1, 1, 0)

    def __init__(self, name: str, log: list | None, scratch: int, signature: dict):
        self.run = _Launcher(name, log, scratch)
        self.src = types.SimpleNamespace(signature=signature)
        self.metadata = types.SimpleNamespace(tensordesc_meta=_tensordesc_meta(signature))

    def launch_metadata(self, grid, stream, *args):
        return None


# lent: a descriptor workspace is lent now; replaying: a plan replays; c_launches (with a log): (name, every
# argument of the C launch) per launch
_workspace = {"lent": False, "replaying": False, "c_launches": []}
native_log: list = []  # stubbed(log, native=True): what the native replay handed each stood-in driver call


@contextlib.contextmanager
def _lend_workspace(device):
    """``_common.descriptor_workspace`` that also records, for the stand-in compiles, that it is lent."""
    outer = _workspace["lent"]
    _workspace["lent"] = True
    try:
        with _tune.descriptor_workspace(device):
            yield
    finally:
        _workspace["lent"] = outer


class _Driver:
    """Triton's GPU driver as it is over a CUDA build of torch (``GPUDriver``): the current device from
    ``torch.cuda.current_device``, the stream from torch's C ``_cuda_getCurrentRawStream``; here device 0, stream 0,
    an sm_90 target."""

    target = GPUTarget("cuda", 90, 32)

    def __init__(self):
        self.get_current_device = _current_device
        self.get_current_stream = int  # a C call as torch's is: int(0), the default stream of device 0

    def get_current_target(self):
        return self.target


def _fresh() -> None:
    _launch.clear()
    _workspace["c_launches"].clear()
    native_log.clear()
    for mod in (chunk, prep, state_pass, segments, recurrent):
        for obj in vars(mod).values():
            if isinstance(obj, JITFunction):
                obj.device_caches.clear()


@contextlib.contextmanager
def stubbed(log: list | None = None, verify: bool = True, setattr=None, native: bool = False):
    """Stub the launches (see the module doc) until the block exits, then restore everything.

    Args:
        log: receives ``("launch", kernel name, grid, args)`` and, for the stream steps of the pass
            beside w/u, ``("event", name)``; None records nothing (timing).
        verify: ``_launch.VERIFY``: each cached launch re-derives Triton's own variant key.
        setattr: a test's ``monkeypatch.setattr``: the patches go through it and it undoes them, in
            order with the test's own patches of the same attributes (restoring them here as well
            would hand a test's later undo the stub's value).
        native: plans replay, and launchers that keep a native program launch, through ``native_replay.c``
            (``_native.ENABLED``), its driver calls stood in for: with a log, each appends what it was handed to
            ``native_log`` (below), else nothing is kept. Off (the default), they call Triton's C launch, which
            ``log`` sees.

    Yields:
        ``fresh()``, which empties the JIT, launch and plan caches (also done on entry and exit).
    """

    def compile_stub(self, key, signature, device, constexprs, options, attrs, warmup):
        self.device_caches[device][0][key] = kernel = _Kernel(self.__name__, log, 128 if _workspace["lent"] else 0,
                                                              signature)
        return kernel

    def note(name):
        plan.note_event(name)
        if log is not None:
            log.append(("event", name))

    @contextlib.contextmanager
    def beside(device, first):  # state_pass._beside's steps, streams aside
        note("wait")
        first()
        note("enter")
        yield
        note("exit")

    def event(name, device, ctx, side):  # a plan's replayed stream step, streams aside
        if log is not None:
            log.append(("event", name))
        return None, ctx, side

    segment_plan = segments._segment_plan
    replay = plan._Plan._replay

    def replaying(self, *args):
        _workspace["replaying"] = True
        try:
            return replay(self, *args)
        finally:
            _workspace["replaying"] = False
    patches = [
        (JITFunction, "_do_compile", compile_stub),
        (_common, "interpreting", lambda: True),  # _tma_ready's alignment rules on CPU tensors
        (state_pass, "_hopper_pass_ready", lambda k, tma_ready, with_o: with_o and tma_ready),
        (_common, "sm_count", lambda device: SMS),
        (recurrent, "sm_count", lambda device: SMS),  # its V tile: the GPU's
        (segments, "_segment_plan", lambda device, *a: segment_plan(torch.device("cuda"), *a)),
        (_common, "descriptor_workspace", _lend_workspace),
        (state_pass, "_beside", beside),
        (plan._Plan, "_event", staticmethod(event)),
        (plan._Plan, "_replay", replaying),
        (_tune.Tuner, "__call__", lambda self, key, launch, device: launch(self.configs[0])),
        (_launch, "VERIFY", verify),
        (_launch, "ENABLED", True),  # whatever TORCH_AURA_FAST_LAUNCH says: the mechanism is what runs
        (_launch, "_RAW_DEVICE", {_current_device: _raw_current_device}),  # as torch's pair is on CUDA builds
        (_native, "ENABLED", native),
        (plan, "side_stream", lambda device: SIDE_STREAM),  # the native replay's; _event stands in for the other's
    ]
    saved = [] if setattr else [(obj, name, vars(obj)[name]) for obj, name, _ in patches]
    patch = setattr or builtins.setattr
    previous = driver._active
    driver.set_active(_Driver())
    for obj, name, value in patches:
        patch(obj, name, value)
    native_module = _native.module() if native else None
    if native_module is not None:
        native_module.record(native_log if log is not None else False)
    _fresh()
    try:
        yield _fresh
    finally:
        if native_module is not None:
            native_module.record(None)
        _fresh()
        for obj, name, value in saved:
            builtins.setattr(obj, name, value)
        driver._active = previous
