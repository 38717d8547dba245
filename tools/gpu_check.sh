#!/usr/bin/env bash
# One device run (see the device tool's METHOD): build the CUDA extension, run the GPU tests and
# opcheck on CUDA, compute-sanitizer memcheck + racecheck on the small cases, then the benchmarks.
# Everything is teed under $OUT so the logs come back even if a step times out. No -x: one device
# run must report every failure.
#   usage: bash tools/gpu_check.sh [tests|sanitize|bench_decode|bench_aura|bench_gdn|bench_gdn_first_call|profile_gdn|
#                                   bench_e2e|bench_vllm|gdn_plan|gdn_bucket|aura_append|decode_ring|decode_streamk|
#                                   snapshot]...
#   (default: all but bench_e2e)
#   FAMILY=decode|aura|gdn|transformers|vllm|all (default all) narrows the tests and sanitizer runs to one family.
#   AURA_BUILD_CUDA=0 skips the CUDA C++ build (Triton-only runs). TESTS_TIMEOUT, SANITIZE_TIMEOUT (each tool),
#   BENCH_TIMEOUT bound the steps; BENCH_ARGS go to bench_decode.py (e.g. "--schedules --cases B8,T128k").
#   Wheels under .whl/ (e.g. fla-core, the GDN peer) are installed first when present.
#   HANG_S (120): a test still running after that many seconds prints its Python stack (pytest's
#   faulthandler_timeout), so a hung kernel is named before the step's timeout kills it silently.
set -uo pipefail
OUT=${OUT:-/tmp/aura_gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# one intra-op thread per pytest worker: the CPU references of 16 xdist workers otherwise oversubscribe
# the host (16 x 16 threads) and the test step runs several times slower
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
steps=${*:-tests sanitize bench_decode bench_aura bench_gdn}
FAMILY=${FAMILY:-all}
hang="-o faulthandler_timeout=${HANG_S:-120}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# decode_ring and decode_streamk build their own standalone driver: the package is neither built nor imported
# for them alone
if [ "$steps" = decode_ring ] || [ "$steps" = decode_streamk ]; then AURA_BUILD_CUDA=0; fi
AURA_BUILD_CUDA=${AURA_BUILD_CUDA:-1} python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 \
  || { tail -60 "$OUT/build.log"; exit 1; }
python3 -c "import torch_aura as t; s = t.backends.status(); print({op: s[op]['cuda'] for op in ('flash_decode', 'aura_decode', 'gdn_chunk')})"
case $FAMILY in
  decode) test_paths="tests/cuda/test_decode_cuda.py"; opcheck_k="cuda and (flash_decode or merge)" ;;
  aura) test_paths="tests/cuda/test_aura_cuda.py"; opcheck_k="cuda and (aura or hadamard)" ;;
  gdn) test_paths="tests/cuda/test_gdn_cuda.py"; opcheck_k="cuda and gdn" ;;
  transformers) test_paths="tests/cuda/test_transformers_cuda.py tests/integrations"; opcheck_k="cuda and aura_decode" ;;
  vllm) test_paths="tests/cuda/test_vllm_paged_cuda.py"; opcheck_k="cuda and (flash_decode_out or aura_decode or aura_write)" ;;
  *) test_paths="tests/cuda"; opcheck_k="cuda" ;;
esac
rc=0
for step in $steps; do
  case $step in
    tests)
      # tests check numerics, not launch configs: skip the Triton warm-up tuning (each key would time
      # every config); xdist spreads the Triton compiles over the host's cores
      TORCH_AURA_TUNE=0 timeout ${TESTS_TIMEOUT:-540} python3 -m pytest $test_paths tests/registration/test_opcheck.py \
        -k "$opcheck_k or not opcheck" -q -p no:cacheprovider $hang -n 16 --durations=10 2>&1 | tee "$OUT/tests.log" \
        | grep -E "passed|failed|FAILED|ERROR|Error" | tail -60 || rc=1 ;;
    sanitize)
      for tool in memcheck racecheck; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 TORCH_AURA_TUNE=0 timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 -m pytest $test_paths -m sanitize -q -p no:cacheprovider $hang 2>&1 | tee "$OUT/$tool.log" | tail -6 || rc=1
      done ;;
    bench_decode)
      timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/bench_decode.py --out "$OUT/results" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_decode.log" | tail -45 || rc=1 ;;
    bench_aura)
      timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/bench_aura.py --out "$OUT/results" 2>&1 | tee "$OUT/bench_aura.log" \
        | tail -60 || rc=1 ;;
    bench_e2e)
      # E2E_MODELS=llama3-8b,qwen3-next (default both); needs transformers (a wheel under .whl/)
      timeout ${BENCH_TIMEOUT:-540} python3 benchmarks/bench_e2e_transformers.py --models ${E2E_MODELS:-llama3-8b,qwen3-next} \
        --out "$OUT/results" ${E2E_ARGS:-} 2>&1 | tee -a "$OUT/bench_e2e.log" | tail -60 || rc=1 ;;
    bench_vllm)
      timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/bench_vllm_paged.py --out "$OUT/results" 2>&1 | tee "$OUT/bench_vllm.log" \
        | tail -30 || rc=1 ;;
    bench_gdn)
      timeout 500 python3 benchmarks/bench_gdn.py --profile --out "$OUT/results" 2>&1 | tee "$OUT/bench_gdn.log" | tail -60 || rc=1 ;;
    bench_gdn_first_call)
      # fresh processes, cold and warm caches; --write-table ships the tuned table this run built
      timeout ${BENCH_TIMEOUT:-500} python3 benchmarks/bench_gdn_first_call.py --out "$OUT/results" --write-table 2>&1 \
        | tee "$OUT/bench_gdn_first_call.log" | tail -30 || rc=1 ;;
    gdn_plan)
      # the GDN plans' replay test (eager and in a graph, bitwise vs the launchers), then the planned call's host time taken apart (--anatomy)
      TORCH_AURA_TUNE=0 timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider $hang tests/cuda/test_gdn_cuda.py \
        -k planned 2>&1 | tee "$OUT/gdn_plan.log" | tail -5 || rc=1
      timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/profile_gdn.py --heads 2/4 --lens 8192 --host --anatomy \
        --no-fla 2>&1 | tee -a "$OUT/gdn_plan.log" | tail -30 || rc=1 ;;
    gdn_bucket)
      # the first prompt past the prep kernels' many-chunks bucket compiles nothing, whatever came first (gdn.md §6.4)
      timeout ${BENCH_TIMEOUT:-180} python3 tools/gdn_bucket_probe.py 2>&1 | tee "$OUT/gdn_bucket.log" | tail -6 || rc=1 ;;
    aura_append)
      # the fused append's GPU tests in one process (xdist start-up outlasted a short timeout), then both sanitizers
      TORCH_AURA_TUNE=0 timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider $hang tests/cuda/test_aura_cuda.py \
        -k append --durations=5 2>&1 | tee "$OUT/aura_append.log" | tail -12 || rc=1
      for tool in memcheck racecheck; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 TORCH_AURA_TUNE=0 timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool $tool \
          --error-exitcode 9 python3 -m pytest tests/cuda/test_aura_cuda.py -m sanitize -k append -q -p no:cacheprovider $hang 2>&1 \
          | tee -a "$OUT/aura_append.log" | tail -4 || rc=1
      done ;;
    decode_ring)
      # flash_decode's ring depth and shared-memory budget at the large reads (issue 39 d4; docs/decode.md §4):
      # the standalone timeline driver built per (stages, budget), graph us of split + merge on the launcher's plan
      inc=$(python3 -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
      # D=128 bf16: 34816 B per ring step of the four warps, 4480 B of q and barriers -> 3 (the default), 4, 5, 6 steps
      for cfg in "4 112640" "4 143744" "5 178560" "6 213376"; do
        set -- $cfg
        nvcc -std=c++20 -O3 -DUSE_CUDA --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 -I"$inc" -Icsrc \
          -DAURA_DECODE_MAX_STAGES=$1 -DAURA_DECODE_SMEM_BUDGET=$2 tools/decode_timeline.cu -o /tmp/dt_$2 || { rc=1; continue; }
        for c in "8 32768 128" "1 131072 128" "32 8192 128" "1 32768 256"; do
          echo "stages<=$1 budget $2: $(/tmp/dt_$2 $c 2>&1 | grep -E 'ring|graph us' | tr '\n' ' ')"
        done
      done 2>&1 | tee "$OUT/decode_ring.log" ;;
    decode_streamk)
      # the stream-K schedule's timeline beside the static splits' at the large reads (issue 39 d4; docs/decode.md
      # §4): phase medians, the spread of the CTAs' loop ends, graph us of split + merge; DT_BYSM=1 adds per-SM ends
      inc=$(python3 -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
      nvcc -std=c++20 -O3 -DUSE_CUDA --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 -I"$inc" -Icsrc \
        tools/decode_timeline.cu -o /tmp/dt_streamk || rc=1
      for c in "8 32768 128" "1 131072 128" "32 8192 128"; do
        for k in 0 1 2; do
          echo "== DT_STREAMK=$k $c"
          if [ $k = 0 ]; then /tmp/dt_streamk $c; else DT_STREAMK=$k /tmp/dt_streamk $c; fi
        done
      done 2>&1 | tee "$OUT/decode_streamk.log" ;;
    snapshot)
      # the built extension back as $OUT/so.tgz.part-*: later runs on a fresh machine unpack it instead of building
      # (cat parts > .snap/so.tgz; tar xzf .snap/so.tgz && AURA_BUILD_CUDA=0 AURA_BUILD_CPU=0 bash tools/gpu_check.sh ...),
      # until csrc/ changes; split because one file under $OUT comes back only up to 16 MiB
      tar czf /tmp/so.tgz torch_aura/_C_*.so && split -b 15000000 /tmp/so.tgz "$OUT/so.tgz.part-" && ls -la "$OUT"/so.tgz.part-* || rc=1 ;;
    profile_gdn)
      # PROFILE_ARGS e.g. "--heads 16/32 --lens 131072 --memory --no-fla" (default: host time at 2/4 heads, 1x8k)
      timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/profile_gdn.py ${PROFILE_ARGS:---heads 2/4 --lens 8192 --host --no-fla} \
        2>&1 | tee -a "$OUT/profile_gdn.log" | tail -80 || rc=1 ;;
  esac
done
exit $rc
