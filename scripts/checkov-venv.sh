#!/usr/bin/env bash
# Creates (once per version) a virtual environment with checkov, the static analysis a
# platform team runs on manifests, apart from the project's venv (its many pins are its own).
# Prints the checkov command on its last line.
set -euo pipefail
version="${CHECKOV_VERSION:-3.3.30}"
cache_root="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
venv="$cache_root/checkov-$version"
if [[ ! -f "$venv/.complete" ]]; then
  rm -rf "$venv"
  uv="$(bash "$(dirname "${BASH_SOURCE[0]}")/uv.sh")"
  "$uv" venv -q -p python3.11 "$venv" >&2
  "$uv" pip install -q --python "$venv/bin/python" "checkov==$version" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/checkov"
