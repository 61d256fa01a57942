#!/usr/bin/env bash
# Joins real node N (`node-up.sh N`, default 0) to the local control plane, beside the KWOK
# GPU nodes: its own containerd with runc, its own bridge network and pod subnet inside this
# machine (the host routes between the nodes' bridges), a locally built pause image and the
# kubelet built with the other binaries, under its own cgroup root. CPU only, labelled and
# tainted so only the pods meant for it land there. Needs root (namespaces, cgroups, a
# bridge); prints why and exits 3 where this machine cannot run it, so callers can go on
# without it.
#
# Settings: KIMIK3_REAL_NODE (auto | off), KIMIK3_REAL_NODE_SUBNET (10.213: node N has
# 10.213.N.0/24).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../cluster/paths.sh"
source "$here/runtime.env"
source "$here/node-paths.sh"
index="${1:-0}"
run="$run_dir"
state="$(node_state "$index")"
kubeconfig="$run/kubeconfig"
subnet="${KIMIK3_REAL_NODE_SUBNET:-10.213}.$index"
node_ip="$subnet.1"
node_name="$NODE_PREFIX$index"
bridge="$BRIDGE_PREFIX$index"
started=$(date +%s)

cannot() {
  echo "no real node: $*" >&2
  exit 3
}
[[ "${KIMIK3_REAL_NODE:-auto}" == off ]] && cannot "KIMIK3_REAL_NODE=off"
[[ "$(id -u)" == 0 ]] || cannot "the kubelet and containerd need root; run as root"
for tool in containerd runc ctr buildah ip; do
  command -v "$tool" >/dev/null || cannot "$tool is missing (scripts/install-deps.sh installs it)"
done
[[ -d /usr/lib/cni ]] || cannot "CNI plugins are missing (Debian: containernetworking-plugins)"
[[ -x "$bin/kubelet" ]] || cannot "no kubelet in $bin (make cluster-tools builds it)"
mkdir -p "$state"

k() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
running() { [[ -f "$run/$1-$index.pid" ]] && kill -0 "$(cat "$run/$1-$index.pid")" 2>/dev/null; }

# The bridge the pods attach to; its address is the node's (the kubelet refuses loopback).
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge
fi
# (Captured first: with pipefail, `ip ... | grep -q` fails whenever grep stops reading early.)
has_address() { [[ "$(ip addr show dev "$bridge")" == *"inet $1/"* ]]; }
has_address "$node_ip" || ip addr add "$node_ip/24" dev "$bridge"
ip link set "$bridge" up
# The API server's `kubernetes` endpoints advertise an address that node 0's bridge holds, so
# pods of every node reach the API server on this host there (directly, or through the
# `kubernetes` Service once kube-proxy runs).
if [[ "$index" == 0 ]]; then
  api_address="$(k get endpointslice -n default -l kubernetes.io/service-name=kubernetes \
    -o jsonpath='{.items[0].endpoints[0].addresses[0]}')"
  has_address "$api_address" || ip addr add "$api_address/32" dev "$bridge"
fi
mkdir -p "$state/cni"
cat > "$state/cni/10-kimik3.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "kimik3",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$state/cni-ipam",
        "ranges": [[{"subnet": "$subnet.0/24", "rangeStart": "$subnet.10", "gateway": "$node_ip"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
CNI

# containerd keeps its images under the cache, so an imported image outlives the cluster
# (scripts/prepare.sh may have put the vLLM image there already: e2e/runtime/preload.sh).
start_containerd "$index" || cannot "containerd exited"

# The pause image, from the static program beside this script.
KIMIK3_IMAGE_NODE="$index" bash "$here/images.sh" pause >&2

# Each node's pods live under a cgroup root of its own (node 0 under the machine's root, as a
# lone kubelet would), so one kubelet never sees the other's pods as its own to clean up.
cgroup_root=/
if [[ "$index" != 0 ]]; then
  cgroup_root="/kimik3-node-$index"
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    # cgroup v2: one tree; the kubelet's cgroups below need the controllers delegated.
    mkdir -p "/sys/fs/cgroup$cgroup_root"
    for controller in $(cat /sys/fs/cgroup/cgroup.subtree_control); do
      echo "+$controller" > "/sys/fs/cgroup$cgroup_root/cgroup.subtree_control" 2>/dev/null || true
    done
  else
    # cgroup v1: one hierarchy per controller, each mounted under /sys/fs/cgroup.
    for hierarchy in /sys/fs/cgroup/*/; do
      [[ -f "$hierarchy/cgroup.procs" ]] || continue
      mkdir -p "$hierarchy${cgroup_root#/}"
    done
    if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then
      cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset${cgroup_root}/cpuset.cpus"
      cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset${cgroup_root}/cpuset.mems"
    fi
  fi
fi

# The kubelet: cgroupfs (no systemd here), swap allowed, cgroup v1 allowed, and eviction
# thresholds low enough that a busy development disk does not evict the test pods.
cat > "$state/kubelet.yaml" <<KUBELET
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
address: $node_ip
port: 10250
healthzBindAddress: $node_ip
cgroupRoot: $cgroup_root
podLogsDir: $state/pod-logs
# The cluster's DNS (e2e/runtime/services-up.sh): CoreDNS behind the kube-dns Service.
clusterDNS: [$CLUSTER_DNS]
clusterDomain: cluster.local
readOnlyPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {}
# The API server here has no kubelet client certificate; the node listens only on the
# machine-internal bridge.
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "200Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# The GPU stand-in patched into capacity reaches allocatable at the next status update.
nodeStatusUpdateFrequency: 2s
resolvConf: /etc/resolv.conf
containerRuntimeEndpoint: unix://$state/containerd.sock
staticPodPath: ""
KUBELET
if ! running kubelet; then
  nohup "$bin/kubelet" --config "$state/kubelet.yaml" --kubeconfig "$kubeconfig" \
    --root-dir "$state/kubelet" --cert-dir "$state/kubelet-pki" \
    --hostname-override "$node_name" --node-ip "$node_ip" \
    --node-labels "$NODE_LABEL=true,$NODE_INDEX_LABEL=$index,kubernetes.io/os=linux" \
    --register-with-taints "$NODE_LABEL=true:NoSchedule" \
    > "$run/kubelet-$index.log" 2>&1 &
  echo $! > "$run/kubelet-$index.pid"
fi
for _ in $(seq 1 120); do
  [[ "$(k get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]] && break
  running kubelet || { tail -20 "$run/kubelet-$index.log" >&2; cannot "the kubelet exited; see $run/kubelet-$index.log"; }
  sleep 0.5
done
[[ "$(k get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] \
  || cannot "node $node_name did not become Ready; see $run/kubelet-$index.log"
# One GPU stand-in per node, advertised as an extended resource the way a device plugin
# advertises GPUs: a group of one-"GPU" pods lands one pod per node, as GPU pods do.
k patch node "$node_name" --subresource=status --type=merge \
  -p "{\"status\":{\"capacity\":{\"$GPU_STAND_IN\":\"1\"}}}" >/dev/null
# The kubelet carries it into allocatable, where the scheduler reads it, at its next update.
for _ in $(seq 1 60); do
  [[ -n "$(k get node "$node_name" -o jsonpath="{.status.allocatable['${GPU_STAND_IN//./\\.}']}")" ]] && break
  sleep 0.5
done
echo "real node $node_name ($node_ip) Ready in $(( $(date +%s) - started ))s" >&2
