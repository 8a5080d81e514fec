#!/usr/bin/env bash
# Build (or reuse) .cache/LAYER: the pinned packages of REQUIREMENTS installed with --target, a
# directory tests put on PYTHONPATH beside the main venv. Idempotent: a stamp holding the
# requirements' sha256 skips the work when nothing changed.
#   tests/setup_pip_layer.sh cutlass-dsl-4.8.1 tests/requirements-fp8-xcompile.txt [PYTHON]
#       the CUTLASS DSL tests/test_fp8_xcompile.py cross-compiles the FP8 kernel with (sm_90a)
#   tests/setup_pip_layer.sh cutlass-dsl-4.6.2 tests/requirements-cutlass-dsl-4.6.2.txt [PYTHON]
#   tests/setup_pip_layer.sh cutlass-dsl-4.8.0 tests/requirements-cutlass-dsl-4.8.0.txt [PYTHON]
#       the CUTLASS DSL (and quack) SGLang 0.5.20/0.5.21 resp. 0.5.22/0.5.23 pin, for
#       tests/test_xcompile_dsl_versions.py
#   tests/setup_pip_layer.sh fa4-drift tests/requirements-fa4-drift.txt [PYTHON]
#       the older flash-attn-4 tests/test_fa4_version_drift.py runs sglang-fa4 against (with the
#       CUTLASS DSL layer above)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:?usage: setup_pip_layer.sh LAYER REQUIREMENTS [PYTHON]}"
layer="$root/.cache/$name"
req="$root/${2:?usage: setup_pip_layer.sh LAYER REQUIREMENTS [PYTHON]}"
stamp="$layer/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
py="${3:-$root/.venv/bin/python}"
mkdir -p "$root/.cache"
rm -rf "$layer.tmp"
"$py" -m pip install --disable-pip-version-check -q --no-deps --target "$layer.tmp" -r "$req"
rm -rf "$layer"
mv "$layer.tmp" "$layer"
echo "$want" > "$stamp"
