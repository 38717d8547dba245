"""Every public docstring example runs (doctest) on CPU, where the reference serves it."""

import doctest

import pytest

import torch_aura
from torch_aura import backends, ops

MODULES = [ops.decode, ops.aura, ops.gdn, backends]
try:
    from torch_aura import aura_cache

    MODULES.append(aura_cache)
except ImportError:  # pragma: no cover - the cache module is part of the AURA family
    pass


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, globs={"torch_aura": torch_aura}) if t.examples]
    assert tests or module is backends, f"{module.__name__} has no docstring examples"
    for t in tests:
        runner.run(t)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} doctest examples failed in {module.__name__}"
