"""Sample inputs per op and device, from one place (the pytorch/extension-cpp pattern).

Each family module defines ``SAMPLES: dict[op_name, Callable[[device], list[Sample]]]``; every op
of ``torch_aura._schema.OPS`` must have an entry (tests/registration checks it). Samples are small,
odd-sized and include non-contiguous views, so ``opcheck`` and the compile tests see the same
awkward inputs the kernels must handle. ``args`` are positional in schema order.
"""

from __future__ import annotations

from typing import NamedTuple


class Sample(NamedTuple):
    id: str  # readable pytest id, e.g. "B2-T37-Hq8-Hkv2-D64-fp32-paged"
    args: tuple
    kwargs: dict = {}


def all_samples() -> dict:
    from . import aura, decode, gdn

    return {**decode.SAMPLES, **aura.SAMPLES, **gdn.SAMPLES}
