"""Input checks and output specs, one module per family; see ``common.py`` for the rules.

Each family module defines, for every op of its family, a function with the op's name and the
op's schema arguments (same order, same defaults) that validates them and returns the list of
``TensorSpec`` the op returns (empty for ``-> ()`` ops).
"""

from . import aura, decode, gdn  # noqa: F401
from .common import TensorSpec  # noqa: F401

FAMILIES = {"decode": decode, "aura": aura, "gdn": gdn}


def for_op(name: str):
    """The check function of op ``name``."""
    from .._schema import OPS

    return getattr(FAMILIES[OPS[name].family], name)


def checked(name: str, fn, label: str):
    """``fn`` behind op ``name``'s check: how every Python kernel registers (the reference, the CPU
    fast paths), so each raises the same named errors as the fake and the public wrapper."""
    check = for_op(name)

    def impl(*args, **kwargs):
        check(*args, **kwargs)
        return fn(*args, **kwargs)

    impl.__name__ = f"{name}_{label}"
    return impl
