"""Speculative decoding over the AURA cache in vLLM (issue 43, deliverable 4): with ngram drafts and
``TORCH_AURA_VLLM_KV_CACHE=aura8``, vLLM's verification rows (1 + k query tokens per request, each at
its causal length) run through the compressed-domain decode, and in verify mode every such batch
equals dense ``flash_decode`` over the dequantized pages. The greedy tokens are those of the same
cache without drafts: verifying a draft is the decode step it replaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _vllm_serve as s

pytestmark = pytest.mark.usefixtures("vllm")

_CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
import _vllm_serve as s
from pathlib import Path
from torch_aura.integrations.vllm import STATS
spec = {spec}
tokens, _ = s.generate(Path({model!r}), "CUSTOM", s.prompts(s.PROMPT_LENGTHS), s.NEW_TOKENS, **({{}} if spec is None
                       else {{"speculative_config": spec}}))
print("RESULT " + json.dumps({{"tokens": tokens, "speculative": STATS.speculative_decode, "aura": STATS.aura_decode,
                              "verified": STATS.verify_steps, "max_abs": STATS.verify_max_abs}}))
"""
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def _serve(model: Path, spec) -> dict:
    # its own process: vLLM 0.32 cannot build another engine in a process after a speculative one
    code = _CHILD.format(tests=str(Path(s.__file__).parent), spec=repr(spec), model=str(model))
    env = {**os.environ, **s.OFFLINE_ENV, "TORCH_AURA_VLLM_KV_CACHE": "aura8", "TORCH_AURA_VLLM_VERIFY": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@s.skip_on_vllm_024("ngram")
def test_aura_verification_rows_equal_dense_pages_and_plain_decoding(llama):
    model = llama(128)
    plain, drafted = _serve(model, None), _serve(model, NGRAM)
    # the verification rows really ran, through the AURA decode, each batch checked against dense pages
    assert drafted["speculative"] >= 2 * 5 and plain["speculative"] == 0
    assert drafted["verified"] == drafted["aura"] > 0 and drafted["max_abs"] <= 1e-5
    assert drafted["tokens"] == plain["tokens"]
