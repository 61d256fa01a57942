#!/usr/bin/env bash
# Builds every binary the real control plane needs from Go modules into a cache
# directory keyed by the versions; a second run with the same versions is a no-op.
# Prints the bin directory on its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/paths.sh"
stamp="$bin/.complete"

if [[ -f "$stamp" && -x "$bin/kubelet" && -x "$bin/kube-proxy" && -x "$coredns" \
  && -f "$manifests/.complete" ]]; then
  echo "cluster tools up to date in $bin" >&2
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
started=$(date +%s)

major_minor="${K8S_VERSION#v}"
major="${major_minor%%.*}"
minor="${major_minor#*.}"
minor="${minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=${major} -X $pkg.gitMinor=${minor}"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build_k8s() {
  local name="$1" pkg="$2"
  [[ -x "$bin/$name" ]] && return 0
  echo "building $name ($pkg)" >&2
  (cd "$here/k8s" && go build -trimpath -ldflags "$k8s_ldflags" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
}

build_k8s etcd go.etcd.io/etcd/server/v3
build_k8s kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build_k8s kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build_k8s kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build_k8s kubectl k8s.io/kubernetes/cmd/kubectl
# The one real node (e2e/runtime/node-up.sh) runs this kubelet beside the KWOK nodes.
build_k8s kubelet k8s.io/kubernetes/cmd/kubelet
# The real nodes' service proxy (e2e/runtime/services-up.sh).
build_k8s kube-proxy k8s.io/kubernetes/cmd/kube-proxy
# The cluster's DNS: CoreDNS with the plugins e2e/cluster/coredns/main.go names.
if [[ ! -x "$coredns" ]]; then
  echo "building coredns ($here/coredns)" >&2
  mkdir -p "$(dirname "$coredns")"
  (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$coredns.tmp" .)
  mv "$coredns.tmp" "$coredns"
fi

install_tool() {
  local name="$1" spec="$2" ldflags="${3:--s -w}"
  [[ -x "$bin/$name" ]] && return 0
  echo "building $name ($spec)" >&2
  local tmp
  tmp="$(mktemp -d)"
  GOBIN="$tmp" go install -trimpath -ldflags "$ldflags" "$spec"
  mv "$tmp"/* "$bin/$name"
  rmdir "$tmp"
}

install_tool kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
install_tool kwokctl "sigs.k8s.io/kwok/cmd/kwokctl@${KWOK_VERSION}"
install_tool helm "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}" \
  "-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}"
if [[ ! -x "$bin/lws-manager" ]]; then
  echo "building lws-manager (sigs.k8s.io/lws/cmd ${LWS_VERSION})" >&2
  (cd "$here/lws" && go build -trimpath -ldflags "-s -w" -o "$bin/lws-manager.tmp" sigs.k8s.io/lws/cmd)
  mv "$bin/lws-manager.tmp" "$bin/lws-manager"
fi

module_dir() {
  (cd "$here/k8s" && go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
}
# The LeaderWorkerSet CRD and webhook configuration come from the LWS module, the
# PodMonitor, ServiceMonitor and PrometheusRule CRDs from the Prometheus Operator's.
mkdir -p "$manifests"
lws_dir="$(module_dir "sigs.k8s.io/lws@${LWS_VERSION}")"
cp "$lws_dir"/config/crd/bases/*.yaml "$lws_dir/config/webhook/manifests.yaml" "$manifests/"
mv "$manifests/manifests.yaml" "$manifests/lws-webhooks.yaml"
promop_dir="$(module_dir "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}")"
for crd in podmonitors servicemonitors prometheusrules; do
  cp "$promop_dir/example/prometheus-operator-crd/monitoring.coreos.com_${crd}.yaml" "$manifests/"
done
chmod u+w "$manifests"/*.yaml
touch "$manifests/.complete"

touch "$stamp"
echo "cluster tools built in $(( $(date +%s) - started ))s into $bin" >&2
echo "$bin"
