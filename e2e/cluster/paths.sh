# Sourced by the cluster scripts: versions and the cache paths keyed by them.
# shellcheck shell=bash
cluster_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$cluster_dir/versions.env"
cache_root="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
# Each component is built into a directory of its own, keyed by its version (and, for those
# built from a module here, that module's files), so a new version of one (LWS v0.10.0, say)
# rebuilds that one alone. Components that share their Kubernetes libraries at one version
# share a module and its directory (fleet: Kueue, the endpoint picker, the simulator), so each
# shared package is compiled once.
module_key() { cat "$cluster_dir/$1"/go.{mod,sum} | sha256sum | cut -c1-12; }
k8s_dir="$cache_root/tools/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}-$(module_key k8s)"
kwok_dir="$cache_root/tools/kwok-${KWOK_VERSION}"
helm_dir="$cache_root/tools/helm-${HELM_VERSION}"
lws_dir="$cache_root/tools/lws-${LWS_VERSION}-$(module_key lws)"
keda_dir="$cache_root/tools/keda-${KEDA_VERSION}-$(module_key keda)"
# Kueue, the picker, the tests' gateway stand-in and the simulator: one module (fleet/go.mod),
# keyed by it and the gateway's source.
fleet_key="$(cat "$cluster_dir"/fleet/{go.mod,go.sum,gateway/main.go} | sha256sum | cut -c1-12)"
fleet_dir="$cache_root/tools/fleet_kueue-${KUEUE_VERSION}_epp-${EPP_VERSION}_sim-${SIM_VERSION}-${fleet_key}"
kube_score_dir="$cache_root/tools/kube-score-${KUBE_SCORE_VERSION}"
promop_dir="$cache_root/tools/prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}-$(module_key promop)"
# The directory the scripts and tests use: hard links to every component's binaries, keyed by
# all their versions.
tools_key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_lws-${LWS_VERSION}_kueue-${KUEUE_VERSION}_keda-${KEDA_VERSION}_epp-${EPP_VERSION}-${fleet_key}_kube-score-${KUBE_SCORE_VERSION}_promop-${PROMETHEUS_OPERATOR_VERSION}_sim-${SIM_VERSION}"
bin="$cache_root/tools/$tools_key/bin"
# CoreDNS is keyed by its own module (version and plugins), so a change there does not
# rebuild the Kubernetes binaries.
coredns_key="$(cat "$cluster_dir"/coredns/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)"
coredns="$cache_root/tools/coredns-$coredns_key/coredns"
manifests="$cache_root/tools/manifests_lws-${LWS_VERSION}_promop-${PROMETHEUS_OPERATOR_VERSION}_kueue-${KUEUE_VERSION}_keda-${KEDA_VERSION}_epp-${EPP_VERSION}_gwapi-${GATEWAY_API_VERSION}"
run_dir="$(cd "$cluster_dir/../.." && pwd)/e2e/.run"

# Until a CRD is Established (KUBECONFIG and PATH as the caller has them): `kubectl wait`
# fails at once, instead of waiting, on a CRD the API server has not yet given conditions.
established() {
  local _
  for _ in $(seq 300); do
    if [[ "$(kubectl get "$1" -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" == True ]]; then
      return 0
    fi
    sleep 0.2
  done
  echo "$1 not Established in 60s" >&2
  return 1
}
