"""The GDN launchers on a CPU with Triton's launches stubbed: developer tooling, not a backend.

Triton's runtime runs in full (binding, variant keys, the cached launchers of ``_launch``, the plans of
``plan``) against a stand-in driver modelled as an sm_90 device of 132 SMs; every compiled variant is a
stand-in whose launcher runs nothing and, given a log, records what it was handed. Used by the launch
tests (``tests/build/test_gdn_launch.py``, ``test_gdn_plan.py``) and by ``benchmarks/profile_gdn.py
--host-cpu`` (the launchers' host time without a GPU).

    with stubbed(log) as fresh:   # log: a list of ("launch", name, grid, args) and ("event", name)
        chunk.gdn_chunk(...)      # CPU tensors; nothing is computed
        fresh()                   # empty the JIT, launch and plan caches
"""

from __future__ import annotations

import builtins
import contextlib

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from .. import _launch, _tune
from . import _common, chunk, plan, prep, recurrent, segments, state_pass

SMS = 132  # an H100 SXM: the sequence-parallel plan depends on the SM count


class _Kernel:
    """A compiled variant whose launcher records its grid and arguments (when given a log). It is its own
    launcher object, with Triton 3.6's ``CudaLauncher`` fields: ``run`` (``__call__`` there) and the C
    ``launch`` that plans call directly (``plan.DIRECT_LAUNCH``), handed the scratch themselves."""

    function, packed_metadata = 0, (4, 1, 1, 1, 0)
    num_ctas, launch_cooperative_grid, launch_pdl = 1, False, False
    global_scratch_align, profile_scratch_size, profile_scratch_align = 128, 0, 1

    def __init__(self, name: str, log: list | None):
        self.name, self.log = name, log

    @property
    def global_scratch_size(self) -> int:
        """Bytes per program of in-kernel descriptors: a variant the launchers ran in a lent workspace has
        some (128, one descriptor), the rest none."""
        return 128 if self in _workspace["needed"] else 0

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, gx, gy, gz, stream, function, packed, meta, enter, exit_, *args):
        # a variant the launchers launch inside a lent descriptor workspace needs one at every launch (a
        # real launch fails without it); a replay may lend one to more
        if _workspace["lent"] and not _workspace["replaying"]:
            _workspace["needed"].add(self)
        elif not _workspace["lent"] and self in _workspace["needed"]:
            raise RuntimeError(f"{self.name}: launched without the descriptor workspace it needs")
        self._record(gx, gy, gz, args)

    def launch(self, gx, gy, gz, stream, function, cooperative, pdl, scratch, profile_scratch, packed, meta, enter,
               exit_, *args):
        # the C launch: a variant with in-kernel descriptors must be handed its scratch here
        if self.global_scratch_size and scratch is None:
            raise RuntimeError(f"{self.name}: launched directly without the scratch its descriptors need")
        _workspace["direct"].append((self.name, (gx, gy, gz), scratch))
        self._record(gx, gy, gz, args)

    def _record(self, gx, gy, gz, args):
        if self.log is not None:
            self.log.append(("launch", self.name, (gx, gy, gz), args))


_workspace = {"lent": False, "replaying": False, "needed": set(), "direct": []}


@contextlib.contextmanager
def _lend_workspace(device):
    """``_common.descriptor_workspace`` that also records, for the stand-in launches, that it is lent."""
    outer = _workspace["lent"]
    _workspace["lent"] = True
    try:
        with _tune.descriptor_workspace(device):
            yield
    finally:
        _workspace["lent"] = outer


class _Driver:
    target = GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def _fresh() -> None:
    _launch.clear()
    _workspace["needed"].clear()  # the stand-in variants below are dropped with the JIT caches
    _workspace["direct"].clear()
    for mod in (chunk, prep, state_pass, segments, recurrent):
        for obj in vars(mod).values():
            if isinstance(obj, JITFunction):
                obj.device_caches.clear()


@contextlib.contextmanager
def stubbed(log: list | None = None, verify: bool = True, setattr=None):
    """Stub the launches (see the module doc) until the block exits, then restore everything.

    Args:
        log: receives ``("launch", kernel name, grid, args)`` and, for the stream steps of the pass
            beside w/u, ``("event", name)``; None records nothing (timing).
        verify: ``_launch.VERIFY``: each cached launch re-derives Triton's own variant key.
        setattr: a test's ``monkeypatch.setattr``: the patches go through it and it undoes them, in
            order with the test's own patches of the same attributes (restoring them here as well
            would hand a test's later undo the stub's value).

    Yields:
        ``fresh()``, which empties the JIT, launch and plan caches (also done on entry and exit).
    """

    def compile_stub(self, key, signature, device, constexprs, options, attrs, warmup):
        self.device_caches[device][0][key] = kernel = _Kernel(self.__name__, log)
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
    ]
    saved = [] if setattr else [(obj, name, vars(obj)[name]) for obj, name, _ in patches]
    patch = setattr or builtins.setattr
    previous = driver._active
    driver.set_active(_Driver())
    for obj, name, value in patches:
        patch(obj, name, value)
    _fresh()
    try:
        yield _fresh
    finally:
        _fresh()
        for obj, name, value in saved:
            builtins.setattr(obj, name, value)
        driver._active = previous
