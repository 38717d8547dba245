"""Import hygiene: `import torch_aura` is cheap and never touches Triton or CUDA; the
`triton_kernels` folder never imports as a top-level package (it would shadow OpenAI's)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import torch_aura

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def _py(code, cwd, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_import_does_not_import_triton_or_init_cuda():
    r = _py("import sys, torch, torch_aura; "
            "assert 'triton' not in sys.modules, 'triton imported'; "
            "assert not torch.cuda.is_initialized(), 'CUDA initialised'; print('ok')", cwd=TESTS)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_triton_kernels_is_not_a_top_level_package():
    r = _py("import importlib.util as u; print(u.find_spec('triton_kernels'))", cwd=TESTS)
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stdout + r.stderr


def test_triton_kernels_is_installed_under_torch_aura():
    import importlib.util

    spec = importlib.util.find_spec("torch_aura.triton_kernels")
    assert spec is not None and Path(spec.origin).resolve() == REPO / "triton_kernels" / "__init__.py"


def test_bare_import_from_repo_root_is_refused():
    # From the repo root the folder *is* on sys.path: the guard must turn the import into ImportError,
    # which is what vLLM's trial import treats as "not available".
    r = _py("import triton_kernels", cwd=REPO)
    assert r.returncode != 0 and "ImportError" in r.stderr and "torch_aura.triton_kernels" in r.stderr


def test_triton_kernels_uses_relative_imports_only():
    offenders = []
    for path in (REPO / "triton_kernels").rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*(from|import)\s+(triton_kernels|torch_aura\.triton_kernels)\b", line):
                offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "absolute imports of our own Triton package:\n" + "\n".join(offenders)


def test_public_api_is_exported():
    for name in ("backends", "aura_codebook", "aura_sign_mask", "AuraCache", "flash_decode", "gdn_chunk"):
        assert hasattr(torch_aura, name), name
