#!/usr/bin/env bash
# On the GPU machine: unpack the SGLang bundle into /tmp/sgl (once per machine) and print the
# PYTHONPATH for one SGLang version: that version, the shared packages, this repository (with a
# dist-info so SGLang's plugin loader finds our sglang.srt.plugins entry point), then the FA4 bundle
# (/tmp/site, unpacked by .fa4/install.sh in an earlier call on the same machine).
# usage: bash .sgl/install.sh VERSION REPO_ROOT
set -euo pipefail
B=$(cd "$(dirname "$0")" && pwd); S=/tmp/sgl; V=$1; REPO=$2
mkdir -p "$S"
for name in common server "sglang-$V"; do
    [[ -f "$B/$name.tar.xz" ]] || continue  # server: only in bundles built for the server check
    if [[ ! -f "$S/$name/.done" ]]; then
        rm -rf "${S:?}/$name"; mkdir -p "$S/$name"
        tar -xJf "$B/$name.tar.xz" -C "$S/$name"
        touch "$S/$name/.done"
    fi
done
# the entry point, as pip install would record it (no build backend on that machine)
EP="$S/plugin/sglang_fa4-0.0.0.dist-info"
mkdir -p "$EP"
printf 'Metadata-Version: 2.1\nName: sglang-fa4\nVersion: 0.0.0\n' > "$EP/METADATA"
printf '[sglang.srt.plugins]\nsglang_fa4 = sglang_fa4.plugin:register\n' > "$EP/entry_points.txt"
[[ -f /tmp/site/.done ]] || { echo "install.sh: /tmp/site missing: run .fa4/install.sh in an earlier call" >&2; exit 3; }
[[ -d /tmp/site/tvm_ffi/include ]] || tar -xJf "$B/tvm_ffi_headers.tar.xz" -C /tmp/site
echo "$S/sglang-$V:$S/common:$S/server:$S/plugin:$REPO:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
