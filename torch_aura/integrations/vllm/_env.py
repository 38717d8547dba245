"""The plugin's environment variables, resolved in one place (vLLM's ``vllm/envs.py`` is the model).

Their rows (default, meaning, who reads them) are torch_aura's one table, ``torch_aura/_env.py``, which
also reads them (:func:`torch_aura._env.get`); :func:`settings` turns the two values into a frozen
:class:`Settings` (the KV cache format parsed into its bit widths), and the backend and the platform
hooks take that resolved value, never a raw string. vLLM's workers inherit the environment of the
process that starts vLLM, so every vLLM process resolves the same settings. Does not import vLLM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from ... import _env as _table
from ..._checks.aura import BITS

KV_CACHE_ENV = "TORCH_AURA_VLLM_KV_CACHE"
VERIFY_ENV = "TORCH_AURA_VLLM_VERIFY"
VARIABLES = (KV_CACHE_ENV, VERIFY_ENV)  # the "set without CUSTOM" warning and the tests walk these
GDN_ENV = "TORCH_AURA_VLLM_GDN"  # 1: vLLM's GDN layers run on torch_aura's ops (gdn.py); needs no CUSTOM


class AuraBits(NamedTuple):
    """An AURA scheme's bit widths (``aura4v2``: key_bits 4, value_bits 2)."""

    key_bits: int
    value_bits: int


@dataclass(frozen=True)
class Settings:
    """The resolved variables."""

    kv_cache: str  # "dense" or the canonical AURA scheme name, e.g. "aura4v2"
    scheme: AuraBits | None  # None for dense
    verify: bool
    set_in_env: tuple[str, ...]  # the variables present in the environment, for the warning

    @property
    def is_aura(self) -> bool:
        return self.scheme is not None


def settings() -> Settings:
    """The variables of the current environment, resolved (cached per distinct values).

    Raises:
        ValueError: a variable holds a value outside its supported set; the message names the
            variable, the value, what is supported and how to proceed.
    """
    return _resolve(tuple(_table.get(name) for name in VARIABLES), tuple(filter(_table.is_set, VARIABLES)))


@functools.lru_cache(maxsize=16)
def _resolve(values: tuple[str, str], set_in_env: tuple[str, ...]) -> Settings:
    kv_text, verify = values  # the table's text (its default where unset or empty)
    value = kv_text.lower()
    if value in ("dense", "auto"):
        kv_cache, scheme = "dense", None
    else:
        from ...aura_cache import parse_scheme

        try:
            scheme = AuraBits(*parse_scheme(value))
        except ValueError as e:
            raise ValueError(f"{KV_CACHE_ENV}={kv_text!r} is not a KV cache format: expected 'dense' or an AURA "
                             f"scheme 'aura{{kb}}v{{vb}}' / 'aura{{b}}' with bits in {list(BITS)}, e.g. "
                             f"'aura4v2' or 'aura8'; unset it for the dense cache") from e
        kv_cache = f"aura{scheme.key_bits}" if scheme.key_bits == scheme.value_bits else \
            f"aura{scheme.key_bits}v{scheme.value_bits}"
    if verify not in ("0", "1"):
        raise ValueError(f"{VERIFY_ENV}={verify!r}: expected '1' (verify every AURA decode step) or '0' "
                         "(off, the default); unset it to turn it off")
    return Settings(kv_cache, scheme, verify == "1", set_in_env)
