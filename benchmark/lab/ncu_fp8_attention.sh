#!/usr/bin/env bash
# Nsight Compute on the GPU machine: the FP8 attention kernel and FA4 bf16 at d128 non-causal
# 8x4096 (16 heads), one warm launch each (benchmark/lab/ncu_fp8_attention.py workload), written as
# --csv pages (details, raw, source with SASS) under $OUT/ncu.  FP8 kernel config changes: $1 (FIELD=VALUE,...);
# NCU_WHICH=fp8 profiles the FP8 kernel alone (default: fp8 bf16); NCU_SHAPE=BxN another shape.
# Summarize afterwards, on any machine:
#   python benchmark/lab/ncu_fp8_attention.py summarize --raw DIR --out benchmark/results/h200/fp8_attention_ncu
set -uo pipefail
flags=${1:-}
here=$(cd "$(dirname "$0")/../.." && pwd)
dst=${OUT:?}/ncu; mkdir -p "$dst"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
"$NCU" --version > "$dst/ncu_version.txt" 2>&1
# a few pipe metrics the sections chart but do not always list; only those this ncu knows
"$NCU" --query-metrics --chip gh100 > "$dst/metrics_gh100.txt" 2>&1
extra=""
for m in sm__pipe_tensor_op_gmma_cycles_active sm__inst_executed_pipe_tensor_op_gmma sm__pipe_shared_cycles_active \
         sm__inst_executed_pipe_xu sm__pipe_xu_cycles_active sm__inst_executed_pipe_fma sm__inst_executed_pipe_alu \
         sm__pipe_fma_cycles_active sm__pipe_alu_cycles_active sm__inst_executed_pipe_uniform \
         l1tex__data_pipe_lsu_wavefronts_mem_shared smsp__inst_executed_op_shared_ld; do
  if grep -q "^$m " "$dst/metrics_gh100.txt"; then
    case $m in
      *cycles_active|*pipe_*) extra="$extra,$m.avg.pct_of_peak_sustained_active" ;;
    esac
    case $m in l1tex__*|smsp__inst_executed_op*) extra="$extra,$m.sum" ;; esac
  fi
done
extra=${extra#,}
echo "extra metrics: $extra" | tee "$dst/extra_metrics.txt"
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section LaunchStats --section Occupancy --section SourceCounters"
for which in ${NCU_WHICH:-fp8 bf16}; do
  t0=$(date +%s)
  "$NCU" --clock-control none --profile-from-start off --kernel-name regex:'cutlass|Fp8|Flash|flash|fp8' -c 1 \
    $sections ${extra:+--metrics $extra} -f -o "$dst/$which" \
    python3 "$here/benchmark/lab/ncu_fp8_attention.py" workload --which $which --flags "$flags" --shape "${NCU_SHAPE:-}" > "$dst/${which}_ncu.log" 2>&1
  echo "ncu $which rc=$? $(( $(date +%s) - t0 ))s"; tail -3 "$dst/${which}_ncu.log"
  "$NCU" --import "$dst/$which.ncu-rep" --csv --page details > "$dst/${which}_details.csv" 2>&1
  "$NCU" --import "$dst/$which.ncu-rep" --csv --page raw > "$dst/${which}_raw.csv" 2>&1
  "$NCU" --import "$dst/$which.ncu-rep" --csv --page source --print-source sass > "$dst/${which}_source.csv" 2>&1
  ls -la "$dst" | grep "$which"
done
