"""Pure-PyTorch references: the oracle for every kernel and the fallback on every device.

One module per family (``decode``, ``aura``, ``gdn``); each defines a function per op, named like
the op and taking the op's schema arguments. The references mirror the kernels' structure (blocks,
partials, chunk stages, rounding points) so that a kernel can be diffed stage by stage, and they
call each other as plain functions, never through the dispatcher.
"""

from . import aura, decode, gdn  # noqa: F401

FAMILIES = {"decode": decode, "aura": aura, "gdn": gdn}
