#!/usr/bin/env bash
# One device run (see the device tool's METHOD): build the CUDA extension, run the GPU tests and
# opcheck on CUDA, compute-sanitizer memcheck + racecheck on the small cases, then the benchmarks.
# Everything is teed under $OUT so the logs come back even if a step times out.
#   usage: bash tools/gpu_check.sh [tests|sanitize|bench|bench_aura]...   (default: all four)
#   TESTS_K='aura' narrows the tests step with pytest -k (default: every CUDA test). No -x: one device
#   run must report every failure, and the log is kept under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/aura_gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=${*:-tests sanitize bench bench_aura}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
AURA_BUILD_CUDA=1 python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 \
  || { tail -60 "$OUT/build.log"; exit 1; }
python3 -c "import torch_aura; s = torch_aura.backends.status(); print({op: s[op]['cuda'] for op in ('flash_decode', 'aura_decode')})"
rc=0
for step in $steps; do
  case $step in
    tests)
      timeout ${TESTS_TIMEOUT:-420} python3 -m pytest tests/cuda tests/registration/test_opcheck.py \
        -k "cuda${TESTS_K:+ and ($TESTS_K)}" -q -p no:cacheprovider --durations=8 2>&1 | tee "$OUT/tests.log" \
        | grep -E "passed|failed|FAILED|ERROR|Error" | tail -60 || rc=1 ;;
    sanitize)
      for tool in memcheck racecheck; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 -m pytest tests/cuda -m sanitize -q -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} 2>&1 \
          | tee "$OUT/$tool.log" | tail -6 || rc=1
      done ;;
    bench)
      timeout 400 python3 benchmarks/bench_decode.py --out "$OUT/results" 2>&1 | tee "$OUT/bench.log" | tail -45 || rc=1 ;;
    bench_aura)
      timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/bench_aura.py --out "$OUT/results" 2>&1 | tee "$OUT/bench_aura.log" \
        | tail -60 || rc=1 ;;
  esac
done
exit $rc
