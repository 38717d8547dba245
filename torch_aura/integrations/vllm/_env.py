"""The plugin's environment variables, resolved in one place (vLLM's ``vllm/envs.py`` is the model).

:data:`VARIABLES` names each variable with its default and meaning; :func:`settings` reads them all
and returns a frozen :class:`Settings`; the backend and the platform hooks take that resolved value,
never a raw string. vLLM's workers inherit the environment of the process that starts vLLM, so
every vLLM process resolves the same settings. Does not import vLLM.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from ..._checks.aura import BITS

KV_CACHE_ENV = "TORCH_AURA_VLLM_KV_CACHE"
VERIFY_ENV = "TORCH_AURA_VLLM_VERIFY"

# name -> (default, meaning): the table the docs and the "set without CUSTOM" warning read.
VARIABLES = {
    KV_CACHE_ENV: ("dense", "the KV cache format of --attention-backend CUSTOM: 'dense' (the model dtype) "
                            "or an AURA scheme 'aura{kb}v{vb}' / 'aura{b}' (e.g. 'aura4v2', 'aura8')"),
    VERIFY_ENV: ("0", "'1': each AURA decode step also runs dense attention over the dequantized pages "
                      "and records the largest difference in STATS (debugging; slow)"),
}


@dataclass(frozen=True)
class Settings:
    """The resolved variables."""

    kv_cache: str  # "dense" or the canonical AURA scheme name, e.g. "aura4v2"
    scheme: tuple[int, int] | None  # (key_bits, value_bits); None for dense
    verify: bool
    set_in_env: tuple[str, ...]  # the variables present in the environment, for the warning

    @property
    def is_aura(self) -> bool:
        return self.scheme is not None


def settings() -> Settings:
    """The variables of the current environment, resolved (cached per distinct raw values).

    Raises:
        ValueError: a variable holds a value outside its supported set; the message names the
            variable, the value, what is supported and how to proceed.
    """
    return _resolve(tuple(os.environ.get(name) for name in VARIABLES))


@functools.lru_cache(maxsize=16)
def _resolve(raw: tuple[str | None, ...]) -> Settings:
    kv_raw, verify_raw = raw
    value = (kv_raw if kv_raw is not None else VARIABLES[KV_CACHE_ENV][0]).strip().lower()
    if value in ("", "dense", "auto"):
        kv_cache, scheme = "dense", None
    else:
        from ...aura_cache import parse_scheme

        try:
            scheme = parse_scheme(value)
        except ValueError as e:
            raise ValueError(f"{KV_CACHE_ENV}={kv_raw!r} is not a KV cache format: expected 'dense' or an AURA "
                             f"scheme 'aura{{kb}}v{{vb}}' / 'aura{{b}}' with bits in {list(BITS)}, e.g. "
                             f"'aura4v2' or 'aura8'; unset it for the dense cache") from e
        kv_cache = f"aura{scheme[0]}" if scheme[0] == scheme[1] else f"aura{scheme[0]}v{scheme[1]}"
    verify = (verify_raw or "0").strip()
    if verify not in ("0", "1", ""):
        raise ValueError(f"{VERIFY_ENV}={verify_raw!r}: expected '1' (verify every AURA decode step) or '0' "
                         "(off, the default); unset it to turn it off")
    return Settings(kv_cache, scheme, verify == "1",
                    tuple(name for name, r in zip(VARIABLES, raw) if r is not None))
