#!/usr/bin/env bash
# Build (or reuse) the CPU test environment:
#   .venv/                      Python 3.11 venv: tests/requirements-sglang.txt + this package (-e .[test])
#   .cache/wheels/              the upstream sglang wheels (pip download --no-deps), reused by other tests
#   .cache/sglang/<version>/    sglang <version> + its version-specific pins, pip --no-deps --target;
#                               tests/sglang_harness.py puts it first on PYTHONPATH of a .venv subprocess
# Idempotent: every step leaves a stamp holding the sha256 of its inputs and is skipped while that
# matches. Everything lands in ignored paths (.venv/, .cache/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Every release of the supported window (tests/sglang_harness.py's REGISTRATION_VERSIONS): the full
# suites run on 0.5.20 and 0.5.23, registration through the real loader on all four.
SGLANG_VERSIONS=(0.5.20 0.5.21 0.5.22 0.5.23)
# What each version pins differently (METADATA Requires-Dist), installed --no-deps beside it; their
# own dependencies are in tests/requirements-sglang.txt. compressed-tensors is the same in all but
# needs transformers, so it lives beside it.
declare -A SGLANG_TARGET_PKGS=(
    [0.5.20]="transformers==5.12.1 tokenizers==0.22.2 openai==2.6.1 xgrammar==0.2.1 compressed-tensors==0.18.0"
    [0.5.21]="transformers==5.12.1 tokenizers==0.22.2 openai==2.6.1 xgrammar==0.2.7 compressed-tensors==0.18.0"
    [0.5.22]="transformers==5.19.0 tokenizers==0.23.2 openai==2.6.1 xgrammar==0.2.7 compressed-tensors==0.18.0"
    [0.5.23]="transformers==5.19.0 tokenizers==0.23.2 openai==2.8.0 xgrammar==0.2.7 compressed-tensors==0.18.0"
)

venv="$root/.venv"
vpy="$venv/bin/python"
stamps="$venv/.sglang-fa4-stamps"
req="$root/tests/requirements-sglang.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[setup_env %4ss] %s\n' "$SECONDS" "$*"; }
sha() { sha256sum | cut -d' ' -f1; }
# pip, minus the machine's pip.conf noise about local index folders it lacks
pip_q() {
    "$vpy" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
}
stamp_ok() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }
changed=0

# 1. the venv (Python 3.11: the pinned binary wheels are cp311)
py="$(command -v python3.11 || true)"
if [[ -z "$py" ]]; then
    echo "setup_env.sh: python3.11 is required" >&2
    exit 1
fi
if [[ ! -x "$vpy" ]] || ! "$vpy" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
    log "creating .venv with $py"
    rm -rf "$venv"
    "$py" -m venv "$venv"
fi
mkdir -p "$stamps"

# Steps 2-3 (the venv's packages), 4-5 (the SGLang target dirs) and 6 (the two cross-compile
# environments) are independent of one another -- each is a pip install into its own directory,
# the target dirs with --no-deps -- so they run side by side (downloads and unpacking overlap); each
# writes its own log, shown if it fails.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

venv_packages() {
    # 2. the shared dependencies, torch 2.14.1 + torchvision 0.29.1 among them (one pip resolve)
    local want
    want="$(sha < "$req")"
    if ! stamp_ok "$stamps/requirements" "$want"; then
        log "installing tests/requirements-sglang.txt into .venv"
        pip_q install -q -r "$req"
        echo "$want" > "$stamps/requirements"
    fi
    # 3. this package, editable, so its sglang.srt.plugins entry point is visible to SGLang's loader
    want="$(cat pyproject.toml "$req" | sha)"
    if ! stamp_ok "$stamps/project" "$want"; then
        log "installing sglang-fa4 (-e .[test])"
        pip_q install -q -e '.[test]'
        echo "$want" > "$stamps/project"
    fi
}

sglang_targets() {
    # 4./5. per SGLang version: the wheel, then the target dir. --no-compile: a snippet imports a
    # fraction of SGLang, whose .pyc files Python writes on first import.
    local v wheel target pkgs want
    mkdir -p .cache/wheels .cache/sglang
    for v in "${SGLANG_VERSIONS[@]}"; do
        wheel="$(ls .cache/wheels/sglang-"$v"-*.whl 2>/dev/null | head -n1 || true)"
        if [[ -z "$wheel" ]]; then
            log "downloading the sglang $v wheel"
            pip_q download -q --no-deps --only-binary=:all: -d .cache/wheels "sglang==$v"
            wheel="$(ls .cache/wheels/sglang-"$v"-*.whl | head -n1)"
        fi
        target=".cache/sglang/$v"
        pkgs="${SGLANG_TARGET_PKGS[$v]}"
        want="$(printf '%s\n%s\n' "$(basename "$wheel")" "$pkgs" | sha)"
        if ! stamp_ok "$target/.sglang-fa4-stamp" "$want"; then
            log "installing sglang $v + $pkgs into $target"
            rm -rf "$target" "$target.tmp"
            # shellcheck disable=SC2086  # pkgs is a word list
            pip_q install -q --no-deps --no-compile --target "$target.tmp" "$wheel" $pkgs
            echo "$want" > "$target.tmp/.sglang-fa4-stamp"
            mv "$target.tmp" "$target"
        fi
    done
}

xcompile_envs() {
    # 6. what the cross-compile tests use (each script is idempotent, stamped): .cache/xc-venv
    # (tests/test_patch_kernel_xcompile.py), .cache/cutlass-dsl-4.8.1 (tests/test_fp8_xcompile.py)
    # and .cache/cutlass-dsl-{4.6.2,4.8.0} (tests/test_xcompile_dsl_versions.py).
    # Built here, beside the other installs, rather than serially inside pytest.
    local quiet='is ignored: it is neither a file nor a directory'  # as pip_q
    bash tests/setup_xcompile_env.sh 2>&1 | { grep -v "$quiet" || true; }
    bash tests/setup_pip_layer.sh cutlass-dsl-4.8.1 tests/requirements-fp8-xcompile.txt "$vpy" 2>&1 | { grep -v "$quiet" || true; }
    # the CUTLASS DSL each supported SGLang pins (0.5.20/0.5.21: 4.6.2, 0.5.22/0.5.23: 4.8.0), for
    # tests/test_xcompile_dsl_versions.py (~260 MB each)
    local dsl
    for dsl in 4.6.2 4.8.0; do
        bash tests/setup_pip_layer.sh "cutlass-dsl-$dsl" "tests/requirements-cutlass-dsl-$dsl.txt" "$vpy" 2>&1 | { grep -v "$quiet" || true; }
    done
    # flash-attn-4 b36 + quack (pure Python, ~12 MB) for tests/test_fa4_shared_libs_xcompile.py
    bash tests/setup_pip_layer.sh fa4-b36 tests/requirements-fa4-b36.txt "$vpy" 2>&1 | { grep -v "$quiet" || true; }
}

stamp_sum() { { cat "$stamps"/* .cache/sglang/*/.sglang-fa4-stamp 2>/dev/null || true; } | sha; }
before="$(stamp_sum)"
steps=(venv_packages sglang_targets xcompile_envs)
pids=()
for step in "${steps[@]}"; do
    "$step" > "$logs/$step.log" 2>&1 &
    pids+=("$!")
done
failed=0
for i in "${!steps[@]}"; do
    step="${steps[$i]}"
    if ! wait "${pids[$i]}"; then
        echo "setup_env.sh: $step failed:" >&2
        cat "$logs/$step.log" >&2
        failed=1
    else
        cat "$logs/$step.log"
    fi
done
[[ "$failed" == 0 ]] || exit 1
[[ "$(stamp_sum)" == "$before" ]] || changed=1

# after a change, a cheap check that the result is what the tests expect (a CUDA torch is fine:
# it runs on the CPU)
if [[ "$changed" == 1 ]]; then
"$vpy" - <<'EOF'
import importlib.metadata as md
import torch, torchvision  # noqa: F401
eps = [e.name for e in md.entry_points(group="sglang.srt.plugins")]
assert "sglang_fa4" in eps, f"sglang_fa4 entry point not installed: {eps}"
assert torch.__version__.split("+")[0] == "2.14.1", torch.__version__
EOF
fi
log "ready"
