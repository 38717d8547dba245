"""The mix of ``gdn_chunk`` geometries the plan tests run (``tests/build/test_gdn_plan.py``,
``test_native_replay.py``): CPU tensors of each geometry's shapes, for launches stubbed on the CPU."""

from __future__ import annotations

import torch
from _gdn_check import empty_chunk_inputs

H, HV, K, V = 2, 4, 128, 128


def inputs(B, T, h=H, hv=HV, kd=K, vd=V, **kw):
    return empty_chunk_inputs(B, T, h, hv, kd, vd, **kw)


def varlen(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


# (B, T, kwargs of _inputs, l2norm, scale): odd and chunk-edge lengths, batches, varlen (with and without
# the chunk table), head splits and dims, strided views, both state layouts, the initial state on and off,
# the serial pass, the sequence-parallel one and the one beside w/u
GEOMETRIES = [
    (1, 1, {}, True, None),
    (1, 63, {"h0": False}, True, None),
    (1, 64, {"state_v_first": True}, False, 0.5),
    (1, 65, {}, True, None),
    (3, 127, {"strided": True}, True, None),
    (2, 300, {"state_v_first": True, "h0": False}, True, None),
    (1, 8192, {}, True, None),  # sequence-parallel at 2/4 heads
    (1, 4096, {"state_v_first": True}, True, None),
    (8, 300, {}, True, None),  # serial
    (1, 2000, {"state_v_first": True, "strided": True}, True, None),
    (1, 300, {"h": 1, "hv": 1, "kd": 100, "vd": 48}, True, None),
    (2, 200, {"h": 3, "hv": 6, "kd": 64, "vd": 80, "dtype": torch.float16}, False, None),
    (1, 4096, {"h": 16, "hv": 32}, True, None),
    (1, 200, {"dtype": torch.float32}, True, None),
]
VARLEN = [
    ([1, 64, 65, 300], {}),
    ([0, 17, 2000, 1], {"state_v_first": True, "with_ci": True}),
    ([8192], {"h0": False}),  # one packed sequence: sequence-parallel with the device-built segment table
    ([3000, 3000, 100], {"strided": True}),
    ([63, 5, 700], {"h": 16, "hv": 32, "with_ci": True}),
]


def calls():
    yield from GEOMETRIES
    for lengths, kw in VARLEN:
        cu = varlen(lengths)
        yield 1, cu[-1], {**kw, "cu": cu}, True, None
