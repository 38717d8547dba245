"""torch_aura/_env.py is the one table of environment variables: every library read goes through it,
the C++ reads name its rows, and the README's "Backends and switches" list equals its user and
developer rows."""

import os
import re
from pathlib import Path

import pytest

from torch_aura import _env

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\b(?:TORCH_AURA|AURA)_[A-Z0-9_]+\b")


def _readme_section() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Backends and switches", 1)[1]
    return section.split("**Out-of-range data.**", 1)[0]


def _library_files():
    for root in ("torch_aura", "triton_kernels"):
        yield from sorted((REPO / root).rglob("*.py"))
    yield REPO / "setup.py"


def test_readme_lists_exactly_the_documented_rows():
    listed = set(NAME.findall(_readme_section()))
    documented = {v.name for v in _env.VARIABLES.values() if v.readme}
    assert listed == documented, (f"in the README but not in _env.py: {sorted(listed - documented)}; "
                                  f"in _env.py but not in the README: {sorted(documented - listed)}")


def test_readme_choices_match_the_parsers():
    section = _readme_section()
    for var in _env.VARIABLES.values():
        choices = getattr(var.parse, "choices", None)
        if not var.readme or choices is None:
            continue
        m = re.search(rf"`{var.name}=([a-z0-9|]+)`", section)
        assert m, f"the README gives no {var.name}=a|b|... choices"
        assert set(m.group(1).split("|")) == set(choices), (var.name, m.group(1), choices)


def test_every_library_read_goes_through_the_table():
    offenders = []
    for path in _library_files():
        rel = path.relative_to(REPO).as_posix()
        if rel == "torch_aura/_env.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.environ|os\.getenv|getenv\(", line):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "read the environment through torch_aura._env:\n" + "\n".join(offenders)


def test_every_variable_named_in_library_code_is_a_row():
    # TORCH_AURA_* anywhere; AURA_* only as a string in Python (in C it is the macro prefix)
    unknown = set()
    for path in [*_library_files(), *sorted((REPO / "csrc").rglob("*"))]:
        if path.suffix not in (".py", ".h", ".cu", ".cuh", ".cpp", ".mm", ".metal"):
            continue
        text = path.read_text()
        names = set(re.findall(r"\bTORCH_AURA_[A-Z0-9_]+", text))
        # _limits.py's strings are C macro names, embed_metal.py's a raw-string delimiter of the header it writes
        if path.suffix == ".py" and path.name not in ("_limits.py", "embed_metal.py"):
            names |= set(re.findall(r"[\"']((?:TORCH_)?AURA_[A-Z0-9_]+)[\"']", text))
        unknown |= {f"{n} ({path.relative_to(REPO)})" for n in names if n not in _env.VARIABLES}
    assert not unknown, "environment variables missing from torch_aura/_env.py:\n" + "\n".join(sorted(unknown))


def test_cpp_reads_match_the_table():
    found = {}
    for path in sorted((REPO / "csrc").rglob("*.c*")):
        text = path.read_text()
        for name in re.findall(r'getenv\("(\w+)"\)', text):
            found[name] = None
        for name, body in re.findall(r'env_choice\("(\w+)",\s*\{([^}]*)\}', text):
            found[name] = tuple(re.findall(r'"(\w+)"', body))
    assert found, "no std::getenv / env_choice in csrc: update this test"
    for name, choices in found.items():
        assert name in _env.VARIABLES, f"{name} is read by csrc but missing from torch_aura/_env.py"
        if choices is not None:
            assert getattr(_env.VARIABLES[name].parse, "choices", None) == choices, name
            assert _env.VARIABLES[name].default == choices[0], f"{name}: C++ defaults to its first choice"


@pytest.mark.parametrize("text,expected", [(None, False), ("", False), ("0", False), ("1", True), ("2", True),
                                           ("true", True), ("yes", True)])
def test_debug_has_one_meaning(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv("TORCH_AURA_DEBUG", raising=False)
    else:
        monkeypatch.setenv("TORCH_AURA_DEBUG", text)
    assert _env.get("TORCH_AURA_DEBUG") is expected
    assert _env.TORCH_AURA_DEBUG is expected


def test_bad_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", "fast")
    expected = "TORCH_AURA_DECODE_SCHEDULE='fast': expected one of auto, static, balanced, streamk, adaptive"
    with pytest.raises(ValueError, match=expected):
        _env.get("TORCH_AURA_DECODE_SCHEDULE")
    with pytest.raises(KeyError):
        _env.get("TORCH_AURA_NO_SUCH_VARIABLE")


def test_every_row_is_complete():
    for var in _env.VARIABLES.values():
        assert var.audience in (_env.USER, _env.DEVELOPER, _env.BUILD, _env.TESTS, _env.EXTERNAL), var.name
        assert var.meaning and "\n" not in var.meaning, var.name
        if var.default is not None and var.name != "TORCH_AURA_TUNE_CACHE":
            var.parse(var.default)  # the default parses


def test_raw_reads_what_the_environment_holds(monkeypatch):
    """_env.raw (the per-call cache keys' read, which bypasses os.environ.get) sees exactly what os.environ
    holds: unset is None, set and empty values as written, changes at once."""
    names = ("TORCH_AURA_GDN_OVERLAP", "TORCH_AURA_TUNE", "TORCH_AURA_DEBUG")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    assert _env.raw(names) == (None, None, None)
    monkeypatch.setenv("TORCH_AURA_GDN_OVERLAP", "0")
    monkeypatch.setenv("TORCH_AURA_DEBUG", "")
    assert _env.raw(names) == ("0", None, "")
    assert _env.raw(names) == tuple(os.environ.get(n) for n in names)
    monkeypatch.delenv("TORCH_AURA_GDN_OVERLAP")
    assert _env.raw(names)[0] is None


def test_unset_reads_what_the_environment_holds(monkeypatch):
    """_env.unset (a launcher's per-call debug switch, which bypasses os.environ.get) is ``os.environ.get(name) is
    None``: an empty value is set, and changes are seen at once."""
    monkeypatch.delenv("TORCH_AURA_DEBUG", raising=False)
    assert _env.unset("TORCH_AURA_DEBUG")
    for value in ("", "0", "1"):
        monkeypatch.setenv("TORCH_AURA_DEBUG", value)
        assert not _env.unset("TORCH_AURA_DEBUG")
    monkeypatch.delenv("TORCH_AURA_DEBUG")
    assert _env.unset("TORCH_AURA_DEBUG")
