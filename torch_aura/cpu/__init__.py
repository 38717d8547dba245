"""CPU fast paths: faster than torch_aura.reference, verified against it.

``register(lib)`` (from ``torch_aura.backends.autoload``, backend name ``cpu``) adds them to the CPU
dispatch key of the ``aura`` library, each behind the same checks as the reference
(``_checks.checked``). The reference stays the ``CompositeExplicitAutograd`` kernel: the
oracle the tests compare against, and what every other op on the CPU runs.
``TORCH_AURA_BACKENDS=ref`` (or a list without ``cpu``) leaves the CPU on the reference.

* ``aura``: encode, cache write, rotation, pass 1, pass 2 and the whole decode in C++
  (``torch_aura._C_cpu``, built where the install found a C++ compiler; ``csrc/cpu/aura.cpp``).
* ``gdn``: ``gdn_chunk`` in pure PyTorch, chunk-parallel matmuls with one state step per chunk.
* ``decode``: ``flash_decode`` / ``flash_decode_out`` in C++ (``csrc/cpu/decode.cpp``, the same pass 1
  and merge as AURA's: ``pass1.h``); without the build, ATen's fused CPU attention.
"""

from __future__ import annotations

import importlib

# op -> module of this package with a function of the same name and the reference's signature.
FAST_PATHS: dict[str, str] = {
    **{op: ".aura" for op in ("aura_encode", "aura_write_cache", "hadamard_rotate", "aura_flash_p1",
                              "aura_flash_p2", "aura_decode")},
    "gdn_chunk": ".gdn",
    **{op: ".decode" for op in ("flash_decode", "flash_decode_out")},
}
NEEDS_NATIVE = {".aura"}


def register(lib) -> str | None:
    """Register every fast path whose code is available; return why any were left out (or None)."""
    from .._checks import checked
    from . import native

    for op, module in FAST_PATHS.items():
        if module in NEEDS_NATIVE and native.LIB is None:
            continue
        fn = getattr(importlib.import_module(module, __name__), op)
        lib.impl(op, checked(op, fn, label="cpu"), "CPU")
    return None if native.LIB is not None else f"{native.REASON}: AURA ops on the CPU run the reference"
