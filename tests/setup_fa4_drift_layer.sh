#!/usr/bin/env bash
# Build (or reuse) .cache/fa4-drift from tests/requirements-fa4-drift.txt: an older flash-attn-4 that
# tests/test_fa4_version_drift.py runs sglang-fa4 against (with the CUTLASS DSL layer of
# tests/setup_fp8_xcompile_layer.sh). Idempotent: a stamp holding the requirements' sha256.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
layer="$root/.cache/fa4-drift"
req="$root/tests/requirements-fa4-drift.txt"
stamp="$layer/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
py="${1:-$root/.venv/bin/python}"
mkdir -p "$root/.cache"
rm -rf "$layer.tmp"
"$py" -m pip install --disable-pip-version-check -q --no-deps --target "$layer.tmp" -r "$req"
rm -rf "$layer"
mv "$layer.tmp" "$layer"
echo "$want" > "$stamp"
