#!/usr/bin/env bash
# A tiny import tree of SGLang's own Triton decode attention (its stage-1/2 kernels and the
# backend's split heuristic, get_num_kv_splits_triton), for the decode benchmark's triton_fp8
# column on the GPU machine without the whole SGLang bundle (.sgl, ~48 MiB).
#
# usage: make_triton_decode_bundle.sh [SGLANG_SITE] [OUT_DIR]
#   SGLANG_SITE: an installed SGLang (default .cache/sglang/0.5.23, what tests/setup_env.sh makes)
#   OUT_DIR:     default .sgl_decode (git-ignored); put it on PYTHONPATH there
# The two SGLang modules it imports beyond the kernels (sglang.srt.environ, sglang.srt.utils) are
# stand-ins with the values a CUDA machine gets: not HIP, static KV splits off (SGLang's default).
set -euo pipefail
SITE=${1:-.cache/sglang/0.5.23}
OUT=${2:-.sgl_decode}
rm -rf "$OUT"
mkdir -p "$OUT/sglang/srt" "$OUT/sglang/kernels/ops/attention"
for f in decode_attention.py metadata.py score_mod.py; do
  cp "$SITE/sglang/kernels/ops/attention/$f" "$OUT/sglang/kernels/ops/attention/$f"
done
for d in sglang sglang/srt sglang/kernels sglang/kernels/ops sglang/kernels/ops/attention; do touch "$OUT/$d/__init__.py"; done
cat > "$OUT/sglang/srt/utils.py" <<'PY'
# stand-in (benchmark bundle): what decode_attention.py imports, as on a CUDA machine
import torch


def is_hip():
    return False


def is_gfx95_supported():
    return False


def is_gfx1250_supported():
    return False


def get_device_core_count(device_id: int = 0) -> int:
    return torch.cuda.get_device_properties(device_id).multi_processor_count
PY
cat > "$OUT/sglang/srt/environ.py" <<'PY'
# stand-in (benchmark bundle): the variables decode_attention.py reads, at SGLang's defaults


class _Off:
    def get(self):
        return False


class _Envs:
    def __getattr__(self, name):
        return _Off()


envs = _Envs()
PY
echo "$OUT: $(du -sh "$OUT" | cut -f1)"
