#!/usr/bin/env bash
# The cluster services the real nodes' pods rely on: kube-proxy (iptables mode), which makes
# ClusterIP Services route, and CoreDNS with its kubernetes plugin behind the kube-dns
# Service, which the kubelets name as the cluster DNS. Both run as host processes beside the
# other control-plane processes: the real nodes share this machine's network namespace, so
# one kube-proxy programs the Services for both, as a DaemonSet would on each node. CoreDNS
# answers on node 0's bridge address, the kube-dns Service's one endpoint. Exits 3 with the
# reason where they cannot run (no root, no iptables), so callers go on without them.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../cluster/paths.sh"
source "$here/runtime.env"
run="$run_dir"
kubeconfig="$run/kubeconfig"
subnet="${KIMIK3_REAL_NODE_SUBNET:-10.213}"
dns_address="$subnet.0.1"
started=$(date +%s)

cannot() {
  echo "no cluster services: $*" >&2
  exit 3
}
[[ "$(id -u)" == 0 ]] || cannot "kube-proxy needs root"
command -v iptables-restore >/dev/null || cannot "iptables is missing (Debian: iptables)"
[[ -x "$bin/kube-proxy" && -x "$coredns" ]] || cannot "no kube-proxy or coredns (make cluster-tools)"
k() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
running() { [[ -f "$run/$1.pid" ]] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

if ! running kube-proxy; then
  # masqueradeAll: a Service's backend may share the client's bridge, where its answer would
  # otherwise go straight back to the client and miss the reverse translation.
  cat > "$run/kube-proxy.yaml" <<CONFIG
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $kubeconfig}
hostnameOverride: ${NODE_PREFIX}0
clusterCIDR: $subnet.0.0/16
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
CONFIG
  nohup "$bin/kube-proxy" --config "$run/kube-proxy.yaml" > "$run/kube-proxy.log" 2>&1 &
  echo $! > "$run/kube-proxy.pid"
fi

# The kube-dns Service in front of CoreDNS: no selector, one endpoint on this machine.
k apply -f - >/dev/null <<SERVICE
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $CLUSTER_DNS
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-coredns
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: kimik3-e2e}
addressType: IPv4
endpoints:
- addresses: ["$dns_address"]
  conditions: {ready: true}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
SERVICE

if ! running coredns; then
  cat > "$run/Corefile" <<COREFILE
.:53 {
    bind $dns_address
    errors
    health 127.0.0.1:18180
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 5
}
COREFILE
  nohup "$coredns" -conf "$run/Corefile" > "$run/coredns.log" 2>&1 &
  echo $! > "$run/coredns.pid"
fi
for _ in $(seq 1 60); do
  curl -fs http://127.0.0.1:18181/ready >/dev/null 2>&1 && curl -fs http://127.0.0.1:10256/healthz >/dev/null 2>&1 && break
  running coredns || { tail -20 "$run/coredns.log" >&2; cannot "coredns exited; see $run/coredns.log"; }
  running kube-proxy || { tail -20 "$run/kube-proxy.log" >&2; cannot "kube-proxy exited; see $run/kube-proxy.log"; }
  sleep 0.5
done
curl -fs http://127.0.0.1:18181/ready >/dev/null || cannot "coredns is not ready; see $run/coredns.log"
echo "kube-proxy and CoreDNS ($CLUSTER_DNS -> $dns_address) up in $(( $(date +%s) - started ))s" >&2
