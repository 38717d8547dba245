"""Every causal-LM family transformers ships, built tiny (tests/_hf_zoo.py), one test each:
``enable()`` and ``AuraKVCache`` each serve it exactly or refuse it by name; and the README's model
table is what this walk finds (so it cannot rot). About 1-3 minutes on 2 cores: marked slow."""

import re
from pathlib import Path

import pytest
from _hf_zoo import families, render, walk

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"<!-- transformers-models:begin -->\n(.*?)\n<!-- transformers-models:end -->", re.S)

# Families whose outcome the issue named: a walk that lost them would otherwise pass silently.
EXPECTED = {
    "llama": ("served", "served"),
    "qwen3_next": ("served", "served"),
    "gemma3_text": ("served", "served"),
    "mistral": ("served", "served with max_cache_len <= window"),
    "mixtral": ("served", "served with max_cache_len <= window"),
    "phi3": ("served", "served with max_cache_len <= window"),
    "starcoder2": ("served", "served with max_cache_len <= window"),
    "gemma2": ("refused: soft-capping, no SDPA", "refused: soft-capping, no SDPA"),
    "deepseek_v3": ("refused: MLA", "refused: MLA"),
    "gpt_oss": ("refused: attention sinks, no SDPA", "refused: attention sinks, no SDPA"),
    "gpt_neox": ("served", "refused at the first step: cache.update without its kwargs"),
}


def _families() -> list[str]:
    try:
        return families()
    except ImportError:  # collected without transformers: the hf_transformers fixture skips (or fails in CI)
        return ["transformers-missing"]


@pytest.fixture(scope="module")
def walked(hf_transformers) -> dict:
    """family -> Row, filled by the per-family tests and completed by the README test."""
    return {}


@pytest.mark.parametrize("family", _families())
def test_family_is_served_exactly_or_refused_by_name(walked, family):
    row = walked[family] = walk(family)
    assert not row.failures, f"{family}: " + "; ".join(row.failures)
    if family in EXPECTED:
        assert (row.enable, row.cache) == EXPECTED[family]


def test_the_readme_table_is_what_the_walk_finds(walked):
    rows = [walked.get(family) or walk(family) for family in families()]
    found = BLOCK.search(README.read_text())
    assert found, "README.md lost its <!-- transformers-models:begin/end --> block"
    assert found.group(1) == render(rows), "README.md's model table is stale: run `python tests/_hf_zoo.py`"
