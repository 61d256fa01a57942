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
