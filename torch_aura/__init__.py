"""torch_aura: LLM inference kernels as first-class PyTorch ops (``torch.ops.aura.*``).

Import order matters and is cheap (no ``import triton``, no CUDA context, no Metal compile):
define every op from the schema table, register fakes and references, then load the kernel
backends that exist on this machine into the same library (``backends.autoload``).
"""

from . import _registry, backends

_registry.define_and_register()
backends.autoload(_registry.LIB)

from .aura_cache import AuraCache  # noqa: E402
from .ops import *  # noqa: E402,F401,F403
from .ops import __all__ as _ops_all  # noqa: E402

__version__ = "0.1.0"
__all__ = ["backends", "AuraCache", *_ops_all]
