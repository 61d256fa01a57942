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
python3 -m venv "$venv"
# uv where the versions pip resolved for this release are frozen (uv alone resolves cuda-python
# 12.6 beside cuda-bindings 13.5, and vLLM's model inspection then fails to import); pip for a
# release without a frozen set.
constraints="$(dirname "${BASH_SOURCE[0]}")/constraints/vllm-$version.txt"
if [[ -f "$constraints" ]]; then
  uv="$(bash "$(dirname "${BASH_SOURCE[0]}")/uv.sh")"
  "$uv" pip install -q --python "$venv/bin/python" -c "$constraints" "vllm==$version" >&2
else
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "vllm==$version" >&2
fi
touch "$venv/.complete"
echo "$venv/bin/python"
