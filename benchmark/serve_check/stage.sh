#!/usr/bin/env bash
# Copy what the server check needs on the GPU machine into DEST (default: .dev_server in the
# checkout the device tool sends; git-ignored there): this checkout's sglang_fa4 + environ.yaml
# (the plugin the server loads: the SGLang bundle's entry point resolves sglang_fa4 from the repo
# path given to .sgl/install.sh, and the server runs with DEST as its working directory), the
# check's scripts, the CUDA-only stand-ins.
# usage: benchmark/serve_check/stage.sh [DEST]
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=${1:-.dev_server}
rm -rf "$DEST"
mkdir -p "$DEST/benchmark/sglang_on_gpu" "$DEST/benchmark/release"
cp -r "$SRC/sglang_fa4" "$SRC/environ.yaml" "$DEST/"
cp "$SRC/benchmark/release/check_server.py" "$DEST/benchmark/release/"
cp -r "$SRC/benchmark/serve_check" "$DEST/benchmark/"
cp "$SRC/benchmark/sglang_on_gpu/cuda_only_stubs.py" "$DEST/benchmark/sglang_on_gpu/"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$DEST"
