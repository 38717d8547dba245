"""Import hygiene: `import torch_aura` is cheap and never touches Triton or CUDA; the
`triton_kernels` folder never imports as a top-level package (it would shadow OpenAI's); the package's
imports point one way (LAYERS below, no cycles) and every module imports on its own."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# ----------------------------------------------------------------------------- layering
# The package's import graph, read from the sources (every import, module-level or inside a function):
# dependencies point one way, down this list. A module imports modules of its own layer or lower ones,
# and no import chain comes back to where it started. docs/architecture.md ("Import direction") has
# the picture; a new import that breaks either rule fails here with the chain it closes.
LAYERS = [
    # leaves: import nothing of the package (the generated and compiled modules count as leaves)
    ("_env", "_limits", "_schema", "_decode_plan", "_mps_build_info", "_C_cpu", "_C_cuda", "_C_mps"),
    ("_checks", "reference", "_debug", "testing"),  # checks, the pure-PyTorch references
    ("cpu", "triton_kernels"),  # kernel packages
    ("backends",),  # loads the kernel packages; the fallback policy
    ("_registry",),  # defines the ops, registers fakes and references, hands its library to backends
    ("ops",),  # the public wrappers
    ("aura_cache",),  # AuraCache, built on the wrappers
    ("integrations",),  # transformers and vLLM adapters
    ("__init__",),  # the package root: defines the ops, loads the backends, re-exports the wrappers
    ("__main__",),  # python -m torch_aura
]
# Imports of the package root (torch_aura/__init__.py, which imports everything) from below it, each
# at call time, after the package has loaded: (importer, name imported).
ROOT_READS = {("torch_aura.triton_kernels._tune", "__version__")}
GENERATED = {"torch_aura._mps_build_info", "torch_aura._C_cpu", "torch_aura._C_cuda", "torch_aura._C_mps"}


def _module_files() -> dict[str, Path]:
    files = {}
    for root, name in ((REPO / "torch_aura", "torch_aura"), (REPO / "triton_kernels", "torch_aura.triton_kernels")):
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if "__pycache__" in parts or path.name == "_mps_build_info.py":
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            files[".".join((name, *parts))] = path
    return files


def _import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported package module: line}, for every import of the package's own modules."""
    import ast

    files = _module_files()
    known = set(files) | GENERATED
    graph = {}
    for mod, path in files.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        edges = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
                if base == "torch_aura" and any(f"{base}.{a.name}" not in known for a in node.names) \
                        and all((mod, a.name) in ROOT_READS for a in node.names):
                    continue
            else:
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target.startswith("torch_aura") and target != mod:
                    edges.setdefault(target, node.lineno)
        graph[mod] = edges
    return graph


def _layer(mod: str) -> int:
    top = mod.split(".")[1] if "." in mod else "__init__"
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{mod}: not in any layer of tests/registration/test_imports.py LAYERS; add it "
                         "to the layer it belongs to (and docs/architecture.md's import direction)")


def test_imports_point_down_the_layers():
    graph, files = _import_graph(), _module_files()
    bad = []
    for mod, edges in graph.items():
        for target, line in edges.items():
            if _layer(target) > _layer(mod):
                bad.append(f"{files[mod].relative_to(REPO)}:{line}: {mod} (layer {_layer(mod)}) imports "
                           f"{target} (layer {_layer(target)})")
            elif target == mod.rpartition(".")[0] and files[mod].name not in ("__init__.py", "__main__.py"):
                bad.append(f"{files[mod].relative_to(REPO)}:{line}: {mod} imports its own package {target}, "
                           "whose __init__ imports its modules: move what it needs into a leaf module")
    assert not bad, "imports against the layer order (a lower layer must not import a higher one):\n" + "\n".join(bad)


def test_no_import_cycles():
    graph, files = _import_graph(), _module_files()
    state, stack, cycles = {}, [], []

    def visit(mod):
        state[mod] = "open"
        stack.append(mod)
        for target in graph.get(mod, {}):
            if state.get(target) == "open":
                cycle = stack[stack.index(target):] + [target]
                cycles.append(" -> ".join(f"{m} ({files[m].relative_to(REPO)}:{graph[m][n]})" if m in files else m
                                          for m, n in zip(cycle, cycle[1:])) + f" -> {target}")
            elif target not in state:
                visit(target)
        stack.pop()
        state[mod] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod)
    assert not cycles, "import cycles (dependencies must point one way):\n" + "\n".join(cycles)


def _optional_dependency_missing(stderr: str) -> bool:
    return bool(re.search(r"(No module named '(triton|transformers|vllm)|requires (transformers|vllm))", stderr))


def _import_alone(modules, loaded: set[str]) -> list[str]:
    """Import each of ``modules`` first in a fresh interpreter; add what each loaded to ``loaded``; return
    the failures (a missing optional dependency, Triton, transformers or vLLM, is not one)."""
    from concurrent.futures import ThreadPoolExecutor

    report = "import sys, {}; print(' '.join(m for m in sys.modules if m.startswith('torch_aura')))"
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda m: (m, _py(report.format(m), cwd=TESTS)), modules))
    failed = []
    for m, r in results:
        loaded.add(m)
        if r.returncode == 0:
            loaded.update(r.stdout.split())
        elif not _optional_dependency_missing(r.stderr):
            failed.append(f"{m}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return failed


def _outside_core() -> tuple[dict[str, Path], set[str]]:
    """(every module, the modules ``import torch_aura`` loads: those load in the one order it fixes)."""
    code = "import sys, torch_aura; print(' '.join(m for m in sys.modules if m.startswith('torch_aura')))"
    core = _py(code, cwd=TESTS)
    assert core.returncode == 0, core.stderr
    return _module_files(), set(core.stdout.split()) | {"torch_aura.__main__"}


def _packages_alone(files, loaded) -> list[str]:
    packages = sorted(m for m, path in files.items() if path.name == "__init__.py")
    failed = []
    for depth in sorted({m.count(".") for m in packages}):  # outer packages first: they load inner ones
        failed += _import_alone([m for m in packages if m.count(".") == depth and m not in loaded], loaded)
    return failed


def test_every_package_imports_alone():
    """Each package ``import torch_aura`` does not load (``triton_kernels``, the integrations), imported
    first in a fresh interpreter."""
    failed = _packages_alone(*_outside_core())
    assert not failed, "packages that fail to import on their own:\n" + "\n".join(failed)


@pytest.mark.slow
def test_every_module_imports_alone():
    """As above for every module its package does not load itself (one interpreter each: ~1 min)."""
    files, loaded = _outside_core()
    failed = _packages_alone(files, loaded)
    failed += _import_alone(sorted(set(files) - loaded), loaded)
    assert not failed, "modules that fail to import on their own:\n" + "\n".join(failed)
