"""torch.library.opcheck, all four checks, for every op and every sample, on every device present.

This is what proves the fake, the schema's mutation annotations and the implementation agree:
test_schema, test_autograd_registration, test_faketensor, test_aot_dispatch_dynamic. On CPU the
reference is checked; on a GPU whatever serves the op there (a kernel, or the reference fallback).
"""

import pytest
import torch

import _samples

CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _device_available(device: str) -> bool:
    if device == "cuda":
        return torch.cuda.is_available()
    if device == "mps":
        return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    return True


def _cases():
    # ids come from the CPU samples; each test builds its sample on its own device lazily, so
    # collection never touches a device that is absent.
    for name, make in _samples.all_samples().items():
        for i, s in enumerate(make("cpu")):
            for device in ("cpu", "cuda", "mps"):
                yield pytest.param(name, i, device, id=f"{device}-{name}-{s.id}")


@pytest.mark.parametrize("name,index,device", list(_cases()))
def test_opcheck(name, index, device):
    if not _device_available(device):
        pytest.skip(f"no {device} device")
    sample = _samples.all_samples()[name](device)[index]
    op = getattr(torch.ops.aura, name).default
    torch.library.opcheck(op, sample.args, sample.kwargs, test_utils=CHECKS)
