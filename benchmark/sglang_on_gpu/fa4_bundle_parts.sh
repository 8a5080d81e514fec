#!/usr/bin/env bash
# The FA4 bundle (.fa4, ~61 MiB) leaves ~140 KB of a device call's 64 MiB for the tree, so it can
# also travel in two parts, in two calls back to back on the warm machine (/tmp survives 30 s):
#   split:    bash benchmark/sglang_on_gpu/fa4_bundle_parts.sh split .fa4 [PREFIX]
#             -> PREFIX_ir (the 45 MiB MLIR library) and PREFIX_rest (the rest, ~16 MiB; hard links);
#             PREFIX defaults to .fa4 (a second DSL's bundle: split ~/.cache/fa4-bundle/...4.6.2... .fa4_462)
#   install:  bash benchmark/sglang_on_gpu/fa4_bundle_parts.sh install DIR
#             unpacks the parts found in DIR into /tmp/site (each once). Prints the PYTHONPATH when
#             every part is in; otherwise names the missing parts on stderr and exits 3.
set -euo pipefail
cmd=${1:?usage: fa4_bundle_parts.sh split BUNDLE_DIR | install DIR}; dir=${2:?missing directory}
case "$cmd" in
split)
  for f in site.tar.xz cu13_small.tar.xz cutlass_ir.so.xz cute_rt.so.xz; do
    [ -f "$dir/$f" ] || { echo "$dir/$f missing: build the bundle with make_fa4_bundle.sh" >&2; exit 2; }
  done
  p=${3:-.fa4}
  rm -rf "${p}_ir" "${p}_rest"; mkdir -p "${p}_ir" "${p}_rest"
  ln "$dir/cutlass_ir.so.xz" "${p}_ir/"
  ln "$dir/site.tar.xz" "$dir/cu13_small.tar.xz" "$dir/cute_rt.so.xz" "${p}_rest/"
  du -sh "${p}_ir" "${p}_rest" ;;
install)
  S=/tmp/site; B=$(cd "$dir" && pwd); mkdir -p $S/.parts
  IR=$S/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
  RT=$S/nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
  for f in site.tar.xz cu13_small.tar.xz cutlass_ir.so.xz cute_rt.so.xz; do
    [ -f "$B/$f" ] && [ ! -f "$S/.parts/$f" ] || continue
    case "$f" in
      *.tar.xz) tar -xJf "$B/$f" -C $S ;;
      cutlass_ir.so.xz) mkdir -p "$(dirname $IR)"; xz -dc "$B/$f" > "$IR" ;;
      cute_rt.so.xz) mkdir -p "$(dirname $RT)"; xz -dc "$B/$f" > "$RT" ;;
    esac
    touch "$S/.parts/$f"
  done
  missing=""
  for f in site.tar.xz cu13_small.tar.xz cutlass_ir.so.xz cute_rt.so.xz; do
    [ -f "$S/.parts/$f" ] || missing="$missing $f"
  done
  if [ -n "$missing" ]; then echo "FA4 bundle parts not yet on this machine:$missing" >&2; exit 3; fi
  touch $S/.done   # what .sgl/install.sh checks for
  echo "$S:$S/nvidia_cutlass_dsl/dsl_packages" ;;
*) echo "unknown command $cmd (split | install)" >&2; exit 2 ;;
esac
