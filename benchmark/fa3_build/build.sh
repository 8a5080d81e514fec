#!/usr/bin/env bash
# Builds .fa3/libfa3fwd.so: FlashAttention-3's Hopper forward (sm_90a), only the kernels sglang-fa4's
# benchmarks compare against, behind the C ABI in fa3_capi.cu (loaded by sglang_fa4/bench/fa3.py).
#
#   bash benchmark/fa3_build/build.sh            # sources from GitHub at the pinned commits
#   FA3_GIT=/path/flash-attention/.git CUTLASS_GIT=/path/cutlass/.git bash benchmark/fa3_build/build.sh
#
# Sources (not vendored): Dao-AILab/flash-attention at FA3_COMMIT (hopper/, BSD-3-Clause) and
# NVIDIA/cutlass at the commit that flash-attention pins as its csrc/cutlass submodule (include/,
# BSD-3-Clause); both licenses are copied next to the .so. Needs nvcc >= 12.3 (built with 13.0).
# One nvcc at a time, niced (NICE=19): FA3 kernels take minutes and GBs each to compile.
set -euo pipefail
FA3_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced      # flash-attention main, 2026-08-15
CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671  # its csrc/cutlass submodule at that commit
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SRC=${FA3_SRC_DIR:-$ROOT/.fa3_build}
OUT=${FA3_OUT_DIR:-$ROOT/.fa3}
NVCC=${NVCC:-nvcc}
NICE=${NICE:-19}

# name: hdim dtype causal paged split set -> run_flash_fwd<90, d, d, ClusterM=1, Element, bf16 out,
# causal, local=0, softcap=0, varlen=1, PagedKVNonTMA=paged, AppendKV=0, HasQv=0, PackGQA=paged,
# Split=split, Vcolmajor=0>. The paged kernels come in pairs, Split 0 and 1, as sgl-kernel's FA3 has
# them: with num_splits=0 FA3 picks its split count per call (get_num_splits, then the varlen
# scheduler's per-batch dynamic split) and runs the Split kernel + the combine when it is > 1.
# Decode (one query token) keeps causal at d128 and drops it at d256 (mha_fwd); those kernels are
# the set "decode", listed first: FA3_ONLY=decode builds only them.
KERNELS="
fa3k_e4m3_d128_paged_causal 128 e4m3 1 1 0 decode
fa3k_e4m3_d128_paged_causal_split 128 e4m3 1 1 1 decode
fa3k_e4m3_d256_paged 256 e4m3 0 1 0 decode
fa3k_e4m3_d256_paged_split 256 e4m3 0 1 1 decode
fa3k_bf16_d128_paged_causal 128 bf16 1 1 0 decode
fa3k_bf16_d128_paged_causal_split 128 bf16 1 1 1 decode
fa3k_bf16_d256_paged 256 bf16 0 1 0 decode
fa3k_bf16_d256_paged_split 256 bf16 0 1 1 decode
fa3k_e4m3_d256_paged_causal 256 e4m3 1 1 0 all
fa3k_e4m3_d256_paged_causal_split 256 e4m3 1 1 1 all
fa3k_e4m3_d128_paged 128 e4m3 0 1 0 all
fa3k_e4m3_d128_paged_split 128 e4m3 0 1 1 all
fa3k_bf16_d64_varlen 64 bf16 0 0 0 all
fa3k_bf16_d96_varlen 96 bf16 0 0 0 all
fa3k_bf16_d128_varlen 128 bf16 0 0 0 all
"

fetch() {  # fetch NAME GITDIR_OR_EMPTY URL COMMIT DEST PATHS...
    local name=$1 gitdir=$2 url=$3 commit=$4 dest=$5; shift 5
    if [ -f "$dest/.commit" ] && [ "$(cat "$dest/.commit")" = "$commit" ]; then return; fi
    rm -rf "$dest"; mkdir -p "$dest"
    if [ -z "$gitdir" ]; then
        gitdir="$SRC/$name.git"
        if [ ! -d "$gitdir" ]; then git init -q --bare "$gitdir"; fi
        git --git-dir="$gitdir" fetch -q --depth 1 --filter=blob:none "$url" "$commit"
    fi
    git --git-dir="$gitdir" archive "$commit" "$@" | tar -x -C "$dest"
    echo "$commit" > "$dest/.commit"
}

mkdir -p "$SRC" "$OUT"
fetch flash-attention "${FA3_GIT:-}" https://github.com/Dao-AILab/flash-attention.git "$FA3_COMMIT" "$SRC/fa" hopper LICENSE
pinned=$(git --git-dir="${FA3_GIT:-$SRC/flash-attention.git}" ls-tree "$FA3_COMMIT" csrc/cutlass | awk '{print $3}')
if [ "$pinned" != "$CUTLASS_COMMIT" ]; then echo "cutlass pin is $pinned, expected $CUTLASS_COMMIT" >&2; exit 1; fi
fetch cutlass "${CUTLASS_GIT:-}" https://github.com/NVIDIA/cutlass.git "$CUTLASS_COMMIT" "$SRC/cutlass" include LICENSE.txt

CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v "$NVCC")")")}
INC=(-I"$SRC/fa/hopper" -I"$SRC/cutlass/include" -I"$SRC/gen")
[ -d "$CUDA_HOME/include/cccl" ] && INC+=(-I"$CUDA_HOME/include/cccl")  # CUDA 13 moved CCCL here
# FA3's setup.py flags (with torch's CUDAExtension defaults: the -D__CUDA_NO_* set and
# --expt-relaxed-constexpr), minus -lineinfo (size); the DISABLE_* macros strip what is not built
FLAGS=(-O3 -std=c++17 --use_fast_math -Xcompiler -fPIC -gencode arch=compute_90a,code=sm_90a
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
       -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -diag-suppress 20013
       -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTLASS_DEBUG_TRACE_LEVEL=0 -DNDEBUG
       -DFLASHATTENTION_DISABLE_BACKWARD -DFLASHATTENTION_DISABLE_SOFTCAP
       -DFLASHATTENTION_DISABLE_LOCAL -DFLASHATTENTION_DISABLE_APPENDKV -DFLASHATTENTION_DISABLE_FP16
       -DFLASHATTENTION_DISABLE_CLUSTER -DFLASHATTENTION_DISABLE_SM8x -DFLASHATTENTION_DISABLE_HDIM192
       -DFLASHATTENTION_DISABLE_HDIMDIFF64 -DFLASHATTENTION_DISABLE_HDIMDIFF192)

mkdir -p "$SRC/gen" "$SRC/obj"
inc="$SRC/gen/fa3_kernels.inc.new"; : > "$inc"
objs=()
while read -r name hd dt causal paged split set; do
    [ -z "$name" ] && continue
    [ "${FA3_ONLY:-all}" = decode ] && [ "$set" != decode ] && continue
    # FA3_KERNEL(function, dtype 0 bf16 / 1 e4m3, head dim, causal, paged, split): fa3_capi.cu's table
    echo "FA3_KERNEL($name, $([ "$dt" = e4m3 ] && echo 1 || echo 0), $hd, $causal, $paged, $split)" >> "$inc"
    elem=$([ "$dt" = e4m3 ] && echo cutlass::float_e4m3_t || echo cutlass::bfloat16_t)
    b() { [ "$1" = 1 ] && echo true || echo false; }
    cu="$SRC/gen/$name.cu"
    cat > "$cu.new" <<EOF
// generated by benchmark/fa3_build/build.sh
#include "flash_fwd_launch_template.h"
void $name(Flash_fwd_params &params, cudaStream_t stream) {
    run_flash_fwd<90, $hd, $hd, 1, $elem, cutlass::bfloat16_t, $(b "$causal"), false, false, true,
                  $(b "$paged"), false, false, $(b "$paged"), $(b "$split"), false>(params, stream);
}
EOF
    cmp -s "$cu.new" "$cu" 2>/dev/null && rm "$cu.new" || mv "$cu.new" "$cu"
    objs+=("$SRC/obj/$name.o")
done <<< "$KERNELS"
cmp -s "$inc" "$SRC/gen/fa3_kernels.inc" 2>/dev/null && rm "$inc" || mv "$inc" "$SRC/gen/fa3_kernels.inc"

compile() {  # compile SRC OBJ: skipped when OBJ is newer than SRC and the flags are the same
    local src=$1 obj=$2 stamp="$2.flags" flags="${FLAGS[*]} ${INC[*]}"
    if [ -f "$obj" ] && [ "$obj" -nt "$src" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$flags" ]; then return; fi
    echo "[$(date +%T)] nvcc $(basename "$src")"
    local t0=$SECONDS
    nice -n "$NICE" "$NVCC" "${FLAGS[@]}" "${INC[@]}" -c "$src" -o "$obj"
    echo "$flags" > "$stamp"
    echo "[$(date +%T)]   done in $((SECONDS - t0)) s, $(du -k "$obj" | cut -f1) KiB"
}
for o in "${objs[@]}"; do n=$(basename "$o" .o); compile "$SRC/gen/$n.cu" "$o"; done
compile "$SRC/fa/hopper/flash_prepare_scheduler.cu" "$SRC/obj/flash_prepare_scheduler.o"
# the split-KV combine: bf16 out from fp32 partials, FA3's kBlockK 128 (every head dim > 64 built here)
printf '%s\n' '// generated by benchmark/fa3_build/build.sh' '#include "flash_fwd_combine_launch_template.h"' \
    'template void run_mha_fwd_combine_<cutlass::bfloat16_t, float, 128>(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);' \
    > "$SRC/gen/fa3_combine.cu.new"
cmp -s "$SRC/gen/fa3_combine.cu.new" "$SRC/gen/fa3_combine.cu" 2>/dev/null && rm "$SRC/gen/fa3_combine.cu.new" || mv "$SRC/gen/fa3_combine.cu.new" "$SRC/gen/fa3_combine.cu"
compile "$SRC/gen/fa3_combine.cu" "$SRC/obj/fa3_combine.o"
cp "$HERE/fa3_capi.cu" "$SRC/gen/fa3_capi.cu"
compile "$SRC/gen/fa3_capi.cu" "$SRC/obj/fa3_capi.o"
nice -n "$NICE" "$NVCC" -shared -gencode arch=compute_90a,code=sm_90a -o "$OUT/libfa3fwd.so" \
    "${objs[@]}" "$SRC/obj/flash_prepare_scheduler.o" "$SRC/obj/fa3_combine.o" "$SRC/obj/fa3_capi.o"
cp "$SRC/fa/LICENSE" "$OUT/LICENSE.flash-attention"
cp "$SRC/cutlass/LICENSE.txt" "$OUT/LICENSE.cutlass"
{
    echo "flash-attention $FA3_COMMIT (hopper/)"
    echo "cutlass $CUTLASS_COMMIT (include/)"
    echo "nvcc $("$NVCC" --version | grep -o 'V[0-9][0-9.]*' | head -1)"
    echo "kernels: $(awk -v only="${FA3_ONLY:-all}" 'NF && (only != "decode" || $7 == "decode") {print $1}' <<< "$KERNELS" | tr '\n' ' ')fa3_combine"
    echo "flags: ${FLAGS[*]}"
} > "$OUT/BUILD_INFO"
ls -l "$OUT/libfa3fwd.so"
