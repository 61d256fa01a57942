# Sourced by the cluster scripts: versions and the cache paths keyed by them.
# shellcheck shell=bash
cluster_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$cluster_dir/versions.env"
cache_root="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
tools_key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_lws-${LWS_VERSION}"
bin="$cache_root/tools/$tools_key/bin"
# CoreDNS is keyed by its own module (version and plugins), so a change there does not
# rebuild the Kubernetes binaries.
coredns_key="$(cat "$cluster_dir"/coredns/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)"
coredns="$cache_root/tools/coredns-$coredns_key/coredns"
manifests="$cache_root/tools/manifests_lws-${LWS_VERSION}_promop-${PROMETHEUS_OPERATOR_VERSION}"
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
