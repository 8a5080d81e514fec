#!/usr/bin/env bash
# Build the video-decoder bundle the server check carries to the GPU machine (which has no
# torchcodec, no decord and no package index): decord 0.6.0, the decoder SGLang's
# sglang/srt/utils/video_decoder.py falls back to when torchcodec is missing (both 0.5.20 and
# 0.5.23). Its wheel is py3-none-manylinux2010_x86_64 with FFmpeg 4.1's libraries inside
# (decord.libs/), so it runs under the machine's Python 3.12 without a system FFmpeg; torchcodec
# would need the system's FFmpeg libraries. Same decord for every SGLang version.
#
# usage: benchmark/serve_check/make_video_bundle.sh [OUT_DIR]   (default: .video, ignored by git)
# OUT_DIR/decord.tar.xz  the unpacked wheel, xz (~9.7 MiB; the wheel is 13.0 MiB)
# OUT_DIR/install.sh     on the GPU machine: unpack into /tmp/video (once), print that path
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=$(mkdir -p "${1:-.video}" && cd "${1:-.video}" && pwd)
CACHE=${SGLANG_BUNDLE_CACHE:-$HOME/.cache/sglang-gpu-bundle}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ ! -f "$CACHE/decord.tar.xz" ]]; then
    rm -rf "$CACHE/decord"; mkdir -p "$CACHE/decord"
    python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2010_x86_64 --target "$CACHE/decord" decord==0.6.0
    # decord's shared libraries are patched by auditwheel: `strip` would break them, keep them whole
    find "$CACHE/decord" -name __pycache__ -prune -exec rm -rf {} +
    tar -C "$CACHE/decord" -cf - . | xz -T0 -9 > "$CACHE/decord.tar.xz.part"
    mv "$CACHE/decord.tar.xz.part" "$CACHE/decord.tar.xz"
fi
cp "$CACHE/decord.tar.xz" "$OUT/"
cp "$here/video_install.sh" "$OUT/install.sh"
du -sh "$OUT"/*
