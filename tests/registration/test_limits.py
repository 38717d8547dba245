"""torch_aura/_limits.py is the one table of instantiated head dims and bit widths: the generated
header is what it writes, the checks and references read it, C++ and the Metal plans write no list of
their own, and every list in the README and docs/ equals it."""

import re
from pathlib import Path

from torch_aura import _limits
from torch_aura._checks import aura as aura_checks, decode as decode_checks
from torch_aura.reference import decode as decode_reference

REPO = Path(__file__).resolve().parents[2]
DIMS = {tuple(_limits.DECODE_HEAD_DIMS), tuple(_limits.AURA_HEAD_DIMS)}


def test_generated_header_is_up_to_date():
    assert _limits.HEADER.read_text() == _limits.header_text(), \
        "csrc/generated/limits.h is stale: run python -m torch_aura._limits"


def test_python_reads_the_table():
    assert decode_checks.SUPPORTED_HEAD_DIMS is _limits.DECODE_HEAD_DIMS
    assert decode_reference.SUPPORTED_HEAD_DIMS is _limits.DECODE_HEAD_DIMS
    assert aura_checks.HEAD_DIMS is _limits.AURA_HEAD_DIMS
    assert aura_checks.BITS is _limits.AURA_BITS


def test_native_sources_write_no_list_of_their_own():
    # a literal list of the supported values (as a comparison chain, a brace list or a message)
    patterns = [re.compile(p) for p in (
        r"==\s*64\s*\|\|\s*\w+\s*==\s*(80|128)",
        r"\b(D|bits|b)\s*!=\s*(64|2)\s*&&",
        r"\{\s*64,\s*(80|128),",
        r"\{\s*2,\s*3,\s*4,\s*8\s*\}",
        r"\"[^\"]*64, (80|128), [^\"]*\"",
        r"\"[^\"]*2, 3, 4, 8[^\"]*\"",
        r"case 80:|case 192:",
    )]
    offenders = []
    roots = [REPO / "csrc" / "cuda", REPO / "csrc" / "mps" / "plan"]
    for path in sorted(p for root in roots for p in root.rglob("*") if p.suffix in (".cu", ".cuh", ".cpp", ".h")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if any(p.search(line.split("//")[0]) for p in patterns):  # comments may name a file
                offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "use csrc/generated/limits.h:\n" + "\n".join(offenders)


def _sets(text, pattern):
    return [tuple(int(v) for v in m.group(1).split(",")) for m in re.finditer(pattern, text)]


def test_docs_list_the_table():
    dims_in = r"(?:\bD`?|head dims?)\s*(?:in|∈)\s*\{([0-9, ]+)\}"
    bits_in = r"(?:bits?`?|vb)(?: each)?\s+in\s+\{([0-9, ]+)\}"
    found = 0
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        for dims in _sets(text, dims_in):
            found += 1
            assert dims in DIMS, f"{path.name}: head dims {dims} are neither decode's nor AURA's (_limits.py)"
        for bits in _sets(text, bits_in):
            found += 1
            assert bits == _limits.AURA_BITS, f"{path.name}: bit widths {bits}, the table says {_limits.AURA_BITS}"
        for row in re.findall(r"^\| head dims \|([^|]*)\|([^|]*)\|", text, flags=re.M):
            found += 1
            assert [tuple(int(v) for v in cell.split(",")) for cell in row] == \
                [_limits.DECODE_HEAD_DIMS, _limits.AURA_HEAD_DIMS], f"{path.name}: | head dims | {row}"
    assert found >= 6, "the lists this test reads moved: update its patterns"
