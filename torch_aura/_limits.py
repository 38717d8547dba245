"""The shapes the kernels are instantiated for, in one table.

The Python checks and the references import these tuples; the CUDA sources and the Metal launch plans
include ``csrc/generated/limits.h``, which this module writes (``python -m torch_aura._limits``) and
``tests/registration/test_limits.py`` keeps equal to the table, as it does the lists in the README
and ``docs/``. Changing a tuple means: regenerate the header, instantiate the kernels for the new
value (a C++ dispatch over a list of the wrong length fails to compile), update the docs.

Standard library only, like ``_env.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# flash_decode, flash_decode_out, merge_attn_states: one compile-time instantiation per dim (decode.md)
DECODE_HEAD_DIMS = (64, 80, 96, 128, 192, 256, 512)
# AURA's head dims: the fast Walsh-Hadamard rotation needs a power of two (aura-format.md §1)
AURA_HEAD_DIMS = (64, 128, 256, 512)
# AURA's key / value bit widths, the schemes aura{kb}v{vb}
AURA_BITS = (2, 3, 4, 8)

HEADER = Path(__file__).resolve().parents[1] / "csrc" / "generated" / "limits.h"

_LISTS = {
    "DECODE_HEAD_DIMS": (DECODE_HEAD_DIMS, "kDecodeHeadDims", "is_decode_head_dim"),
    "AURA_HEAD_DIMS": (AURA_HEAD_DIMS, "kAuraHeadDims", "is_aura_head_dim"),
    "AURA_BITS": (AURA_BITS, "kAuraBits", "is_aura_bits"),
}


def header_text() -> str:
    """The text of ``csrc/generated/limits.h``."""
    lines = [
        "// Generated from torch_aura/_limits.py by `python -m torch_aura._limits`: do not edit.",
        "// tests/registration/test_limits.py fails when this file and the table differ.",
        "#pragma once",
        "",
        "// AURA_LIMITS_<NAME>: the comma list (template arguments, initialisers);",
        "// AURA_LIMITS_<NAME>_TEXT: the same as a string, for error messages.",
    ]
    for name, (values, _, _) in _LISTS.items():
        listed = ", ".join(str(v) for v in values)
        lines += [f"#define AURA_LIMITS_{name} {listed}", f'#define AURA_LIMITS_{name}_TEXT "{listed}"']
    lines += ["", "namespace aura::limits {", ""]
    for name, (values, array, predicate) in _LISTS.items():
        test = " || ".join(f"v == {v}" for v in values)
        lines += [f"inline constexpr int {array}[] = {{AURA_LIMITS_{name}}};",
                  f"constexpr bool {predicate}(long long v) {{ return {test}; }}"]
    lines += ["", "}  // namespace aura::limits", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m torch_aura._limits`` writes the header; ``--check`` exits 1 if it is stale."""
    text = header_text()
    if "--check" in argv:
        stale = not HEADER.exists() or HEADER.read_text() != text
        print(f"{HEADER}: {'stale: run python -m torch_aura._limits' if stale else 'up to date'}")
        return int(stale)
    HEADER.parent.mkdir(parents=True, exist_ok=True)
    HEADER.write_text(text)
    print(f"wrote {HEADER}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
