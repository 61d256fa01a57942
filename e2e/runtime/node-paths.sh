# Where real node N keeps its state and its images; sourced by the node scripts.
# shellcheck shell=bash
# node_state N: the node's run state (containerd's sockets, the kubelet's root, CNI).
node_state() { echo "$run_dir/node-$1"; }
# node_images N: containerd's root, in the cache so imported images outlive the cluster
# (node 0 keeps the directory it always had).
node_images() {
  if [[ "$1" == 0 ]]; then echo "$cache_root/containerd"; else echo "$cache_root/containerd-$1"; fi
}
# The indices of the real nodes started: one state directory each.
started_nodes() {
  local dir
  for dir in "$run_dir"/node-*/; do
    [[ -d "$dir" ]] && basename "$dir" | sed 's/^node-//'
  done
}
# containerd_config N: real node N's containerd settings (its images under the cache).
containerd_config() {
  local state images_root
  state="$(node_state "$1")"
  images_root="$(node_images "$1")"
  mkdir -p "$state" "$images_root"
  cat > "$state/containerd.toml" <<TOML
version = 2
root = "$images_root/root"
state = "$state/containerd-state"
[grpc]
  address = "$state/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Root here lacks CAP_SYS_RESOURCE: lowering a sandbox's oom_score_adj would fail it.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni"
TOML
}
# start_containerd N: real node N's containerd, unless it runs; waits for its socket.
# Returns 1 (its log's end on stderr) when it exits.
start_containerd() {
  local index="$1" state pidfile
  state="$(node_state "$index")"
  pidfile="$run_dir/containerd-$index.pid"
  containerd_config "$index"
  if ! { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
    nohup containerd --config "$state/containerd.toml" > "$run_dir/containerd-$index.log" 2>&1 &
    echo $! > "$pidfile"
  fi
  for _ in $(seq 1 50); do
    ctr --address "$state/containerd.sock" version >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { tail -20 "$run_dir/containerd-$index.log" >&2; return 1; }
    sleep 0.2
  done
  return 1
}
