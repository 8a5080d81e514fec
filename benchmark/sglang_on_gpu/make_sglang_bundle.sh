#!/usr/bin/env bash
# Build the bundle that puts the REAL SGLang (0.5.20 and 0.5.23, Python code) on the GPU machine,
# which has torch/transformers/triton but no package index and takes 64 MiB per call.
#
# usage: benchmark/sglang_on_gpu/make_sglang_bundle.sh [OUT_DIR]   (default: .sgl, ignored by git)
#
# OUT_DIR/common.tar.xz      cp312 wheels of what SGLang imports and the GPU image lacks (pinned as
#                            in tests/requirements-sglang.txt), unpacked
# OUT_DIR/server.tar.xz      the same for what only the server path imports (setproctitle, jsonschema,
#                            python-multipart, soundfile, ...)
# OUT_DIR/sglang-<v>.tar.xz  sglang <v> (sources and data, no cp311 extensions) + what <v> pins differently (as tests/setup_env.sh)
# OUT_DIR/tvm_ffi_headers.tar.xz  tvm_ffi's C headers, for SGLang's JIT kernels (nvcc on that machine)
# OUT_DIR/install.sh         on the GPU machine: unpack into /tmp/sgl, print the PYTHONPATH
#
# The FA4 bundle (.fa4, ~61 MiB) cannot travel in the same call: send it first (its install.sh
# unpacks into /tmp/site, which stays while the machine is warm), then this one; see README.md here.
# sgl_kernel / flashinfer (CUDA-only binaries, far too large to carry) are replaced at run time by
# cuda_only_stubs.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=$(mkdir -p "${1:-.sgl}" && cd "${1:-.sgl}" && pwd)
CACHE=${SGLANG_BUNDLE_CACHE:-$HOME/.cache/sglang-gpu-bundle}
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64)
export PIP_DISABLE_PIP_VERSION_CHECK=1

COMMON=(annotated-types==0.8.0 dill==0.4.1 distro==1.9.0 fastapi==0.165.0 gguf==0.19.0 loguru==0.7.3
        msgspec==0.23.0 opentelemetry-api==1.45.2 orjson==3.13.0 partial-json-parser==0.2.1.1.post7
        pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 pyzmq==27.3.0 starlette==1.10.0
        typing-inspection==0.4.5 uvicorn==0.54.0 sniffio==1.3.1 jiter==0.19.0 einops==0.8.2
        ipython==9.18.1 traitlets==5.16.1 jedi==0.20.1 parso==0.8.7 prompt-toolkit==3.0.53
        wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 stack-data==0.6.3 executing==2.3.0
        asttokens==3.0.2 pure-eval==0.2.4 matplotlib-inline==0.2.2 decorator==5.2.1
        ipython-pygments-lexers==1.1.1)
# What the SERVER path (benchmark/release/check_server.py: launch_server, its HTTP front end, tokenizer
# manager, scheduler, detokenizer) imports beyond the tower checks, and the GPU image lacks
# (uvloop, pillow, aiohttp, psutil, requests, prometheus-client are in the image):
SERVER=(setproctitle==1.3.8 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
        rpds-py==2026.9.1 python-multipart==0.0.34 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12)
declare -A PINNED=(
    [0.5.20]="sglang==0.5.20 transformers==5.12.1 tokenizers==0.22.2 openai==2.6.1 xgrammar==0.2.1 compressed-tensors==0.18.0"
    [0.5.23]="sglang==0.5.23 transformers==5.19.0 tokenizers==0.23.2 openai==2.8.0 xgrammar==0.2.7 compressed-tensors==0.18.0"
)

prune() {  # what the GPU machine never needs: bytecode, static libraries, cp311 extensions
    # (CUDA sources stay: SGLang JIT-compiles some kernels, e.g. rotary, with nvcc at first use)
    find "$1" -name __pycache__ -prune -exec rm -rf {} +
    find "$1" \( -name '*cpython-311*.so' -o -name '*.pyc' -o -name '*.a' \) -delete
}

pack() {  # pack NAME -- pip install args...
    local name=$1; shift 2
    if [[ ! -f "$CACHE/$name.tar.xz" ]]; then
        rm -rf "$CACHE/$name"; mkdir -p "$CACHE/$name"
        python3 -m pip install -q --no-deps --no-compile "${PLAT[@]}" --target "$CACHE/$name" "$@"
        prune "$CACHE/$name"
        tar -C "$CACHE/$name" -cf - . | xz -T0 -9 > "$CACHE/$name.tar.xz.part"
        mv "$CACHE/$name.tar.xz.part" "$CACHE/$name.tar.xz"
    fi
    cp "$CACHE/$name.tar.xz" "$OUT/"
}

mkdir -p "$CACHE"
pack common -- "${COMMON[@]}"
pack server -- "${SERVER[@]}"
for v in "${!PINNED[@]}"; do
    # sglang's wheel is cp311-only; its Python code is version-neutral, so take the wheel as is
    # (pip refuses it for 3.12) and unpack it beside the pinned packages
    if [[ ! -f "$CACHE/sglang-$v.tar.xz" ]]; then
        rm -rf "$CACHE/sglang-$v" "$CACHE/whl-$v"; mkdir -p "$CACHE/sglang-$v" "$CACHE/whl-$v"
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
            --platform manylinux_2_34_x86_64 -d "$CACHE/whl-$v" "sglang==$v"
        (cd "$CACHE/sglang-$v" && unzip -q "$CACHE"/whl-$v/sglang-*.whl)
        # shellcheck disable=SC2086
        python3 -m pip install -q --no-deps --no-compile "${PLAT[@]}" --target "$CACHE/sglang-$v" \
            $(echo ${PINNED[$v]} | tr ' ' '\n' | grep -v '^sglang==')
        prune "$CACHE/sglang-$v"
        tar -C "$CACHE/sglang-$v" -cf - . | xz -T0 -9 > "$CACHE/sglang-$v.tar.xz.part"
        mv "$CACHE/sglang-$v.tar.xz.part" "$CACHE/sglang-$v.tar.xz"
    fi
    cp "$CACHE/sglang-$v.tar.xz" "$OUT/"
done
# SGLang JIT-compiles some elementwise kernels (activations, rotary) with nvcc through tvm_ffi, which
# needs tvm_ffi's headers; the FA4 bundle drops them. Same tvm_ffi version as that bundle.
if [[ ! -f "$CACHE/tvm_ffi_headers.tar.xz" ]]; then
    rm -rf "$CACHE/tvm_ffi"; mkdir -p "$CACHE/tvm_ffi"
    python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$CACHE/tvm_ffi" apache-tvm-ffi==0.1.15.post2
    (cd "$CACHE/tvm_ffi" && unzip -q -o apache_tvm_ffi-*.whl 'tvm_ffi/include/*' 'tvm_ffi/3rdparty/dlpack/*' \
        && tar -cf - tvm_ffi | xz -9 > "$CACHE/tvm_ffi_headers.tar.xz")
fi
cp "$CACHE/tvm_ffi_headers.tar.xz" "$OUT/"
cp "$here/device_install.sh" "$OUT/install.sh"
du -sh "$OUT"/*
