#!/usr/bin/env bash
# The shared make_fa4_bundle.sh always bundles quack-kernels 0.6.5, which needs nvidia-cutlass-dsl >= 4.7
# (it imports cutlass.base_dsl.enums): under SGLang 0.5.20-0.5.21's DSL 4.6.2 flash_attn.cute then fails
# to import (the first 4.6.2 prefill call on an H100, 2026-12-07). A user's install beside those SGLang
# versions gets SGLang's own pin, quack-kernels==0.6.4. This puts the installed SGLang's pin into a built
# bundle (its site/ and site.tar.xz) and says so; nothing changes when the bundle already has it.
#
# usage: fa4_bundle_pin_quack.sh BUNDLE_CACHE_DIR SGLANG_VERSION    (then re-split: fa4_bundle_parts.sh split)
set -euo pipefail
C=${1:?bundle cache dir (~/.cache/fa4-bundle/fa4-...)}; V=${2:?SGLang version}
META=$(dirname "$0")/../../.cache/sglang/$V/sglang-$V.dist-info/METADATA
[ -f "$META" ] || { echo "no $META: run tests/setup_env.sh first" >&2; exit 2; }
PIN=$(sed -n 's/^Requires-Dist: quack-kernels==\([0-9.]*\).*/\1/p' "$META")
[ -n "$PIN" ] || { echo "SGLang $V pins no quack-kernels version" >&2; exit 2; }
HAVE=$(ls -d "$C"/site/quack_kernels-*.dist-info | sed 's/.*quack_kernels-\(.*\)\.dist-info/\1/')
if [ "$HAVE" = "$PIN" ]; then echo "quack-kernels $PIN already in $C"; exit 0; fi
python3 -m pip download -q --no-deps -d "$C/whl" "quack-kernels==$PIN"
rm -rf "$C/site/quack" "$C"/site/quack_kernels-*.dist-info "$C"/whl/quack_kernels-"$HAVE"-*.whl
( cd "$C/site" && unzip -q -o "$C"/whl/quack_kernels-"$PIN"-*.whl )
( cd "$C/site" && tar -cf - . | xz -9e -T2 > "$C/site.tar.xz.new" ) && mv "$C/site.tar.xz.new" "$C/site.tar.xz"
echo "quack-kernels $HAVE -> $PIN (SGLang $V's pin) in $C"
