#!/usr/bin/env bash
# Puts the vLLM image into the real nodes' containerd stores before the cluster exists, so a
# cold `make test` does not wait for it after the Go tools are built: scripts/prepare.sh runs
# this in its packages lane, beside the Go build. Each node's containerd is started on its
# own store (in the cache), the image streamed into all of them at once (images.sh), and
# containerd stopped again; node-up.sh later starts it on the same store, where the image
# is. Where this machine cannot run a real node, says so and leaves it to the real tier.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../cluster/paths.sh"
source "$here/runtime.env"
source "$here/node-paths.sh"
[[ "${KIMIK3_REAL_NODE:-auto}" == off ]] && { echo "preload: KIMIK3_REAL_NODE=off" >&2; exit 0; }
[[ "$(id -u)" == 0 ]] || { echo "preload: containerd needs root; left to the real tier" >&2; exit 0; }
command -v containerd >/dev/null || { echo "preload: no containerd; left to the real tier" >&2; exit 0; }
mkdir -p "$run_dir"
started=()
stop_started() {
  local index pidfile
  for index in "${started[@]}"; do
    pidfile="$run_dir/containerd-$index.pid"
    [[ -f "$pidfile" ]] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.2; done
    rm -f "$pidfile"
    # Its run state too (the images stay in the cache): a node directory means a node that
    # node-up.sh started, to the scripts after this one.
    rm -rf "$(node_state "$index")"
  done
}
trap stop_started EXIT
for index in $(seq 0 $(( ${KIMIK3_REAL_NODES:-$REAL_NODES} - 1 ))); do
  pidfile="$run_dir/containerd-$index.pid"
  # A node that runs already (a cluster that is up) keeps its containerd.
  if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    continue
  fi
  start_containerd "$index" || { echo "preload: node $index's containerd exited" >&2; exit 1; }
  started+=("$index")
done
KIMIK3_IMAGE_NODE=0 bash "$here/images.sh" vllm-cpu
for index in $(started_nodes); do
  [[ "$index" == 0 ]] || KIMIK3_IMAGE_NODE="$index" bash "$here/images.sh" vllm-cpu
done
