#!/usr/bin/env bash
# Joins one real node to the local control plane, beside the KWOK GPU nodes: containerd with
# runc, a bridge network inside this machine, a locally built pause image and the kubelet
# built with the other binaries. CPU only, labelled and tainted so only the pods meant for it
# land there. Needs root (namespaces, cgroups, a bridge); prints why and exits 3 where this
# machine cannot run it, so callers can go on without it.
#
# Settings: KIMIK3_REAL_NODE (auto | off), KIMIK3_REAL_NODE_SUBNET (10.213.0).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../cluster/paths.sh"
source "$here/runtime.env"
run="$run_dir"
state="$run/node"
kubeconfig="$run/kubeconfig"
subnet="${KIMIK3_REAL_NODE_SUBNET:-10.213.0}"
node_ip="$subnet.1"
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
running() { [[ -f "$run/$1.pid" ]] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

# The bridge the pods attach to; its address is the node's (the kubelet refuses loopback).
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
fi
# (Captured first: with pipefail, `ip ... | grep -q` fails whenever grep stops reading early.)
has_address() { [[ "$(ip addr show dev "$BRIDGE")" == *"inet $1/"* ]]; }
has_address "$node_ip" || ip addr add "$node_ip/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
# Pods reach the API server at the address its `kubernetes` endpoints advertise (no service
# proxy runs here): that address, held by the bridge, leads to the API server on this host.
api_address="$(k get endpointslice -n default -l kubernetes.io/service-name=kubernetes \
  -o jsonpath='{.items[0].endpoints[0].addresses[0]}')"
has_address "$api_address" || ip addr add "$api_address/32" dev "$BRIDGE"
mkdir -p "$state/cni"
cat > "$state/cni/10-kimik3.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "kimik3",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
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

# containerd keeps its images under the cache, so an imported image outlives the cluster.
images_root="$cache_root/containerd"
mkdir -p "$images_root"
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
if ! running containerd; then
  nohup containerd --config "$state/containerd.toml" > "$run/containerd.log" 2>&1 &
  echo $! > "$run/containerd.pid"
fi
for _ in $(seq 1 50); do
  ctr --address "$state/containerd.sock" version >/dev/null 2>&1 && break
  running containerd || { tail -20 "$run/containerd.log" >&2; cannot "containerd exited"; }
  sleep 0.2
done

# The pause image, from the static program beside this script.
bash "$here/images.sh" pause >&2

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
resolvConf: /etc/resolv.conf
containerRuntimeEndpoint: unix://$state/containerd.sock
staticPodPath: ""
KUBELET
if ! running kubelet; then
  nohup "$bin/kubelet" --config "$state/kubelet.yaml" --kubeconfig "$kubeconfig" \
    --root-dir "$state/kubelet" --cert-dir "$state/kubelet-pki" \
    --hostname-override "$NODE_NAME" --node-ip "$node_ip" \
    --node-labels "$NODE_LABEL=true,kubernetes.io/os=linux" \
    --register-with-taints "$NODE_LABEL=true:NoSchedule" \
    > "$run/kubelet.log" 2>&1 &
  echo $! > "$run/kubelet.pid"
fi
for _ in $(seq 1 120); do
  [[ "$(k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]] && break
  running kubelet || { tail -20 "$run/kubelet.log" >&2; cannot "the kubelet exited; see $run/kubelet.log"; }
  sleep 0.5
done
[[ "$(k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] \
  || cannot "node $NODE_NAME did not become Ready; see $run/kubelet.log"
echo "real node $NODE_NAME ($node_ip) Ready in $(( $(date +%s) - started ))s" >&2
