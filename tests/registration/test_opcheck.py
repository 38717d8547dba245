"""torch.library.opcheck, all four checks, for every op and every sample, on every device with a
backend here. This is what proves the fake, the schema's mutation annotations and the reference
agree: test_schema, test_autograd_registration, test_faketensor, test_aot_dispatch_dynamic."""

import pytest
import torch

import _samples

CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _cases(device):
    for name, make in _samples.all_samples().items():
        for s in make(device):
            yield pytest.param(name, s, id=f"{name}-{s.id}")


@pytest.mark.parametrize("name,sample", list(_cases("cpu")))
def test_opcheck_cpu(name, sample):
    op = getattr(torch.ops.aura, name).default
    torch.library.opcheck(op, sample.args, sample.kwargs, test_utils=CHECKS)
