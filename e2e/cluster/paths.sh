# Sourced by the cluster scripts: versions and the cache paths keyed by them.
# shellcheck shell=bash
cluster_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$cluster_dir/versions.env"
cache_root="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
tools_key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_lws-${LWS_VERSION}"
bin="$cache_root/tools/$tools_key/bin"
manifests="$cache_root/tools/manifests_lws-${LWS_VERSION}_promop-${PROMETHEUS_OPERATOR_VERSION}"
run_dir="$(cd "$cluster_dir/../.." && pwd)/e2e/.run"
