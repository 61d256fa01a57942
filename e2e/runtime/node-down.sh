#!/usr/bin/env bash
# Stops every real node that node-up.sh started: each kubelet, every container it ran, its
# containerd and shims, and the mounts they left; the images stay cached in containerd's root.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../cluster/paths.sh"
source "$here/runtime.env"
source "$here/node-paths.sh"
stop() {
  local pidfile="$run_dir/$1.pid" pid
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  kill "$pid" 2>/dev/null && for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}
stop_node() {
  local index="$1" state sock task container
  state="$(node_state "$index")"
  stop "kubelet-$index"
  sock="$state/containerd.sock"
  if [[ -S "$sock" ]]; then
    for task in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
    sleep 0.5
    for task in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks rm -f "$task" >/dev/null 2>&1 || true
    done
    for container in $(ctr --address "$sock" -n k8s.io containers ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io containers rm "$container" >/dev/null 2>&1 || true
    done
  fi
  stop "containerd-$index"
  # Shims of this node's containerd outlive it; they carry its state directory's address.
  pkill -9 -f "containerd-shim.*-address $state/" 2>/dev/null || true
  { grep -o " $state[^ ]*" /proc/mounts || true; } | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null || true
  done
  { grep -o " $(node_images "$index")/root[^ ]*" /proc/mounts || true; } | sort -r \
    | while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
  ip link del "$BRIDGE_PREFIX$index" 2>/dev/null || true
  if [[ "$index" != 0 ]]; then
    for dir in /sys/fs/cgroup/kimik3-node-"$index" /sys/fs/cgroup/*/kimik3-node-"$index"; do
      [[ -d "$dir" ]] || continue
      find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
  fi
  echo "real node $NODE_PREFIX$index stopped" >&2
}
for index in $(started_nodes); do
  stop_node "$index"
done
