#!/usr/bin/env bash
# One device call of the paged FP8-KV decode work (issue #42): correctness on the GPU, FA3's build
# checked against fp32, the launch/split sweep of our kernel, the decode matrix against FA3-FP8,
# FA3-bf16 and SGLang's Triton decode. Each step has its own time limit so one slow step cannot
# take the call; every result lands in $OUT (the reply carries the log's tail).
#
#   run(carry=[".fa3", ".sgl_decode"]): bash benchmark/release/gpu_decode_call.sh STEPS...
#
# STEPS (in the order given): env correctness correctness-candidate refusals fa3 kernel candidate occupancy tune
# tune-splits wide ncu matrix-first matrix-short matrix-long matrix-candidate matrix-gemma custom, and after
# candidate or custom: matrix-best correctness-best (its winners per head dim; see the case statement);
# STEP=SECONDS sets a step's time budget (e.g. tune=150).
# .fa3: benchmark/fa3_build/build.sh; .sgl_decode: benchmark/sglang_on_gpu/make_triton_decode_bundle.sh.
# BACKENDS (optional): the decode matrix's backends (default: all of bench decode's).
# VARIANTS: the custom step's launches (decode_tune.py --variants); PICK (optional): the sweep whose winners
# matrix-best / correctness-best take (candidate, custom; default candidate).
# CANDIDATE (optional): matrix-candidate's launch JSON, per head dim where it differs (bench decode
# --candidate; default decode_plan.CANDIDATE), e.g. the winner of the candidate sweep.
set -uo pipefail
cd "$(dirname "$0")/../.."
# a call brings back at most 8 files: results gather in $RES and travel as one archive
FINAL=${OUT:-/tmp/out}
OUT=${RES:-/tmp/decode_results}
mkdir -p "$OUT" "$FINAL"
trap 'tar -czf "$FINAL/decode_results.tgz" -C "$OUT" . && echo "results: $(ls "$OUT" | tr "\n" " ")"' EXIT
export PYTHONPATH=$PWD:$PWD/.sgl_decode${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*"; }
step() {  # step LIMIT_S NAME CMD...: run with a time limit, log its status
    local limit=$1 name=$2; shift 2
    log "step $name (limit ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log" | tail -n 60
    log "step $name: exit ${PIPESTATUS[0]}"
}
B=${BACKENDS:+--backends $BACKENDS}
for arg in "$@"; do
  s=${arg%%=*}; t=${arg#*=}; [ "$t" = "$arg" ] && t=""
  case "$s" in
    env)
      nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv | tee "$OUT/gpu.csv"
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/gpu.csv"
      [ -f .fa3/BUILD_INFO ] && cat .fa3/BUILD_INFO ;;
    correctness)
      step ${t:-240} correctness python3 tests/fp8_decode_child.py --device cuda --matrix gpu --check \
          --out "$OUT/fp8_decode_correctness.json" ;;
    refusals)  # the bad-input checks on CUDA tensors (issue #42: refused on the GPU too)
      step ${t:-90} refusals python3 -m pytest -q -p no:cacheprovider tests/test_fp8_paged_decode.py \
          tests/test_fp8_paged_d512.py -k refused --device cuda ;;
    fa3)
      step ${t:-120} fa3 python3 -m pytest -q -rs tests/test_fa3_baseline.py -k gpu ;;
    tune)
      t=${t:-260}; step $t tune python3 benchmark/lab/decode_tune.py --out "$OUT" --sweep launch --budget-s $((t - 30)) ;;
    kernel)
      t=${t:-200}; step $t kernel python3 benchmark/lab/decode_tune.py --out "$OUT" --sweep kernel --tag kernel \
          --budget-s $((t - 25)) ;;
    correctness-candidate)  # the same matrix with decode_plan.CANDIDATE, before it is timed
      step ${t:-120} correctness-candidate python3 tests/fp8_decode_child.py --device cuda --matrix gpu --check \
          --launch "$(python3 -c 'import json; from sglang_fa4.kernels.fp8_paged_kv.decode_plan import CANDIDATE; print(json.dumps(CANDIDATE))')" \
          --out "$OUT/fp8_decode_correctness-candidate.json" ;;
    candidate)
      t=${t:-120}; step $t candidate python3 benchmark/lab/decode_tune.py --out "$OUT" --sweep candidate --tag candidate \
          --budget-s $((t - 25)) ;;
    matrix-candidate)  # the candidate beside the default and FA3-FP8 in one process
      t=${t:-240}; step $t matrix-candidate python3 -m sglang_fa4.cli bench decode \
          --backends fa4_fp8_split_kv fa4_fp8_split_kv_candidate fa3_fp8 --batches 1 8 32 64 --contexts 8192 32768 \
          --no-extra-pages --out-dir "$OUT" --tag candidate --time-budget-s $((t - 25)) \
          ${CANDIDATE:+--candidate "$CANDIDATE"} ;;
    custom)  # launches named in VARIANTS (decode_tune.py --variants: a JSON list, or {head dim: list})
      t=${t:-120}; step $t custom python3 benchmark/lab/decode_tune.py --out "$OUT" --sweep custom --tag custom \
          --variants "$VARIANTS" --budget-s $((t - 25)) ;;
    matrix-best|correctness-best)  # a sweep's winners per head dim (decode_tune.py --pick over the result of
      # the step PICK names, candidate by default, which runs first): their matrix beside the default and
      # FA3-FP8 at the head dims they win, or their GPU correctness matrix; skipped where none beat the default
      best=$(python3 benchmark/lab/decode_tune.py --pick "$OUT/decode_tune-${PICK:-candidate}.json" 2>>"$OUT/pick.log")
      [ -n "$best" ] || best="{}"
      echo "$best" > "$OUT/$s.launch.json"
      models=""
      case "$best" in *'"256"'*) models="d256 gemma4-31b-swa" ;; esac
      case "$best" in *'"512"'*) models="$models gemma4-31b-full" ;; esac
      case "$best" in *'"128"'*) models="$models llama3-8b qwen2.5-7b" ;; esac
      if [ -z "$models" ]; then
        log "$s: skipped: no variant of the candidate sweep beat the default (winners: $best)"
      elif [ "$s" = matrix-best ]; then
        t=${t:-240}; step $t matrix-best python3 -m sglang_fa4.cli bench decode --models $models \
            --backends fa4_fp8_split_kv fa4_fp8_split_kv_candidate fa3_fp8 --batches 1 8 32 64 --contexts 8192 32768 \
            --no-extra-pages --out-dir "$OUT" --tag best --time-budget-s $((t - 25)) --candidate "$best"
      else
        step ${t:-120} correctness-best python3 tests/fp8_decode_child.py --device cuda --matrix gpu --check \
            --launch "$best" --out "$OUT/fp8_decode_correctness-best.json"
      fi ;;
    occupancy)
      t=${t:-120}; step $t occupancy python3 benchmark/lab/decode_tune.py --out "$OUT" --sweep occupancy --tag occupancy \
          --budget-s $((t - 25)) ;;
    tune-splits)
      t=${t:-200}; step $t tune-splits python3 benchmark/lab/decode_tune.py --out "$OUT" --sweep splits --tag splits \
          --budget-s $((t - 25)) ;;
    matrix-short)
      t=${t:-300}; step $t matrix-short python3 -m sglang_fa4.cli bench decode $B --contexts 1024 8192 \
          --out-dir "$OUT" --tag short --time-budget-s $((t - 25)) ;;
    matrix-long)
      t=${t:-300}; step $t matrix-long python3 -m sglang_fa4.cli bench decode $B --contexts 32768 131072 \
          --out-dir "$OUT" --tag long --time-budget-s $((t - 25)) ;;
    matrix-first)
      t=${t:-240}; step $t matrix-first python3 -m sglang_fa4.cli bench decode $B --batches 1 8 64 256 \
          --contexts 8192 32768 --no-extra-pages --out-dir "$OUT" --tag first --time-budget-s $((t - 25)) ;;
    matrix-gemma)
      t=${t:-150}; step $t matrix-gemma python3 -m sglang_fa4.cli bench decode --models gemma4-31b-full gemma4-31b-swa \
          --backends fa4_fp8_split_kv triton_fp8 fa3_fp8 --batches 1 8 16 32 64 --contexts 8192 32768 \
          --out-dir "$OUT" --tag gemma4 --time-budget-s $((t - 25)) ;;
    ncu)
      t=${t:-240}; step $t ncu env OUT="$OUT" bash benchmark/lab/ncu_decode.sh ;;
    wide)
      t=${t:-150}; step $t wide python3 benchmark/lab/decode_tune.py --out "$OUT" --sweep wide --tag wide --rounds 11 \
          --budget-s $((t - 25)) ;;
    *) echo "unknown step $s" >&2 ;;
  esac
done
log "done"
