"""Backend loading, the reference-fallback policy and ``status()``.

``autoload(lib)`` runs once at ``import torch_aura``, after the ops, fakes and references are
registered, so the dispatch table is fixed before any graph is traced or captured and nothing is
``dlopen``ed mid-trace. It never raises: every failure is recorded as a reason that ``status()``
reports.

Environment:

* ``TORCH_AURA_BACKENDS=ref`` loads no kernel backend: the reference serves every device (a
  kill-switch). A comma list (``cuda,triton,mps``) loads only those; unset or ``all`` loads all.
* ``TORCH_AURA_STRICT`` (any value but ``0``) turns the silent (warn-once) fallback to the reference on a non-CPU
  device into a ``RuntimeError``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

import torch

from .. import _env
from .._schema import CUDA_PROVIDER, OPS
from ..cpu import FAST_PATHS as CPU_FAST_PATHS  # names only: torch_aura.cpu imports nothing at load

# Backend name -> why it is not serving (None once it loaded). Filled by autoload().
_REASONS: dict[str, str | None] = {
    "cpu": "not loaded yet",
    "cuda": "not loaded yet",
    "triton": "not loaded yet",
    "mps": "not loaded yet",
}
_FORCED_REF = False
_WARNED: set[tuple[str, str]] = set()

KNOWN_BACKENDS = ("cpu", "cuda", "triton", "mps")


def _requested_backends() -> tuple[set[str], str | None]:
    """Backends allowed by TORCH_AURA_BACKENDS and, if any were excluded, the reason to report."""
    names = _env.get("TORCH_AURA_BACKENDS")
    raw = ",".join(names)
    if names == ("all",):
        return set(KNOWN_BACKENDS), None
    if names == ("ref",):
        return set(), "disabled by TORCH_AURA_BACKENDS=ref"
    wanted = set(names)
    unknown = wanted - set(KNOWN_BACKENDS)
    if unknown:
        warnings.warn(f"TORCH_AURA_BACKENDS: ignoring unknown backend(s) {sorted(unknown)}; "
                      f"known: ref, all, {', '.join(KNOWN_BACKENDS)}", stacklevel=2)
    return wanted & set(KNOWN_BACKENDS), f"excluded by TORCH_AURA_BACKENDS={raw}"


def _load_cpu(lib) -> str | None:
    try:
        from .. import cpu

        return cpu.register(lib)
    except Exception as e:  # the reference still serves the CPU
        return f"cpu fast paths failed to register: {type(e).__name__}: {e}"


def _load_cuda_ext(lib) -> str | None:  # its register.cpp adds IMPLs to "aura" itself
    if torch.version.cuda is None:
        return "cuda extension not loaded: this torch build has no CUDA"
    if importlib.util.find_spec("torch_aura._C_cuda") is None:
        return ("cuda extension not built (torch_aura._C_cuda missing: build needs nvcc and a CUDA "
                "torch, or AURA_BUILD_CUDA=1)")
    try:
        importlib.import_module("torch_aura._C_cuda")
    except Exception as e:  # a broken build must not break `import torch_aura`
        return f"cuda extension failed to load: {type(e).__name__}: {e}"
    return None


def _load_triton(lib) -> str | None:
    if torch.version.cuda is None and torch.version.hip is None:
        return "triton kernels not loaded: this torch build has no GPU support"
    if importlib.util.find_spec("triton") is None:
        return "triton kernels not loaded: triton is not installed"
    try:
        # Registers launchers only; `triton` itself is imported at the first kernel call.
        from .. import triton_kernels

        triton_kernels.register(lib)
    except Exception as e:
        return f"triton kernels failed to register: {type(e).__name__}: {e}"
    return None


def torch_minor() -> str:
    """This torch's "major.minor" (what extensions outside the stable ABI are tied to)."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _load_mps_ext(lib) -> str | None:  # its register.mm adds IMPLs to "aura" itself
    if sys.platform != "darwin":
        return "mps extension not built: not macOS"
    if importlib.util.find_spec("torch_aura._C_mps") is None:
        return "mps extension not built (torch_aura._C_mps missing)"
    # _C_mps links ordinary ATen (the stable ABI has no MPS surface): loading it into another torch
    # minor version could crash, so the version setup.py recorded is checked before the import.
    try:
        from .. import _mps_build_info
    except ImportError:
        return "mps extension has no build record (torch_aura/_mps_build_info.py): rebuild it"
    if _mps_build_info.TORCH_MINOR != torch_minor():
        return (f"mps extension built for torch {_mps_build_info.TORCH_MINOR}, running {torch_minor()}: "
                "rebuild with pip install --no-build-isolation -e .")
    try:
        importlib.import_module("torch_aura._C_mps")
    except Exception as e:
        return f"mps extension failed to load: {type(e).__name__}: {e}"
    return None


_LOADERS = {"cpu": _load_cpu, "cuda": _load_cuda_ext, "triton": _load_triton, "mps": _load_mps_ext}


def autoload(lib: torch.library.Library) -> None:
    """Load every allowed backend once, its Python kernels into ``lib`` (the ``aura`` DEF library,
    handed over by ``import torch_aura``); record why the others are not serving."""
    global _FORCED_REF
    allowed, excluded_reason = _requested_backends()
    _FORCED_REF = not allowed
    for backend, loader in _LOADERS.items():
        _REASONS[backend] = loader(lib) if backend in allowed else excluded_reason


def _dispatch_key(device_type: str) -> str:
    return {"cuda": "CUDA", "mps": "MPS", "cpu": "CPU"}[device_type]


def has_kernel(op: str, device_type: str) -> bool:
    """True when a backend kernel (not the reference) is registered for ``op`` on that device."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"aura::{op}", _dispatch_key(device_type))


def provider(op: str, device_type: str) -> str:
    """The backend expected to serve ``op`` on ``device_type`` ("cuda", "triton" or "mps")."""
    return CUDA_PROVIDER[OPS[op].family] if device_type == "cuda" else device_type


def why_reference(op: str, device_type: str) -> str:
    """Why the reference (and not a kernel) serves ``op`` on ``device_type``."""
    if device_type == "cpu":
        reason = _REASONS.get("cpu")
        fast = op in CPU_FAST_PATHS
        return reason if fast and reason else "no CPU fast path for this op: the reference serves it"
    backend = provider(op, device_type)
    reason = _REASONS.get(backend)
    if reason:
        return reason
    return f"{backend} backend loaded but has no kernel for {op} yet"


def status() -> dict[str, dict[str, str]]:
    """Which backend serves each (op, device) and, where the reference does, why (on the CPU,
    "kernel (cpu)" is a fast path of torch_aura.cpu; the other CPU ops run the reference).

    Returns:
        ``{op: {"cpu": ..., "cuda": ..., "mps": ...}}``, e.g.
        ``{"flash_decode": {"cpu": "kernel (cpu)", "cuda": "kernel (cuda)",
        "mps": "reference (mps extension not built: not macOS)"}}``.

    Example:
        >>> import torch_aura
        >>> torch_aura.backends.status()["gdn_recurrent"]["cpu"]
        'reference'
    """
    table = {}
    for op in OPS:
        if has_kernel(op, "cpu"):
            row = {"cpu": "kernel (cpu)"}
        else:  # the reason only where a fast path exists but is not serving
            row = {"cpu": f"reference ({why_reference(op, 'cpu')})" if op in CPU_FAST_PATHS else "reference"}
        for dev in ("cuda", "mps"):
            if has_kernel(op, dev):
                label = provider(op, dev)
                row[dev] = "kernel (mps, emulator-verified)" if dev == "mps" else f"kernel ({label})"
            else:
                row[dev] = f"reference ({why_reference(op, dev)})"
        table[op] = row
    return table


def format_status() -> str:
    """``status()`` as an aligned text table (what ``python -m torch_aura`` prints)."""
    rows = status()
    width = max(map(len, rows))
    cpu_w = max(len(row["cpu"]) for row in rows.values())
    lines = [f"{'op':<{width}}  {'cpu':<{cpu_w}}  cuda / mps"]
    for op, row in rows.items():
        lines.append(f"{op:<{width}}  {row['cpu']:<{cpu_w}}  cuda: {row['cuda']}")
        lines.append(f"{'':<{width}}  {'':<{cpu_w}}  mps:  {row['mps']}")
    return "\n".join(lines)


def note_reference_fallback(op: str, device: torch.device) -> None:
    """Called by the reference when it serves a non-CPU device: warn once, or raise if strict."""
    if _FORCED_REF:
        return  # asked for explicitly: nothing to warn about
    reason = why_reference(op, device.type)
    if _env.get("TORCH_AURA_STRICT"):
        raise RuntimeError(f"aura::{op} on {device.type}: no kernel ({reason}); "
                           "TORCH_AURA_STRICT=1 forbids the fallback to the reference")
    key = (op, device.type)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"aura::{op} on {device.type} runs the pure-PyTorch reference ({reason}); "
                      "set TORCH_AURA_STRICT=1 to make this an error", stacklevel=3)
