"""The version gate every adapter applies to the framework it plugs into."""

from __future__ import annotations

import importlib


def major_minor(version: str) -> tuple[int, int]:
    """``"5.24.0"`` -> (5, 24); ``"0.32.0+cpu"`` -> (0, 32)."""
    parts = version.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def require(module: str, adapter: str, supported, tested, install: str):
    """Import ``module`` and check ``supported = ((low), (high))`` [low, high); returns the module.

    Raises:
        ImportError: not installed (the message says how to install it), or a version outside
            ``supported`` (the message names the installed, supported and tested versions).
    """
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{adapter} needs {module}: {install}") from e
    (lo_major, lo_minor), (hi_major, hi_minor) = supported
    if not supported[0] <= major_minor(mod.__version__) < supported[1]:
        raise ImportError(f"{adapter} supports {module} >= {lo_major}.{lo_minor}, < {hi_major}.{hi_minor} "
                          f"(tested: {', '.join(tested)}), found {mod.__version__}")
    return mod
