"""tests/conftest.py's NaN poisoning of ``torch.empty`` leaves the rest of torch as it was."""

import torch


def test_device_context_still_places_tensors():
    # the patch is active in this process (its wrapper's module holds the real function) ...
    assert "_real_empty" in torch.empty.__globals__
    # ... and `with torch.device(...)` still reaches torch.empty and module constructors, as vLLM's model
    # loader relies on (before the fix: CPU tensors, and vLLM's engines failed on the H200)
    with torch.device("meta"):
        x = torch.empty(2, 3)
        layer = torch.nn.Linear(4, 4)
    assert x.device.type == "meta"
    assert layer.weight.device.type == "meta"
