"""Every causal-LM family transformers ships, built tiny (tests/_hf_zoo.py): ``enable()`` and
``AuraKVCache`` each serve it exactly or refuse it by name, and the README's model table is what
this walk finds (so it cannot rot). About 2-3 minutes on 2 cores: marked slow."""

import re
from pathlib import Path

import pytest
from _hf_zoo import families, render, walk

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"<!-- transformers-models:begin -->\n(.*?)\n<!-- transformers-models:end -->", re.S)


@pytest.fixture(scope="module")
def rows(hf_transformers):
    return [walk(family) for family in families()]


# families whose outcome the issue named: a walk that lost them would pass silently otherwise
EXPECTED = {
    "llama": ("served", "served"),
    "qwen3_next": ("served", "served"),
    "gemma3_text": ("served", "served"),
    "mistral": ("served", "served with max_cache_len <= window"),
    "mixtral": ("served", "served with max_cache_len <= window"),
    "gemma2": ("refused: soft-capping, no SDPA", "refused: soft-capping"),
    "deepseek_v3": ("refused: MLA", "refused: MLA"),
    "gpt_oss": ("refused: attention sinks, no SDPA", 'refused at the first step: the model is not on "aura"'),
}


def test_every_family_is_served_exactly_or_refused_by_name(rows):
    failed = {row.family: row.failures for row in rows if row.failures}
    assert not failed, "\n".join(f"{family}: {'; '.join(why)}" for family, why in failed.items())
    assert {row.family: (row.enable, row.cache) for row in rows if row.family in EXPECTED} == EXPECTED


def test_the_readme_table_is_what_the_walk_finds(rows):
    found = BLOCK.search(README.read_text())
    assert found, "README.md lost its <!-- transformers-models:begin/end --> block"
    assert found.group(1) == render(rows), "README.md's model table is stale: run `python tests/_hf_zoo.py`"
