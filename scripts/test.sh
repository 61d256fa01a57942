#!/usr/bin/env bash
# `make test`: every tier, the cheapest first. The unit tests run before any build, so a red
# one fails the run within minutes; then the builds run side by side (scripts/prepare.sh), the
# control plane comes up, and the real tier's images build in the background while the vllm
# and KWOK tiers run. Every later tier runs even when an earlier one failed; the run fails if
# any did. A run killed midway leaves e2e/.run/test.pid behind, and the next run starts by
# removing what it left (e2e/cluster/down.sh --if-killed).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="$root/.venv/bin/python"
pytest=("$py" -m pytest -q --durations=15)
started=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - started ))s" >&2; }

bash e2e/cluster/down.sh --if-killed || exit 1
mkdir -p e2e/.run
echo $$ > e2e/.run/test.pid
finish() {
  rm -f e2e/.run/test.pid
  stamp "make test done (status $1)"
  exit "$1"
}

stamp "unit tier"
"${pytest[@]}" -m "not vllm" operator/tests || finish 1
stamp "builds"
bash scripts/prepare.sh || finish 1
PYTHON="$py" bash e2e/cluster/up.sh || finish 1
bash e2e/runtime/prebuild.sh start || finish 1
status=0
stamp "vllm tier"
"${pytest[@]}" -m vllm operator/tests || status=1
stamp "KWOK tier"
"${pytest[@]}" -m kwok e2e || status=1
stamp "real-node tier (waiting for its images)"
if bash e2e/runtime/prebuild.sh wait; then
  "${pytest[@]}" -m real_node e2e || status=1
else
  status=1
fi
finish "$status"
