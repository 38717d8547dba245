"""Every environment variable torch_aura reads, in one table (vLLM's ``vllm/envs.py`` is the model).

Each :class:`Var` gives the name, the default, the parser, who it is for and a one-line meaning.
Library code never reads ``os.environ`` itself: it calls :func:`get` (or reads ``_env.NAME``), so a
variable has one parser, one default and one meaning everywhere. The README's "Backends and
switches" list is tested against this table (``tests/registration/test_env.py``), and so is every
read in ``torch_aura/``, ``triton_kernels/``, ``setup.py`` and ``std::getenv`` in ``csrc/``.

Switches (:func:`flag`) have one meaning: unset or empty gives the default, ``0`` turns the switch
off, any other value turns it on.

Standard library only: ``setup.py`` loads this file by path before torch_aura is installed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

# who a variable is for
USER = "user"            # a supported setting, documented in the README
DEVELOPER = "developer"  # comparisons, debugging and tuning; documented, may change
BUILD = "build"          # read by setup.py at install
TESTS = "tests"          # read by the test suite and the benchmarks only
EXTERNAL = "external"    # another program's variable that torch_aura also reads


@dataclass(frozen=True)
class Var:
    name: str
    default: str | None  # the value an unset (or empty) variable stands for, as text
    parse: Callable[[str], Any]  # text -> value; raises ValueError naming the accepted values
    audience: str
    meaning: str  # one line
    read: str = "per call"  # when: "at import", "per call", "at install", or who reads it
    readme: bool = True  # listed in the README's "Backends and switches"


def flag(text: str) -> bool:
    """A switch: ``0`` is off, any other non-empty value is on (empty means unset)."""
    return text.strip() != "0"


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value
    parse.choices = choices  # type: ignore[attr-defined]
    return parse


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer in [{lo}, {hi}], got {text!r}") from None
        if not lo <= value <= hi:
            raise ValueError(f"expected an integer in [{lo}, {hi}], got {text!r}")
        return value
    return parse


def _text(text: str) -> str:
    return text.strip()


def _backends(text: str) -> tuple[str, ...]:
    """``all`` -> every backend, ``ref`` -> none, else the comma list as given (unknown names are
    reported by ``backends``, which knows the list)."""
    value = text.strip().lower()
    return ("all",) if value in ("", "all") else tuple(w.strip() for w in value.split(",") if w.strip())


def _tune_cache(text: str) -> str | None:
    """A folder, or None for "in this process only" (``0``, ``off``, ``none``, ``false``)."""
    return None if text.strip().lower() in ("0", "off", "none", "false") else text


def _triton_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "on")  # as Triton's own getBoolEnv reads it


def _percent(text: str) -> float:
    return float(text)


def _build_cuda(text: str) -> str:
    return _choice("0", "1")(text)


_VARS = [
    # ------------------------------------------------------------------ users
    Var("TORCH_AURA_BACKENDS", "all", _backends, USER,
        "which kernel backends load: all, ref (none: the reference serves every op, a kill-switch) or a "
        "comma list of cpu, cuda, triton, mps", read="at import"),
    Var("TORCH_AURA_STRICT", "0", flag, USER,
        "a fallback to the reference on a non-CPU device raises instead of warning once"),
    Var("TORCH_AURA_DEBUG", "0", flag, USER,
        "every public wrapper first runs the op's reference on CPU copies (data errors raise on every "
        "device) and the Triton pool launchers check their rows on the host; slow",
        read="at import (wrappers), per call (launcher checks)"),
    Var("TORCH_AURA_TUNE_CACHE", "~/.cache/torch_aura/tune", _tune_cache, USER,
        "where the Triton kernels' tuned launch configs persist; 0 keeps them in the process only"),
    Var("TORCH_AURA_SDPA_CUDNN", "auto", _choice("auto", "0", "1"), USER,
        "whether the transformers 'aura' attention's SDPA fallback (prefill, head dims flash_decode lacks) may "
        "use SDPA's cuDNN backend on CUDA, which builds a plan at every new sequence length: auto from 16k "
        "query tokens (where its faster kernel outweighs the plan), 0 never, 1 always",
        read="per call (once per compiled graph), by integrations/transformers/attention.py"),
    Var("TORCH_AURA_VLLM_KV_CACHE", "dense", _text, USER,
        "the vLLM plugin's KV cache format: dense or an AURA scheme aura{kb}v{vb}",
        read="per engine, by integrations/vllm/_env.py (which parses the scheme)"),
    Var("TORCH_AURA_VLLM_VERIFY", "0", _text, USER,
        "1: each AURA decode step of the vLLM plugin is also run densely and the difference recorded",
        read="per engine, by integrations/vllm/_env.py (which accepts 0 or 1)"),
    Var("TORCH_AURA_VLLM_GDN", "0", flag, USER,
        "1: vLLM's Qwen3-Next / Qwen3.5 GDN prefill, decode and causal conv run on torch_aura's GDN ops",
        read="per vLLM process, by integrations/vllm/gdn.py"),
    # ------------------------------------------------------------------ developers
    Var("TORCH_AURA_TUNE", "1", flag, DEVELOPER,
        "0 runs every Triton kernel's first config untuned (the GPU tests use it)"),
    Var("TORCH_AURA_FAST_LAUNCH", "1", flag, DEVELOPER,
        "0 launches the GDN and conv Triton kernels through Triton's own JIT path instead of the cached "
        "launchers (for comparisons)", read="at import"),
    Var("TORCH_AURA_GDN_PLAN", "1", flag, DEVELOPER,
        "0 runs every eager gdn_chunk through the launchers instead of replaying the launches kept per "
        "geometry (for comparisons)", read="at import"),
    Var("TORCH_AURA_FUSED_APPEND", "1", flag, DEVELOPER,
        "0: a plain AuraCache.append on CUDA takes the unfused path (slots, two aura_write_cache launches, "
        "the seq_lens advance) instead of one aura_append launch (for comparisons)",
        read="per AuraCache, by torch_aura/aura_cache.py", readme=False),
    Var("TORCH_AURA_GDN_OVERLAP", "1", flag, DEVELOPER,
        "0 keeps the serial order of the chunked GDN's w/u and state passes (no stream overlap)"),
    Var("TORCH_AURA_DECODE_SCHEDULE", "auto", _choice("auto", "static", "balanced", "streamk", "adaptive"), DEVELOPER,
        "the CUDA flash_decode work schedule (auto = static)", read="per call, by csrc/cuda/decode.cu"),
    Var("TORCH_AURA_DECODE_ITEMS_PER_SLOT", "4", _int_in(1, 64), DEVELOPER,
        "the balanced schedule's work items per CTA slot", read="per call, by csrc/cuda/decode.cu"),
    Var("TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM", "1", _choice("1", "2"), DEVELOPER,
        "the stream-K schedule's CTAs per SM", read="per call, by csrc/cuda/decode.cu"),
    Var("TORCH_AURA_DECODE_COPY", "auto", _choice("auto", "tiles", "rows"), DEVELOPER,
        "how the CUDA flash_decode moves K/V (auto = tiles where the layout allows)",
        read="per call, by csrc/cuda/decode.cu"),
    Var("TORCH_AURA_DECODE_D512", "auto", _choice("auto", "dims", "warp"), DEVELOPER,
        "the CUDA flash_decode kernel at head dim 512 (auto = dims where tile copies serve)",
        read="per call, by csrc/cuda/decode.cu"),
    Var("TORCH_AURA_CPU_SIMD", "1", flag, DEVELOPER,
        "0: the CPU dense decode runs the portable item where the AVX2 one could (for comparisons)",
        read="at import, by torch_aura/cpu/native.py"),
    # ------------------------------------------------------------------ install
    Var("AURA_BUILD_CUDA", None, _build_cuda, BUILD,
        "1 builds the CUDA extension, 0 skips it; unset: built where nvcc and a CUDA torch exist",
        read="at install"),
    Var("AURA_CUDA_ARCH", "90", _text, BUILD, "the CUDA extension's target architecture (sm_XX)",
        read="at install"),
    Var("AURA_BUILD_CPU", "1", flag, BUILD, "0 skips the C++ CPU kernels and the C++ autograd kernel",
        read="at install"),
    # ------------------------------------------------------------------ tests and benchmarks
    Var("AURA_CLANG", None, _text, TESTS, "the clang++ that builds the Metal emulator",
        read="tests/_metal.py", readme=False),
    Var("AURA_REQUIRE_CLANG", "0", flag, TESTS, "a missing clang fails the Metal tests instead of skipping",
        read="tests/_metal.py", readme=False),
    Var("AURA_EMU_CACHE", None, _text, TESTS, "where built Metal emulators are kept (default: the temp dir)",
        read="tests/_metal.py", readme=False),
    Var("AURA_REQUIRE_TRANSFORMERS", "0", flag, TESTS,
        "a missing transformers fails the integration tests instead of skipping",
        read="tests/integrations/conftest.py", readme=False),
    Var("AURA_CPU_SANITIZE_LIB", None, _text, TESTS, "the sanitizer build of csrc/cpu under test",
        read="tests/_cpu_sanitize.py", readme=False),
    Var("AURA_COMMIT", None, _text, TESTS, "the commit recorded in benchmark rows (default: git's)",
        read="benchmarks/_harness.py", readme=False),
    # ------------------------------------------------------------------ other programs' variables
    Var("TRITON_INTERPRET", "0", _triton_bool, EXTERNAL,
        "Triton's interpreter: our tuners keep one config, the cached launcher steps aside", readme=False),
    Var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100", _percent, EXTERNAL,
        "below 100 (an MPS client on part of the GPU) the GDN stream overlap is off", readme=False),
    Var("XDG_CACHE_HOME", None, _text, EXTERNAL, "the default TORCH_AURA_TUNE_CACHE lies under it",
        readme=False),
    Var("CUDA_HOME", None, _text, EXTERNAL, "setup.py looks for nvcc there when it is not on PATH",
        read="at install", readme=False),
]

VARIABLES: dict[str, Var] = {v.name: v for v in _VARS}


def get(name: str) -> Any:
    """The parsed value of variable ``name`` in the current environment (its default when unset or empty).

    Raises:
        KeyError: ``name`` is not in the table.
        ValueError: the value is not one the variable accepts; the message names the variable.
    """
    var = VARIABLES[name]
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        if var.default is None:
            return None
        text = var.default
    try:
        return var.parse(text)
    except ValueError as e:
        raise ValueError(f"{name}={text!r}: {e}") from None


def raw(names: tuple[str, ...]) -> tuple[str | None, ...]:
    """The variables' text as set (None where unset), unparsed: a cache key read on every call needs only
    to change when they do, where ``get``'s parse costs ~2 us a name."""
    env = os.environ
    data = getattr(env, "_data", None)  # CPython's os._Environ: the dict its get() reads
    if data is None:
        return tuple(map(env.get, names))
    # its get() of an unset name raises and catches a KeyError inside: ~1.5 us a name, 0.3 here
    encode, decode, texts = env.encodekey, env.decodevalue, []
    for name in names:
        text = data.get(encode(name))
        texts.append(None if text is None else decode(text))
    return tuple(texts)


_ENCODED: dict[str, object] = {}  # name -> its key in os.environ's dict (unset(): encoding it costs ~0.15 us)


def unset(name: str) -> bool:
    """``os.environ.get(name) is None`` at one dict lookup's cost (~0.1 us, ``raw``'s loop ~0.4): a switch read on
    every call of a launcher."""
    data = getattr(os.environ, "_data", None)  # CPython's os._Environ, as in raw()
    if data is None:
        return os.environ.get(name) is None
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.environ.encodekey(name)
    return key not in data


def is_set(name: str) -> bool:
    """Whether ``name`` is present and non-empty (for "set without effect" warnings)."""
    if name not in VARIABLES:
        raise KeyError(name)
    return bool((os.environ.get(name) or "").strip())


def __getattr__(name: str) -> Any:
    # _env.TORCH_AURA_STRICT reads the environment now, as vLLM's envs.X does
    if name in VARIABLES:
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *VARIABLES])
