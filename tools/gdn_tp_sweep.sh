#!/usr/bin/env bash
# The GDN tensor-parallel sweep (bench_gdn.py --tp) spread over the GPUs of one host, then rendered as
# one table: one bench process per GPU, each timing its own head splits, so the sweep fits one device
# call. Each GPU times ours and FLA side by side for its rows; ratios never mix GPUs.
#   usage: OUT=dir bash tools/gdn_tp_sweep.sh [PROFILE_ARGS...]
#   The last GPU then runs benchmarks/profile_gdn.py with PROFILE_ARGS when given (its rows are the lighter).
set -uo pipefail
OUT=${OUT:-/tmp/aura_gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
n=$(nvidia-smi -L | wc -l)
# heaviest first: 16/32 and 8/16 take about as long as 4/8 and 2/4 together
if [ "$n" -ge 2 ]; then groups=("16/32 8/16" "4/8 2/4"); else groups=("16/32 8/16 4/8 2/4"); fi
for i in "${!groups[@]}"; do
  prof=""; [ "${groups[$i]}" = "4/8 2/4" ] || [ "${#groups[@]}" -eq 1 ] && prof="--profile"
  (
    export CUDA_VISIBLE_DEVICES=$i
    timeout ${SWEEP_TIMEOUT:-540} python3 benchmarks/bench_gdn.py --tp $prof --heads ${groups[$i]} \
      --out "$OUT/gpu$i" > "$OUT/sweep_gpu$i.log" 2>&1
    if [ $# -gt 0 ] && [ "$i" -eq $((${#groups[@]} - 1)) ]; then
      timeout ${PROFILE_TIMEOUT:-120} python3 benchmarks/profile_gdn.py "$@" > "$OUT/profile.log" 2>&1
    fi
  ) &
done
wait
grep -h " us (graph" "$OUT"/sweep_gpu*.log
python3 benchmarks/bench_gdn.py --render-from "$OUT"/gpu*/raw/gdn_tp_*.jsonl --out "$OUT/results" | tail -12
[ -f "$OUT/profile.log" ] && tail -80 "$OUT/profile.log"
exit 0
