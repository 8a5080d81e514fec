#!/usr/bin/env bash
# On the GPU machine (copied to .video/install.sh by make_video_bundle.sh): unpack decord into
# /tmp/video once and print that path (for the server's PYTHONPATH). /tmp stays while the machine
# is warm, so .video may travel in an earlier call than the server check's; this script, or
# check_server.py's --video-bundle, then finds /tmp/video already there.
# usage: bash .video/install.sh
set -euo pipefail
B=$(cd "$(dirname "$0")" && pwd); S=/tmp/video
if [[ ! -f "$S/.done" ]]; then
    [[ -f "$B/decord.tar.xz" ]] || { echo "video install.sh: $B/decord.tar.xz missing" >&2; exit 3; }
    rm -rf "$S"; mkdir -p "$S"
    tar -xJf "$B/decord.tar.xz" -C "$S"
    touch "$S/.done"
fi
echo "$S"
