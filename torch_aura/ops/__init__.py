"""Public typed wrappers, one module per family.

Every wrapper takes exactly the arguments of its op's schema (same names, order and defaults;
``tests/registration`` checks it), runs the family's input check, so bad input raises the same
named error on every backend and at trace time, and calls ``torch.ops.aura.<op>``.
"""

from .aura import *  # noqa: F401,F403
from .aura import __all__ as _aura
from .decode import *  # noqa: F401,F403
from .decode import __all__ as _decode
from .gdn import *  # noqa: F401,F403
from .gdn import __all__ as _gdn

__all__ = [*_decode, *_aura, *_gdn]
