"""Cached kernel launches: ``launch(kernel, grid, key, *args, **kwargs)`` runs ``kernel[grid](*args, **kwargs)``.

Why: Triton's ``JITFunction.run`` re-derives a kernel's variant on every call (each argument through its
binder, the cache key, the global-value check, the launch metadata) before the driver's launcher runs;
for our 20-60-argument kernels that is most of an eager GDN call's host time. Here the first launch of
a variant goes through Triton as usual and keeps what it returns (the ``CompiledKernel``); later calls
with the same key call its launcher directly.

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

import triton
from triton.runtime.jit import JITFunction

from .. import _env

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


def tensor_key(x) -> tuple | None:
    """What Triton specialises on for a caller's tensor and its strides, lengths aside: dtype, 16-byte
    alignment, and each stride's class (``== 1``, ``% 16``, 64-bit), not its value, which may hold a length."""
    if x is None or not ENABLED:  # off: launch() ignores keys, so build none on the hot path
        return None
    return (x.dtype, not x.data_ptr() & 15, *[-1 if s == 1 else (not s & 15) + 2 * (s > 0x7FFFFFFF) for s in x.stride()])


def _idle(hook) -> bool:
    """No launch hook to call: None, or an empty chain (Triton 3.6 installs empty ``HookChain``s)."""
    return hook is None or (type(hook) is HookChain and not hook.calls)


def _variant_key(kernel: JITFunction, args, kwargs) -> tuple:
    """Triton's own cache key of this launch (as ``JITFunction.run`` derives it)."""
    from triton.runtime.jit import compute_cache_key

    kw = dict(kwargs)
    kw["debug"] = kw.get("debug", kernel.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    _, _, _, _, binder = kernel.device_caches[driver.active.get_current_device()]
    _, specialization, options = binder(*args, **kw)
    return compute_cache_key(kernel.device_caches[driver.active.get_current_device()][1], specialization, options)


def launch(kernel, grid: tuple, key: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; ``key`` as the module docstring says. Constexprs and options are
    passed by keyword, after every positional argument."""
    if not (ENABLED and isinstance(kernel, JITFunction) and _idle(knobs.runtime.launch_enter_hook)
            and _idle(knobs.runtime.launch_exit_hook)):
        kernel[grid](*args, **kwargs)
        if recorder is not None:
            recorder(kernel, grid, args, kwargs, None)
        return
    drv = driver.active
    device = drv.get_current_device()
    full = (id(kernel), device, key, *kwargs.items())  # a JITFunction's hash takes a lock and a property: ~0.6 us
    entry = _cache.get(full)
    if entry is None:
        _first_launch(kernel, grid, full, args, kwargs)
        if recorder is not None:
            recorder(kernel, grid, args, kwargs, _cache.get(full))
        return
    run, function, packed, tail, variant = entry
    if VERIFY:
        got = _variant_key(kernel, args, kwargs)
        if got != variant:
            raise AssertionError(f"{kernel.__name__}: cached launch key {key} ran variant {variant}, Triton "
                                 f"derives {got}")
    n = len(grid)
    run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, drv.get_current_stream(device), function, packed, None,
        None, None, *args, *[kwargs[name] for name in tail])
    if recorder is not None:
        recorder(kernel, grid, args, kwargs, entry)


def _first_launch(kernel: JITFunction, grid, full: tuple, args, kwargs) -> None:
    """Launch through Triton and keep the compiled variant, where its parts are where this module expects
    them (else nothing is kept: every call of this key then launches through Triton)."""
    compiled = kernel[grid](*args, **kwargs)
    params = [p.name for p in kernel.params]
    tail = params[len(args):]
    if not all(name in kwargs for name in tail):
        return
    try:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return
    if len(_cache) >= _MAX_ENTRIES:
        _cache.clear()
        _kernels.clear()
    _cache[full] = (run, function, packed, tail, _variant_key(kernel, args, kwargs))
    _kernels[full[0]] = kernel


# what a replay needs of Triton 3.6's CudaLauncher to call its C launch itself (gdn/plan.py, DIRECT_LAUNCH)
LAUNCHER_FIELDS = ("launch", "num_ctas", "global_scratch_size", "global_scratch_align", "profile_scratch_size",
                   "launch_cooperative_grid", "launch_pdl")


def launcher_of(run):
    """The launcher object behind a cache entry's ``run`` where it has ``LAUNCHER_FIELDS``, else None. In
    Triton 3.6 ``CompiledKernel.run`` is the ``CudaLauncher`` itself (its ``__call__`` asks the allocator for
    the scratch, then calls ``launch``); a stand-in's may be a bound method of it."""
    launcher = run if hasattr(run, "launch") else getattr(run, "__self__", None)
    return launcher if all(hasattr(launcher, f) for f in LAUNCHER_FIELDS) else None


def clear() -> None:
    """Forget every cached variant (tests), and what holds their entries (``_on_clear``)."""
    _cache.clear()
    _kernels.clear()
    for forget in _on_clear:
        forget()
