#!/usr/bin/env bash
# throwaway: partition-camping / per-SM spread experiments (not committed)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TI=$(python3 -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
build() { nvcc -std=c++20 -O3 -DUSE_CUDA --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 $2 -I$TI -Icsrc tools/decode_timeline.cu -o /tmp/dt_$1; }
build base "" & build rot "-DAURA_DECODE_ROTATE=1" & wait
DT_BYSM=1 /tmp/dt_base 32 8192 128 > $OUT/bysm_B32.txt 2>&1
DT_BYSM=1 /tmp/dt_base 8 32768 128 > $OUT/bysm_B8.txt 2>&1
{
for a in "32 8192 128" "8 32768 128" "1 131072 128" "8 32768 128 4"; do
  echo "== base $a"; /tmp/dt_base $a
  for pad in 64 1088 33280; do echo "== pad$pad $a"; DT_PAD=$pad /tmp/dt_base $a; done
  echo "== rot $a"; /tmp/dt_rot $a
done
} > $OUT/camping.txt 2>&1
grep -E "==|graph|phase 4" $OUT/camping.txt | cut -c1-200
