#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over the CPU kernels (csrc/cpu): builds an instrumented
# copy of the library, swaps it in for torch_aura._C_cpu (tests/_cpu_sanitize.py) and runs the CPU
# fast-path tests against it. Needs g++ with libasan / libubsan (gcc's default install).
#   usage: bash tools/cpu_sanitize.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
lib=${TMPDIR:-/tmp}/torch_aura_C_cpu_asan.so
pyinc=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
g++ -O1 -g -std=c++17 -fopenmp-simd -pthread -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  -fno-omit-frame-pointer -shared -fPIC -I"$pyinc" csrc/cpu/*.cpp -o "$lib"
export AURA_CPU_SANITIZE_LIB=$lib ASAN_OPTIONS=detect_leaks=0
PYTHONPATH=tests${PYTHONPATH:+:$PYTHONPATH} LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)" \
  python -m pytest -q -p no:cacheprovider -p _cpu_sanitize tests/reference/test_cpu_fast_aura.py \
  tests/reference/test_cpu_fast_decode.py "$@"
