#!/usr/bin/env bash
# `make test`: every tier, the cheapest first. The unit tests run before any build, so a red
# one fails the run within minutes; then the builds run side by side (scripts/prepare.sh), the
# control plane comes up, and the real tier's images build in the background while the vllm
# and KWOK tiers run side by side; the real tier starts once its images are built, and the
# KWOK tests that assert a time bound run last, alone. Every later tier runs even when an earlier one failed; the run fails if
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
# Side by side, each with its output kept until it is done: the vllm tier (no cluster, CPU
# bound) and the KWOK tier (it mostly waits on the control plane) from now, beside the image
# build; the real tier as soon as its images are built. The KWOK tests that assert a time
# bound run last, with nothing else running.
stamp "vllm and KWOK tiers, beside the image build"
"${pytest[@]}" -p no:cacheprovider -m vllm operator/tests > e2e/.run/vllm-tier.log 2>&1 &
vllm_tier=$!
KIMIK3_E2E_SESSION=kwok "${pytest[@]}" -p no:cacheprovider -m "kwok and not timing_sensitive" e2e \
  > e2e/.run/kwok-tier.log 2>&1 &
kwok_tier=$!
stamp "waiting for the real tier's images"
if bash e2e/runtime/prebuild.sh wait; then
  stamp "real-node tier"
  KIMIK3_E2E_SESSION=real "${pytest[@]}" -m real_node e2e || status=1
else
  status=1
fi
for tier in vllm kwok; do
  pid_var="${tier}_tier"
  wait "${!pid_var}" || status=1
  stamp "$tier tier done at +$(( $(stat -c %Y "e2e/.run/$tier-tier.log") - started ))s; its output"
  cat "e2e/.run/$tier-tier.log"
done
stamp "KWOK tier's time-bound tests"
KIMIK3_E2E_SESSION=kwok "${pytest[@]}" -m "kwok and timing_sensitive" e2e || status=1
finish "$status"
