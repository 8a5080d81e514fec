#!/usr/bin/env bash
# The device calls that need the FA4 bundle (issue #42 items 2, 4, 5): the FP8 prefill under the DSL
# SGLang 0.5.22-0.5.23 pin (4.8.0), the SM90 FP8 route's SGLang decode graphs on SGLang's real backend,
# and the split-KV / gather crossover for SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q. The FA4 bundle is over
# what one call carries, so it travels in two calls back to back on the warm machine:
#
#   CUTLASS_DSL_VERSION=4.8.0 SGLANG_VERSION=0.5.23 bash ../shared/device/make_fa4_bundle.sh .fa4
#   bash benchmark/sglang_on_gpu/fa4_bundle_parts.sh split .fa4      # -> .fa4_ir, .fa4_rest
#   run(carry=[".fa4_ir"]):                bash benchmark/release/gpu_fa4_call.sh ir
#   run(carry=[".fa4_rest", ".sgl23"]):    bash benchmark/release/gpu_fa4_call.sh graphs=120 prefill=240 crossover=150
#
# .sgl23: .sgl (benchmark/sglang_on_gpu/make_sglang_bundle.sh) with only common, sglang-0.5.23 and
# the tvm_ffi headers (hard links). Results gather in $OUT/fa4_results.tgz (a call brings back 8 files).
#
# The other pin (DSL 4.6.2, SGLang 0.5.20-0.5.21) on a machine that had the 4.8.0 parts: the first call
# starts with `rm -rf /tmp/site /tmp/sgl`, and both calls set the bundle, the SGLang bundle and version:
#   bash benchmark/sglang_on_gpu/fa4_bundle_parts.sh split ~/.cache/fa4-bundle/fa4-4.0.0b36-cute-4.6.2-sgl-0.5.20 .fa4_462
#   .sgl20: hard links of .sgl/{common.tar.xz,install.sh,sglang-0.5.20.tar.xz,tvm_ffi_headers.tar.xz}
#   run(carry=[".fa4_462_ir"]):  rm -rf /tmp/site /tmp/sgl; FA4=.fa4_462 bash benchmark/release/gpu_fa4_call.sh ir
#   run(carry=[".fa4_462_rest", ".sgl20"]):
#       FA4=.fa4_462 SGL=.sgl20 SGLANG_VERSION=0.5.20 DSL=4.6.2 bash benchmark/release/gpu_fa4_call.sh graphs prefill
set -uo pipefail
cd "$(dirname "$0")/../.."
FINAL=${OUT:-/tmp/out}
OUT=${RES:-/tmp/fa4_results}
mkdir -p "$OUT" "$FINAL"
trap 'tar -czf "$FINAL/fa4_results.tgz" -C "$OUT" . && echo "results: $(ls "$OUT" | tr "\n" " ")"' EXIT
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*"; }
step() {
    local limit=$1 name=$2; shift 2
    log "step $name (limit ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log" | tail -n 40
    log "step $name: exit ${PIPESTATUS[0]}"
}
fa4_path() { bash benchmark/sglang_on_gpu/fa4_bundle_parts.sh install "$1"; }
FA4=${FA4:-.fa4}; SGL=${SGL:-.sgl23}; SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}; DSL=${DSL:-4.8.0}
case "$DSL" in 4.8.0) PINNED_BY="SGLang 0.5.22-0.5.23" ;; 4.6.2) PINNED_BY="SGLang 0.5.20-0.5.21" ;; *) PINNED_BY="no supported SGLang" ;; esac
for arg in "$@"; do
  s=${arg%%=*}; t=${arg#*=}; [ "$t" = "$arg" ] && t=""
  case "$s" in
    ir) fa4_path ${FA4}_ir; echo "ir: exit $? (3: the other parts come next call)" ;;
    graphs)
      P=$(fa4_path ${FA4}_rest) || { echo "FA4 bundle incomplete"; continue; }
      S=$(bash $SGL/install.sh $SGLANG_VERSION "$PWD") || { echo "SGLang bundle failed"; continue; }
      step ${t:-120} graphs env PYTHONPATH="$S:$PWD" python3 benchmark/release/check_fp8_kv_decode_graphs.py --out "$OUT" ;;
    prefill)
      P=$(fa4_path ${FA4}_rest) || { echo "FA4 bundle incomplete"; continue; }
      t=${t:-240}
      step $t prefill env PYTHONPATH="$PWD:$P" python3 benchmark/release/check_fp8_attention.py --isolate \
          --budget $((t - 30)) --sections correctness,speed --rounds 11 --out-dir "$OUT" \
          --json-name "fp8_attention_dsl${DSL//./}.json" \
          --note "CUTLASS DSL $DSL ($PINNED_BY's pin)" ;;
    crossover)
      P=$(fa4_path ${FA4}_rest) || { echo "FA4 bundle incomplete"; continue; }
      t=${t:-150}
      step $t crossover env PYTHONPATH="$PWD:$P" python3 benchmark/lab/extend_crossover.py --out "$OUT" --budget-s $((t - 30)) ;;
    *) echo "unknown step $s" >&2 ;;
  esac
done
log "done"
