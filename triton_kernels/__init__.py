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

# op name -> "module:function" of its launcher; filled as kernels land (GDN: issue 3).
LAUNCHERS: dict[str, str] = {}


def register(lib) -> None:
    """Register every launcher in ``LAUNCHERS`` for the CUDA dispatch key of ``lib``."""
    import importlib

    for op, target in LAUNCHERS.items():
        module, fn = target.split(":")
        lib.impl(op, getattr(importlib.import_module(module, __name__), fn), "CUDA")
