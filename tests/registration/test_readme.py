"""The README tells the truth: CI runs its test command, and its backend matrix lists every op."""

from pathlib import Path

from torch_aura._schema import OPS

REPO = Path(__file__).resolve().parents[2]


def _ci_test_command() -> str:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    marker = next(i for i, l in enumerate(lines) if "README test command" in l)
    return lines[marker + 1].strip()


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    cmd = _ci_test_command()
    assert cmd.endswith("bash tests/run.sh")
    assert cmd in readme


def test_readme_opens_with_the_two_commands():
    head = (REPO / "README.md").read_text().split("## ", 1)[0]
    assert "python -m torch_aura" in head
    assert _ci_test_command() in head


def test_backend_matrix_lists_every_op():
    readme = (REPO / "README.md").read_text()
    matrix = readme.split("| family | op |", 1)[1].split("\n\n", 1)[0]
    for name in OPS:
        assert f"`{name}`" in matrix, f"{name} missing from the README backend matrix"


def test_readme_python_examples_run():
    import re

    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "the README has no Python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_every_test_tree_is_collected():
    # pytest's default norecursedirs silently skips folders named "build"; make sure every tree
    # under tests/ that holds tests is part of the default run.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    collected = {line.split("/")[1] for line in r.stdout.splitlines() if line.startswith("tests/")}
    for tree in ("registration", "reference", "build", "cuda"):
        assert tree in collected, f"tests/{tree} is not collected by the default run"
