#!/usr/bin/env bash
# The LLM serving device call (issues #44 item 4, #45): benchmark/release/serve_llm.py for one model,
# after the FA4 bundle's first part went in an earlier call on the same warm machine.
#
#   run(carry=[".fa4_ir"]):                          bash benchmark/release/gpu_fa4_call.sh ir
#   run(carry=[".fa4_rest", ".sgl23", ".fa3"], timeout_s=600):
#       bash benchmark/release/gpu_serve_call.sh gemma4_31b 540   (12 layers; the bf16 arm only where it fits)
#   run(carry=[".fa4_rest", ".sgl23", ".fa3"], timeout_s=600):
#       bash benchmark/release/gpu_serve_call.sh llama3_8b 540
#
# .sgl23 must hold server.tar.xz (the server-only wheels: setproctitle, jsonschema, python-multipart, ...):
# ln /work/main/.sgl/server.tar.xz /work/main/.sgl23/  (device_install.sh unpacks it when present).
# Carried: .fa4_rest 16 MiB + .sgl23 ~27 MiB + .fa3 2.3 MiB + the tree ~4 MiB.
# usage: gpu_serve_call.sh MODEL [BUDGET_S] [extra serve_llm.py args...]
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?model}; BUDGET=${2:-540}; shift $(( $# >= 2 ? 2 : 1 ))
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
export PYTHONUNBUFFERED=1
P=$(bash benchmark/sglang_on_gpu/fa4_bundle_parts.sh install .fa4_rest) || { echo "FA4 bundle incomplete (run the .fa4_ir call first)"; exit 3; }
[[ -f .sgl23/server.tar.xz ]] || echo "WARNING: .sgl23 has no server.tar.xz: launch_server may miss setproctitle/jsonschema"
S=$(bash .sgl23/install.sh 0.5.23 "$PWD") || { echo "SGLang bundle failed"; exit 4; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
# the rounds stop starting at BUDGET-60 s; the whole script is cut at BUDGET
timeout --signal=TERM "$BUDGET" python3 benchmark/release/serve_llm.py --model "$MODEL" --out "$FINAL" \
    --pythonpath "$S:$PWD" --repo "$PWD" --time-budget-s $((BUDGET - 60)) "$@"
echo "serve_llm exit $?"; ls -la "$FINAL"
