#!/usr/bin/env bash
# The Python sources of one vLLM release (no compiled kernels), from the wheel the capability
# table is generated from, for bench/differential.py to run over the 0.33.0 venv. Cached by
# version; prints the directory.
set -euo pipefail
version="${1:?usage: vllm-overlay.sh VERSION}"
cache="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
out="$cache/vllm-overlay-$version"
if [[ ! -d "$out/vllm" ]]; then
  wheels="$cache/wheels"
  mkdir -p "$wheels"
  wheel="$(ls "$wheels"/vllm-"$version"-*.whl 2>/dev/null | head -n 1 || true)"
  if [[ -z "$wheel" ]]; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "vllm==$version" >&2
    wheel="$(ls "$wheels"/vllm-"$version"-*.whl | head -n 1)"
  fi
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$out.tmp" && unzip -q "$wheel" 'vllm/*' -x '*.so' '*.cu' '*.cuh')
  mv "$out.tmp" "$out"
fi
echo "$out"
