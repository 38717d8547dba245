"""Every docstring example of the transformers integration runs (doctest), as the ops' do in
tests/registration/test_docstrings.py."""

import doctest
import importlib

import pytest

MODULES = ["", ".gdn", ".attention", ".cache"]


@pytest.mark.parametrize("suffix", MODULES, ids=lambda s: s.strip(".") or "package")
def test_docstring_examples_run(hf_transformers, suffix):
    module = importlib.import_module("torch_aura.integrations.transformers" + suffix)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    try:
        for t in tests:
            runner.run(t)
    finally:
        module_gdn = importlib.import_module("torch_aura.integrations.transformers.gdn")
        module_gdn.unpatch()  # an example's enable() must not leak into other tests
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} doctest examples failed in {module.__name__}"
    assert suffix == ".attention" or attempted, f"{module.__name__} has no docstring examples"
