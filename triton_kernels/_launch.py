"""Cached kernel launches: ``launch(kernel, grid, key, *args, **kwargs)`` runs ``kernel[grid](*args, **kwargs)``.

Why: Triton's ``JITFunction.run`` re-derives a kernel's variant on every call (each argument through its
binder, the cache key, the global-value check, the launch metadata) before the driver's launcher runs;
for our 20-60-argument kernels that is most of an eager GDN call's host time. Here the first launch of
a variant goes through Triton as usual and keeps what it returns (the ``CompiledKernel``); later calls
with the same key call its launcher directly: Triton 3.6's C ``launch`` itself where the variant takes no
scratch (:func:`direct_launch`), else the launcher object.

The key is the caller's promise: together with the constexpr kwargs and launch options (added here) it
must fix every fact Triton specialises on, i.e. each tensor argument's dtype and 16-byte alignment and
each specialised int's ``== 1`` / ``% 16`` (lengths are ``do_not_specialize``: ``_jit.LENGTH_ARGS``).
:func:`tensor_key` gives those facts of a tensor the caller did not allocate; buffers a launcher
allocates itself are aligned and take their dtype from the inputs. ``VERIFY`` (tests) re-derives
Triton's own variant key on every cached launch and raises where the cached one differs.

On by default; ``TORCH_AURA_FAST_LAUNCH=0`` turns it off (``SWITCH``). Normal launches, always: under the
interpreter (kernels are not ``JITFunction``s there), with a launch hook installed (profilers read its
metadata), for a Triton version whose internals were not checked (``SUPPORTED``), and for stand-ins
that tests put in a kernel's place.
"""

from __future__ import annotations

import warnings

import torch
import triton
from triton.runtime.jit import JITFunction

from .. import _env
from . import _native

# Triton versions whose JITFunction.run / CompiledKernel.run this module was written against
SUPPORTED = ("3.6",)
SWITCH = _env.get("TORCH_AURA_FAST_LAUNCH")  # 0: every launch through Triton, for comparisons
try:
    from triton import knobs
    from triton.knobs import HookChain
    from triton.runtime.driver import driver

    ENABLED = SWITCH and ".".join(triton.__version__.split(".")[:2]) in SUPPORTED
except ImportError:  # another layout of Triton's internals: every launch goes through Triton
    ENABLED = False
VERIFY = False  # tests: check each cached launch against Triton's own variant key
_MAX_ENTRIES = 4096  # bounded: a key holding a view's length-dependent stride would otherwise grow

_cache: dict[tuple, tuple] = {}
_kernels: dict[int, JITFunction] = {}  # id -> kernel of the entries' keys: alive, so no other object takes the id
# gdn/plan.py: while set, ``recorder(kernel, grid, args, kwargs, entry)`` sees every launch after it ran
# (``entry``: the cache entry it ran or left, None where Triton launched it without one)
recorder = None
_on_clear: list = []  # callables run by clear(): what holds cache entries elsewhere (plans)
# a driver's current-device function -> the C function it ends in: torch.cuda.current_device runs a lazy-init
# check in Python first, which torch._C._cuda_getDevice makes in C (launch_stub adds its stand-ins)
_RAW_DEVICE = {torch.cuda.current_device: torch._C._cuda_getDevice} if hasattr(torch._C, "_cuda_getDevice") else {}


def tensor_key(x) -> tuple | None:
    """What Triton specialises on for a caller's tensor and its strides, lengths aside: dtype, 16-byte
    alignment, and each stride's class (``== 1``, ``% 16``, 64-bit), not its value, which may hold a length."""
    if x is None or not ENABLED:  # off: launch() ignores keys, so build none on the hot path
        return None
    return (x.dtype, not x.data_ptr() & 15, *[-1 if s == 1 else (not s & 15) + 2 * (s > 0x7FFFFFFF) for s in x.stride()])


def hooks_idle() -> bool:
    """No launch hook to call (a hook's caller reads Triton's launch metadata): each is None, or an empty chain
    (Triton 3.6 installs empty ``HookChain``s)."""
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return ((enter is None or type(enter) is HookChain and not enter.calls)
            and (exit_ is None or type(exit_) is HookChain and not exit_.calls))


def current() -> tuple:
    """``(driver, current device, its current stream)`` as Triton's launches read them from the active driver,
    the device through ``_RAW_DEVICE``."""
    drv = driver._active or driver.active  # the property costs a frame; its value once set
    get = drv.get_current_device
    device = _RAW_DEVICE.get(get, get)()
    return drv, device, drv.get_current_stream(device)


def _variant_key(kernel: JITFunction, args, kwargs) -> tuple:
    """Triton's own cache key of this launch (as ``JITFunction.run`` derives it)."""
    from triton.runtime.jit import compute_cache_key

    kw = dict(kwargs)
    kw["debug"] = kw.get("debug", kernel.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    _, _, _, _, binder = kernel.device_caches[driver.active.get_current_device()]
    _, specialization, options = binder(*args, **kw)
    return compute_cache_key(kernel.device_caches[driver.active.get_current_device()][1], specialization, options)


# set by _tune.Tuner around a launch: option sets (num_warps, num_stages, constexprs) of the same kernel whose
# variants each new variant's first launch compiles too, launching none (siblings())
_siblings: tuple = ()


def siblings(options: tuple) -> tuple:
    """Make ``options`` (a tuple of launch-option dicts) the siblings of the launches that follow; returns the
    previous ones, to be set back. The first launch of each new variant (a new cache entry: new dtypes,
    alignments or options) then also compiles, without launching, the variant each option set gives the
    same arguments: ``_tune.Tuner``'s other bucket side, so the first prompt past the bucket's edge finds its
    variant compiled whatever the arguments were (a tuner key holds neither dtypes nor alignments)."""
    global _siblings
    before, _siblings = _siblings, options
    return before


def _compile_siblings(kernel: JITFunction, grid, args, kwargs) -> None:
    for options in _siblings:
        try:
            kernel.warmup(*args, grid=grid, **{**kwargs, **options})  # compiled or loaded from disk, not launched
        except Exception as e:  # noqa: BLE001 - only an early compile: the call that needs it compiles it then
            warnings.warn(f"torch_aura: {kernel.__name__} could not ready its variant for {options} ahead of use: "
                          f"{e}", stacklevel=3)


def launch(kernel, grid: tuple, key: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; ``key`` as the module docstring says. Constexprs and options are
    passed by keyword, after every positional argument."""
    if not (ENABLED and isinstance(kernel, JITFunction) and hooks_idle()):
        kernel[grid](*args, **kwargs)
        if recorder is not None:
            recorder(kernel, grid, args, kwargs, None)
        return
    _, device, stream = current()
    full = (id(kernel), device, key, *kwargs.items())  # a JITFunction's hash takes a lock and a property: ~0.6 us
    entry = _cache.get(full)
    if entry is None:
        _first_launch(kernel, grid, full, args, kwargs)
        if recorder is not None:
            recorder(kernel, grid, args, kwargs, _cache.get(full))
        if _siblings:
            _compile_siblings(kernel, grid, args, kwargs)
        return
    call, prefix, tail, variant, _, _, _ = entry
    if VERIFY:
        got = _variant_key(kernel, args, kwargs)
        if got != variant:
            raise AssertionError(f"{kernel.__name__}: cached launch key {key} ran variant {variant}, Triton "
                                 f"derives {got}")
    n = len(grid)
    call(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, *prefix, *args, *tail)
    if recorder is not None:
        recorder(kernel, grid, args, kwargs, entry)


def _first_launch(kernel: JITFunction, grid, full: tuple, args, kwargs) -> None:
    """Launch through Triton and keep the compiled variant, where its parts are where this module expects
    them (else nothing is kept: every call of this key then launches through Triton). An entry is ``(call,
    prefix, tail, variant key, run, function, packed metadata)``: ``call(gx, gy, gz, stream, *prefix, *args,
    *tail)`` launches it, ``tail`` the values of the parameters passed by keyword (the key fixes them)."""
    compiled = kernel[grid](*args, **kwargs)
    params = [p.name for p in kernel.params]
    names = params[len(args):]
    if not all(name in kwargs for name in names):
        return
    try:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return
    direct = direct_launch(run, function, packed)
    call, prefix = (run, (function, packed, None, None, None)) if direct is None else direct[:2]
    if len(_cache) >= _MAX_ENTRIES:
        _cache.clear()
        _kernels.clear()
    _cache[full] = (call, prefix, tuple(kwargs[name] for name in names), _variant_key(kernel, args, kwargs), run,
                    function, packed)
    _kernels[full[0]] = kernel


# what calling Triton 3.6's C launch itself needs of its CudaLauncher (direct_launch)
LAUNCHER_FIELDS = ("launch", "num_ctas", "global_scratch_size", "global_scratch_align", "profile_scratch_size",
                   "launch_cooperative_grid", "launch_pdl")
SCRATCH = 3  # the global scratch's place in direct_launch's prefix


def launcher_of(run):
    """The launcher object behind a cache entry's ``run`` where it has ``LAUNCHER_FIELDS``, else None. In
    Triton 3.6 ``CompiledKernel.run`` is the ``CudaLauncher`` itself (its ``__call__`` asks the allocator for
    the scratch, then calls ``launch``); a stand-in's may be a bound method of it."""
    launcher = run if hasattr(run, "launch") else getattr(run, "__self__", None)
    return launcher if all(hasattr(launcher, f) for f in LAUNCHER_FIELDS) else None


def direct_launch(run, function, packed, scratch_align: int | None = None) -> tuple | None:
    """How to launch a compiled variant through Triton 3.6's C ``launch`` itself, without its launcher object's
    Python ``__call__`` (cached launches, and ``gdn/plan.py``'s replays): ``(launch, prefix, scratch)``, where
    ``launch(gx, gy, gz, stream, *prefix, *args)`` launches it without launch metadata or hooks, as ``__call__``
    would where the hooks are idle, and ``scratch`` is its global scratch in bytes per program (in-kernel
    descriptors), whose address a caller puts at ``prefix[SCRATCH]`` (None there). None where ``run`` is no
    such launcher, the variant profiles (its profile scratch is the allocator's), or it takes global scratch
    and ``scratch_align`` (the caller's, None: it has none) is below the variant's alignment."""
    launcher = launcher_of(run)
    if launcher is None or launcher.profile_scratch_size:
        return None
    scratch = launcher.num_ctas * launcher.global_scratch_size
    if scratch and (scratch_align is None or launcher.global_scratch_align > scratch_align):
        return None
    return launcher.launch, (function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None, packed,
                             None, None, None), scratch


def compiled_of(kernel: JITFunction, variant: tuple):
    """The ``CompiledKernel`` Triton keeps for ``variant`` on the current device (``JITFunction.run``'s cache), or
    None."""
    try:
        return kernel.device_caches[current()[1]][0].get(variant)
    except (AttributeError, KeyError, IndexError, TypeError):
        return None


def native_program(kernel, grid: tuple, key: tuple, args: tuple, kwargs: dict, n_addresses: int) -> tuple:
    """The launch ``launch(kernel, grid, key, *args, **kwargs)`` has made, as a one-launch ``_native.Program`` whose
    address table is ``args[:n_addresses]`` (tensors or None) in order, every other argument fixed: for a caller
    that keeps it per geometry and launches through :func:`run_native`, one C call with no argument parsing and no
    per-pointer driver check. Returns ``(program, None)``, ``(None, why)`` where the launch cannot be one, or
    ``(None, None)`` where it made no cache entry (a launch hook, say): ask again after a later launch."""
    if not (_native.ENABLED and ENABLED and isinstance(kernel, JITFunction)):
        return None, "native launches or cached launches are off"
    entry = _cache.get((id(kernel), current()[1], key, *kwargs.items()))
    if entry is None:
        return None, None
    _, _, tail, variant, run, function, packed = entry
    direct = direct_launch(run, function, packed)
    if direct is None or direct[2]:
        return None, "the variant profiles or takes global scratch"
    compiled = compiled_of(kernel, variant)
    module = _native.module()
    if compiled is None or module is None:
        return None, "native_replay.c did not build" if module is None else "no compiled variant"
    values = [_native.Pointer(i) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args[:n_addresses])]
    n = len(grid)
    try:
        spec = _native.launch_spec(compiled, function, packed, direct[1],
                                   (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1),
                                   [*values, *args[n_addresses:], *tail])
    except (ValueError, AttributeError) as e:
        return None, str(e)
    return module.Program((spec,), n_addresses), None


def run_native(program, addresses: tuple) -> bool:
    """Launch ``program`` (:func:`native_program`) with these device addresses on the current stream; False (nothing
    launched) where the launch must go through :func:`launch`: a launch hook, a plan recording, ``VERIFY``, native
    launches switched off (``_native.ENABLED``, read per call for comparisons)."""
    if VERIFY or recorder is not None or not _native.ENABLED or not hooks_idle():
        return False
    program.replay(addresses, current()[2], 0)
    return True


def clear() -> None:
    """Forget every cached variant (tests), and what holds their entries (``_on_clear``)."""
    _cache.clear()
    _kernels.clear()
    for forget in _on_clear:
        forget()
