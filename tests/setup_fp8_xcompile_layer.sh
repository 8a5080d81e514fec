#!/usr/bin/env bash
# Build (or reuse) .cache/cutlass-dsl-4.8.1 from tests/requirements-fp8-xcompile.txt: the CUTLASS DSL
# that tests/test_fp8_xcompile.py puts on PYTHONPATH to cross-compile the FP8 kernel for sm_90a.
# Idempotent: a stamp holding the requirements' sha256 skips the work when nothing changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
layer="$root/.cache/cutlass-dsl-4.8.1"
req="$root/tests/requirements-fp8-xcompile.txt"
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
