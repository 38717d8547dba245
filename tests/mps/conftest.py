"""The Mac suite (docs/metal.md §8): runs only where an MPS device and the built Metal backend
exist; everywhere else every test here skips with the reason."""

import pytest
import torch

import torch_aura


def _why_not() -> str | None:
    if not torch.backends.mps.is_available():
        return "no MPS device"
    status = torch_aura.backends.status()["flash_decode"]["mps"]
    if not status.startswith("kernel"):
        return f"the Metal backend is not loaded: {status}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _why_not()
    if reason is None:
        return
    here = str(__file__).rsplit("/", 1)[0]
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=reason))
