"""The body every public wrapper shares: check, then call the op."""

from __future__ import annotations

import torch

from .._checks.common import remembered_check


def checked_call(check, op, *args):
    """Run ``check(*args)`` and return ``op(*args)``.

    Eager calls check here so bad input raises before dispatch on every device, by name; metadata that
    passed once is not checked again (``remembered_check``: the checks read metadata only, and a failure is
    never remembered). Compiled, the op's fake runs the same check at trace time, so it is skipped (no Python
    check in the graph).
    """
    if not torch.compiler.is_compiling():
        remembered_check(check)(*args)
    return op(*args)
