"""The body every public wrapper shares: check, then call the op."""

from __future__ import annotations

import torch

from .._checks.common import remembered

# check -> its remembered form: a model calls each op with one metadata layer after layer, step after step
_remembered: dict = {}


def remembered_check(check):
    """``check``'s remembered form (``_checks.common.remembered``), one per check for the process."""
    run = _remembered.get(check)
    if run is None:
        run = _remembered[check] = remembered(check)
    return run


def checked_call(check, op, *args):
    """Run ``check(*args)`` and return ``op(*args)``.

    Eager calls check here so bad input raises before dispatch on every device, by name; metadata that
    passed once is not checked again (``remembered``: the checks read metadata only, and a failure is never
    remembered). Compiled, the op's fake runs the same check at trace time, so it is skipped (no Python
    check in the graph).
    """
    if not torch.compiler.is_compiling():
        remembered_check(check)(*args)
    return op(*args)
