"""The body every public wrapper shares: check, then call the op."""

from __future__ import annotations

import torch


def checked_call(check, op, *args):
    """Run ``check(*args)`` and return ``op(*args)``.

    Eager calls check here so bad input raises before dispatch on every device; compiled, the op's
    fake runs the same check at trace time, so it is skipped (no Python check in the graph).
    """
    if not torch.compiler.is_compiling():
        check(*args)
    return op(*args)
