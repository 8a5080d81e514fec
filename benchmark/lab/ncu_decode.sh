#!/usr/bin/env bash
# Nsight Compute on the GPU machine: one decode call of the split-KV FP8 kernel and of FA3-FP8 per
# case (benchmark/lab/ncu_decode.py), --csv details pages under $OUT/ncu_decode. CASES overrides the
# cases (MODEL:BATCH:CONTEXT:PAGE ...). Needs .fa3 (benchmark/fa3_build/build.sh).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dst=${OUT:?}/ncu_decode; mkdir -p "$dst"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
"$NCU" --version > "$dst/ncu_version.txt" 2>&1
CASES=${CASES:-"llama3-8b:32:8192:64 d256:32:8192:16 llama3-8b:8:32768:16"}
for c in $CASES; do
  for b in fa4_fp8_split_kv fa3_fp8; do
    tag="${c//:/_}-$b"
    ( cd "$here" && timeout 120 "$NCU" --profile-from-start off --clock-control none --csv --page details \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats \
        python3 benchmark/lab/ncu_decode.py --case "$c" --backend "$b" > "$dst/$tag.csv" 2> "$dst/$tag.err" )
    echo "$tag: exit $? ($(wc -l < "$dst/$tag.csv") lines)"
  done
done
