#!/usr/bin/env bash
# vLLM 0.24.0 (CUDA 13, torch 2.11: the GPU image's torch) onto a lent GPU machine that reaches no
# registry. One run carries at most 64 MiB of git-ignored files, so the wheels travel in 58 MiB parts (6: 343 MiB),
# one per run, into /root/stash, which survives while the machine stays warm (30 s after a run: make
# the next run at once). docs: README "vLLM on a GPU".
#
#   bash tools/vllm_gpu_setup.sh prepare          # HERE: download, bundle, split into .gpu-wheels/parts/
#   bash tools/vllm_gpu_setup.sh stash            # DEVICE, once per part: copy the carried part to /root/stash
#   bash tools/vllm_gpu_setup.sh stash install    # DEVICE, with the last part: join, check, install
#   bash tools/vllm_gpu_setup.sh run CMD...       # DEVICE, later runs: CMD with the installed vLLM on PYTHONPATH
#
# Parameters (environment): VLLM_VERSION (0.24.0), GPU_PYTHON (3.12: the image's python3 is 3.12.3),
# GPU_PLATFORM (manylinux_2_35_x86_64, the newest glibc tag accepted; the image's Ubuntu 24.04 has 2.39),
# PART_SIZE (58m: a part, its checksums and the ~3 MiB working tree stay under the 64 MiB a run carries),
# STASH (/root/stash), TARGET (/root/vllm024), AURA_BUILD_CUDA (1: build the CUDA extension).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=${VLLM_VERSION:-0.24.0}
GPU_PYTHON=${GPU_PYTHON:-3.12}
GPU_PLATFORM=${GPU_PLATFORM:-manylinux_2_35_x86_64}
PART_SIZE=${PART_SIZE:-58m}
STASH=${STASH:-/root/stash}
TARGET=${TARGET:-/root/vllm024}
W=.gpu-wheels  # git-ignored (.gitignore)
export GPU_PYTHON GPU_PLATFORM

prepare() {
  mkdir -p "$W/dl"
  local whl
  whl=$(ls "$W"/dl/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$whl" ]; then  # the CUDA build (~279 MB); its dependencies are resolved below
    # every manylinux tag up to GPU_PLATFORM: pip < 24 matches --platform exactly (vLLM 0.24 is manylinux_2_28)
    local plats
    plats=$(python3 -c "import sys; sys.path.insert(0, 'tools'); from vllm_gpu_wheels import _platforms; \
print(' '.join('--platform ' + t for t in _platforms('$GPU_PLATFORM')))")
    python3 -m pip download -q "vllm==$VLLM_VERSION" --no-deps --python-version "$GPU_PYTHON" \
      $plats --only-binary=:all: -d "$W/dl"
    whl=$(ls "$W"/dl/vllm-"$VLLM_VERSION"-*.whl | head -1)
  fi
  rm -rf "$W/deps" "$W/parts" "$W/bundle.tar"
  python3 tools/vllm_gpu_wheels.py resolve "$W/deps" "$whl"
  cp "$whl" "$W/deps/"
  # stored, not compressed: wheels are zips already
  tar -C "$W/deps" -cf "$W/bundle.tar" .
  mkdir -p "$W/parts"
  split -b "$PART_SIZE" -d -a 2 "$W/bundle.tar" "$W/parts/part-"
  rm "$W/bundle.tar"
  (cd "$W/parts" && sha256sum part-* > SHA256SUMS)
  local n
  n=$(ls "$W"/parts/part-* | wc -l)
  echo "$(du -sh "$W/deps" | cut -f1) of wheels in $n parts under $W/parts. Device runs, back to back (< 30 s apart):"
  local i=0 p
  for p in "$W"/parts/part-*; do
    i=$((i + 1))
    if [ "$i" -lt "$n" ]; then
      echo "  run(carry=[\"$p\", \"$W/parts/SHA256SUMS\"], command=\"bash tools/vllm_gpu_setup.sh stash\")"
    else
      echo "  run(carry=[\"$p\", \"$W/parts/SHA256SUMS\"], command=\"bash tools/vllm_gpu_setup.sh stash install\")"
    fi
  done
}

stash() {
  mkdir -p "$STASH"
  cp "$W"/parts/SHA256SUMS "$STASH/"
  local p
  for p in "$W"/parts/part-*; do
    [ -e "$p" ] && cp "$p" "$STASH/" && echo "stashed $(basename "$p") ($(stat -c %s "$p") bytes)"
  done
  (cd "$STASH" && echo "in $STASH: $(ls part-* | tr '\n' ' ')")
}

install() {
  cd_stash_check
  rm -rf "$STASH/wheels"; mkdir -p "$STASH/wheels"
  cat "$STASH"/part-* | tar -C "$STASH/wheels" -xf -  # parts stay: 'install' alone can be repeated
  python3 tools/vllm_gpu_wheels.py install "$STASH/wheels" "$TARGET"
  # torch_aura into the image's python (editable: the entry point vLLM loads its plugin from)
  AURA_BUILD_CUDA=${AURA_BUILD_CUDA:-1} python3 -m pip install -q --no-build-isolation --no-deps -e . \
    > "$STASH/torch_aura_build.log" 2>&1 || { tail -40 "$STASH/torch_aura_build.log"; exit 1; }
  check
}

cd_stash_check() {
  [ -e "$STASH/SHA256SUMS" ] || { echo "no $STASH/SHA256SUMS: run 'stash' with each part first"; exit 1; }
  (cd "$STASH" && sha256sum -c --quiet SHA256SUMS) || {
    echo "parts missing or damaged in $STASH (the machine may have been given back between runs):"
    echo "have: $(cd "$STASH" && ls part-* 2>/dev/null | tr '\n' ' ')"
    echo "need: $(cut -d' ' -f3 "$STASH/SHA256SUMS" | tr '\n' ' ')"
    exit 1; }
}

check() {
  PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" python3 - <<'EOF'
import importlib.metadata as md
import torch, vllm
import vllm._C_stable_libtorch  # noqa: F401  the compiled extension loads against this torch
from vllm import LLM  # noqa: F401
from torch_aura.integrations.vllm import register
eps = [e.name for e in md.entry_points(group="vllm.general_plugins")]
print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(0), "plugins", eps)
register()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
print("CUSTOM ->", AttentionBackendEnum.CUSTOM.get_path())
EOF
}

run() {
  [ -d "$TARGET/vllm" ] || {
    echo "no vLLM in $TARGET: the machine was given back since the install; repeat the stash runs"; exit 1; }
  # flashinfer is left out of the bundle (OPTIONAL in vllm_gpu_wheels.py), and vLLM 0.24's sampler imports it
  # on CUDA unless told not to (ModuleNotFoundError at engine start on the H200)
  VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0} PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" "$@"
}

[ $# -gt 0 ] || { sed -n 2,15p "$0"; exit 2; }
case $1 in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) for step in "$@"; do
       case $step in
         stash|install|check) "$step" ;;
         *) echo "unknown step '$step': prepare, stash, install, check, run CMD..."; exit 2 ;;
       esac
     done ;;
esac
