#!/usr/bin/env bash
# throwaway: tile copies and a deeper ring at one CTA per SM (not committed)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TI=$(python3 -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
build() { nvcc -std=c++20 -O3 -DUSE_CUDA --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 $2 -I$TI -Icsrc tools/decode_timeline.cu -o /tmp/dt_$1; }
build base "" & build tile "-DAURA_DECODE_TILE_COPY=1" & build deep "-DAURA_DECODE_SMEM_BUDGET=225*1024 -DAURA_DECODE_MAX_STAGES=8" & build deeptile "-DAURA_DECODE_TILE_COPY=1 -DAURA_DECODE_SMEM_BUDGET=225*1024 -DAURA_DECODE_MAX_STAGES=8" & build deep4 "-DAURA_DECODE_SMEM_BUDGET=225*1024 -DAURA_DECODE_MAX_STAGES=5" & wait
{
for a in "8 32768 128" "1 131072 128" "1 32768 128" "1 32768 256 0 16 8" "1 32768 128 0 8 2" "1 4096 128 0 32 8"; do
  for v in base tile deep4 deep deeptile; do echo "== $v $a"; /tmp/dt_$v $a; done
done
for v in base tile; do echo "== $v 32 8192 128"; DT_ENGINE=bulk /tmp/dt_$v 32 8192 128; done
} > $OUT/tile.txt 2>&1
grep -E "==|graph|^D" $OUT/tile.txt | cut -c1-200
