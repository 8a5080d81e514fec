#!/usr/bin/env bash
# Build (or reuse) .cache/xc-venv from tests/requirements-xcompile.txt: the CPU-only environment in
# which tests/test_patch_kernel_xcompile.py cross-compiles SGLang's vendored FA4 kernel.
# Idempotent: a stamp holding the requirements' sha256 skips the work when nothing changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.cache/xc-venv"
req="$root/tests/requirements-xcompile.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
py="$(command -v python3.11 || true)"
if [[ -z "$py" ]]; then
    echo "setup_xcompile_env.sh: python3.11 is required (the pinned wheels are cp311)" >&2
    exit 1
fi
mkdir -p "$root/.cache"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
echo "$want" > "$stamp"
