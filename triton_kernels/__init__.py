"""Triton kernels of torch_aura, installed as ``torch_aura.triton_kernels``.

Never importable as a top-level ``triton_kernels``: vLLM imports OpenAI's package of that name and
prefers any importable top-level ``triton_kernels`` over its vendored copy, so a top-level copy of
ours would shadow it. ``setup.py`` maps this folder to ``torch_aura.triton_kernels`` only, imports
inside are relative, and an import under the bare name (e.g. from the repo root) fails here, which
vLLM's trial import reads as "not available".

``register(lib)`` is called by ``torch_aura.backends.autoload`` when Triton is installed; it adds
the Python launchers of this package to the CUDA key of the ``aura`` library. It must not import
``triton``: launchers import it at their first call, so ``import torch_aura`` stays cheap.
"""

if __name__ == "triton_kernels":
    raise ImportError(
        "this folder is torch_aura's Triton sources and installs as torch_aura.triton_kernels; "
        "it is not OpenAI's triton_kernels package")

# op name -> "module:function" of its launcher (relative to this package)
LAUNCHERS: dict[str, str] = {
    **{op: f".gdn.chunk:{op}" for op in ("gdn_chunk", "gdn_chunk_cumsum", "gdn_kkt_solve",
                                           "gdn_recompute_w_u", "gdn_fwd_h", "gdn_fwd_o")},
    "gdn_recurrent": ".gdn.recurrent:gdn_recurrent",
    **{op: f".gdn.conv:{op}" for op in ("causal_conv1d", "causal_conv1d_update")},
}


def _lazy(module: str, fn: str):
    """A launcher that imports its module (and so ``triton``) at its first call, then calls the module's function
    with no frame of its own: its class's ``__call__`` becomes that function (host time per eager call)."""
    import importlib

    def first(self, *args, **kwargs):
        target = getattr(importlib.import_module(module, __name__), fn)
        type(self).__call__ = staticmethod(target)
        return target(*args, **kwargs)

    return type(fn, (), {"__call__": first, "__slots__": ()})()


def register(lib) -> None:
    """Register every launcher in ``LAUNCHERS`` for the CUDA dispatch key of ``lib``."""
    for op, target in LAUNCHERS.items():
        lib.impl(op, _lazy(*target.split(":")), "CUDA")
