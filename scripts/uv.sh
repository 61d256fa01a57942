#!/usr/bin/env bash
# Installs (once per version) uv, the installer the venvs are filled with: it downloads and
# unpacks in parallel (the vllm 0.33.0 venv, 9 GB, in about half a minute where pip took ten
# minutes). Prints the uv binary's path on its last line.
set -euo pipefail
version="${UV_VERSION:-0.13.9}"
cache_root="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
home="$cache_root/tools/uv-$version"
if [[ ! -x "$home/bin/uv" ]]; then
  rm -rf "$home"
  python3 -m venv "$home"
  "$home/bin/python" -m pip install -q --disable-pip-version-check "uv==$version" >&2
fi
echo "$home/bin/uv"
