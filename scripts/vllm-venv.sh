#!/usr/bin/env bash
# Creates (once per version) a virtual environment with the real vllm package, used by the
# parser test tier and the probe tests. Prints the venv's python on its last line.
set -euo pipefail
version="${VLLM_VERSION:-0.33.0}"
cache_root="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
venv="$cache_root/vllm-$version"
if [[ -f "$venv/.complete" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
uv="$(bash "$(dirname "${BASH_SOURCE[0]}")/uv.sh")"
python3 -m venv "$venv"
"$uv" pip install -q --python "$venv/bin/python" "vllm==$version" >&2
touch "$venv/.complete"
echo "$venv/bin/python"
