#!/usr/bin/env bash
# The real tier's images, built in the background while the vLLM and KWOK tiers run:
# `prebuild.sh start` starts the build (once per run of the control plane) and returns;
# `prebuild.sh wait` waits for it, prints what it did and fails as it failed. The tests'
# own calls of images.sh wait on the same lock, so they never build an image twice.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../cluster/paths.sh"
source "$here/node-paths.sh"
log="$run_dir/prebuild.log"
rc="$run_dir/prebuild.rc"
pidfile="$run_dir/prebuild.pid"

case "${1:-}" in
  start)
    if [[ ! -d "$(node_state 0)" ]]; then
      echo "prebuild: no real node; the real tier says why" >&2
      exit 0
    fi
    if [[ -f "$rc" ]] || { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
      exit 0
    fi
    nodes="$(started_nodes | tr '\n' ' ')"
    nohup bash -c '
      set -uo pipefail
      here="$1"; shift
      status=0
      t0=$(date +%s)
      for node in "$@"; do
        images=(vllm-cpu)
        [[ "$node" == 0 ]] && images=(operator kubectl hub vllm-cpu)
        KIMIK3_IMAGE_NODE="$node" bash "$here/images.sh" "${images[@]}" || status=$?
      done
      echo "prebuild: done in $(( $(date +%s) - t0 ))s"
      exit "$status"
    ' prebuild "$here" $nodes > "$log" 2>&1 < /dev/null \
      && echo 0 > "$rc" || echo $? > "$rc" &
    echo $! > "$pidfile"
    echo "prebuild: building the real tier's images in the background (log: $log)" >&2
    ;;
  wait)
    [[ -f "$pidfile" || -f "$rc" ]] || exit 0
    # The background shell writes the result as its last act, so once it is gone the result
    # is there, unless it was killed.
    while [[ ! -f "$rc" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; do
      sleep 2
    done
    [[ -f "$rc" ]] || { echo "prebuild: the build stopped without a result" >&2; exit 1; }
    cat "$log" >&2
    exit "$(cat "$rc")"
    ;;
  *)
    echo "usage: prebuild.sh start|wait" >&2
    exit 2
    ;;
esac
