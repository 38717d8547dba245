"""Triton interpreter tree: runs in its own pytest process (tests/run.sh).

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so it is set here, before
any test module imports a kernel module. The interpreter runs each program instance through
numpy on the CPU: it validates indexing, masking and numerics, not races or speed; bf16 is not
supported there (bf16 ``tl.dot`` multiplies raw bit patterns, triton issue #11584), so these
tests use fp32 and fp16 and the GPU tree covers bf16.
"""

import importlib.util
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"

collect_ignore_glob = [] if importlib.util.find_spec("triton") else ["test_*.py"]


def pytest_report_header(config):
    if not importlib.util.find_spec("triton"):
        return "tests/interp: triton is not installed, the Triton interpreter tests are skipped"


@pytest.fixture(scope="session")
def gdn_kernels():
    """The GDN launchers, called directly (op-level tracing does not run under the interpreter)."""
    from types import SimpleNamespace

    from torch_aura.triton_kernels.gdn import chunk, recurrent

    return SimpleNamespace(**{name: getattr(chunk, name) for name in (
        "gdn_chunk", "gdn_chunk_cumsum", "gdn_kkt_solve", "gdn_recompute_w_u", "gdn_fwd_h", "gdn_fwd_o")},
        gdn_recurrent=recurrent.gdn_recurrent)
