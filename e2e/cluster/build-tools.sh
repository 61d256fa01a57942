#!/usr/bin/env bash
# Builds every binary the real control plane needs from Go modules, each component into a
# cache directory keyed by its own version (paths.sh), and links them all into one bin
# directory; a second run with the same versions is a no-op. Prints the bin directory on its
# last line.
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

# The Kubernetes binaries and etcd in one `go build`: they share most of their packages, and
# the links run side by side.
k8s_binaries=(etcd:go.etcd.io/etcd/server/v3 kube-apiserver:k8s.io/kubernetes/cmd/kube-apiserver
  kube-controller-manager:k8s.io/kubernetes/cmd/kube-controller-manager
  kube-scheduler:k8s.io/kubernetes/cmd/kube-scheduler kubectl:k8s.io/kubernetes/cmd/kubectl
  kubelet:k8s.io/kubernetes/cmd/kubelet kube-proxy:k8s.io/kubernetes/cmd/kube-proxy)
build_k8s() {
  local entry name pkg packages=() names=() out
  for entry in "${k8s_binaries[@]}"; do
    name="${entry%%:*}" pkg="${entry#*:}"
    [[ -x "$k8s_dir/$name" ]] && continue
    packages+=("$pkg") names+=("$name")
  done
  ((${#packages[@]})) || return 0
  echo "building ${names[*]} (k8s.io/kubernetes ${K8S_VERSION}, etcd ${ETCD_VERSION})" >&2
  out="$(mktemp -d)"
  (cd "$here/k8s" && go build -trimpath -ldflags "$k8s_ldflags" -o "$out/" "${packages[@]}")
  # go names a main package by its last element before a major-version suffix.
  [[ -x "$out/server" ]] && mv "$out/server" "$out/etcd"
  mkdir -p "$k8s_dir"
  for name in "${names[@]}"; do mv "$out/$name" "$k8s_dir/$name"; done
  rm -rf "$out"
}

install_tool() {
  local dir="$1" name="$2" spec="$3" ldflags="${4:--s -w}"
  [[ -x "$dir/$name" ]] && return 0
  echo "building $name ($spec)" >&2
  local tmp
  tmp="$(mktemp -d)"
  GOBIN="$tmp" go install -trimpath -ldflags "$ldflags" "$spec"
  mkdir -p "$dir"
  mv "$tmp"/* "$dir/$name"
  rmdir "$tmp"
}

# Everything from the other modules: the KWOK tools, kube-score, helm, the LWS manager, Kueue,
# KEDA, the Prometheus Operator and CoreDNS with the plugins e2e/cluster/coredns/main.go names.
build_others() {
  install_tool "$kwok_dir" kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
  install_tool "$kwok_dir" kwokctl "sigs.k8s.io/kwok/cmd/kwokctl@${KWOK_VERSION}"
  install_tool "$kube_score_dir" kube-score \
    "github.com/zegl/kube-score/cmd/kube-score@${KUBE_SCORE_VERSION}"
  install_tool "$helm_dir" helm "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}" \
    "-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}"
  if [[ ! -x "$lws_dir/lws-manager" ]]; then
    echo "building lws-manager (sigs.k8s.io/lws/cmd ${LWS_VERSION})" >&2
    mkdir -p "$lws_dir"
    (cd "$here/lws" && go build -trimpath -ldflags "-s -w" -o "$lws_dir/lws-manager.tmp" sigs.k8s.io/lws/cmd)
    mv "$lws_dir/lws-manager.tmp" "$lws_dir/lws-manager"
  fi
  if [[ ! -x "$keda_dir/keda-operator" || ! -x "$keda_dir/keda-adapter" ]]; then
    echo "building keda-operator and keda-adapter (github.com/kedacore/keda/v2 ${KEDA_VERSION})" >&2
    local out
    out="$(mktemp -d)"
    # One build: the two commands share nearly every package (KEDA's scalers).
    (cd "$here/keda" && go build -trimpath -ldflags "-s -w" -o "$out/" \
      github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter)
    mkdir -p "$keda_dir"
    mv "$out/operator" "$keda_dir/keda-operator"
    mv "$out/adapter" "$keda_dir/keda-adapter"
    rm -rf "$out"
  fi
  if [[ ! -x "$fleet_dir/kueue" || ! -x "$fleet_dir/epp" || ! -x "$fleet_dir/epp-gateway" \
    || ! -x "$fleet_dir/llm-d-inference-sim" ]]; then
    echo "building kueue ${KUEUE_VERSION}, epp ${EPP_VERSION}, epp-gateway and llm-d-inference-sim" \
      "${SIM_VERSION} (e2e/cluster/fleet)" >&2
    local built
    built="$(mktemp -d)"
    # One build of one module: the four commands share client-go, controller-runtime, gRPC
    # and the rest at one version each.
    (cd "$here/fleet" && go build -trimpath -ldflags "-s -w" -o "$built/" \
      sigs.k8s.io/kueue/cmd/kueue sigs.k8s.io/gateway-api-inference-extension/cmd/epp ./gateway \
      github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim)
    mkdir -p "$fleet_dir"
    mv "$built/kueue" "$built/epp" "$built/llm-d-inference-sim" "$fleet_dir/"
    mv "$built/gateway" "$fleet_dir/epp-gateway"
    rm -rf "$built"
  fi
  if [[ ! -x "$promop_dir/prometheus-operator" ]]; then
    echo "building prometheus-operator (cmd/operator ${PROMETHEUS_OPERATOR_VERSION})" >&2
    mkdir -p "$promop_dir"
    (cd "$here/promop" && go build -trimpath -ldflags "-s -w" -o "$promop_dir/prometheus-operator.tmp" \
      github.com/prometheus-operator/prometheus-operator/cmd/operator)
    mv "$promop_dir/prometheus-operator.tmp" "$promop_dir/prometheus-operator"
  fi
  if [[ ! -x "$coredns" ]]; then
    echo "building coredns ($here/coredns)" >&2
    mkdir -p "$(dirname "$coredns")"
    (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$coredns.tmp" .)
    mv "$coredns.tmp" "$coredns"
  fi
}

# The two groups side by side: one's module downloads and links overlap the other's compiles.
build_k8s & k8s_pid=$!
build_others & others_pid=$!
failed=0
wait "$k8s_pid" || failed=1
wait "$others_pid" || failed=1
((failed == 0)) || { echo "cluster tools: a build failed (above)" >&2; exit 1; }
for dir in "$k8s_dir" "$kwok_dir" "$helm_dir" "$lws_dir" "$fleet_dir" "$keda_dir" \
  "$kube_score_dir" "$promop_dir"; do
  ln -f "$dir"/* "$bin/"
done

module_dir() {
  (cd "$here/k8s" && go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
}
# The LeaderWorkerSet CRD and webhook configuration come from the LWS module, the
# CRDs, PodMonitor and ServiceMonitor among them, from the Prometheus Operator's.
mkdir -p "$manifests"
lws_module="$(module_dir "sigs.k8s.io/lws@${LWS_VERSION}")"
cp "$lws_module"/config/crd/bases/*.yaml "$lws_module/config/webhook/manifests.yaml" "$manifests/"
mv "$manifests/manifests.yaml" "$manifests/lws-webhooks.yaml"
# Kueue's CRDs and webhook configuration from its module (the fleet module resolves it).
kueue_module="$(cd "$here/fleet" && go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
mkdir -p "$manifests/kueue"
cp "$kueue_module"/config/components/crd/bases/*.yaml "$manifests/kueue/"
cp "$kueue_module/config/components/webhook/manifests.yaml" "$manifests/kueue-webhooks.yaml"
chmod u+w "$manifests/kueue"/*.yaml
# KEDA's CRDs from its module.
keda_module="$(cd "$here/keda" && go mod download -json "github.com/kedacore/keda/v2@${KEDA_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
mkdir -p "$manifests/keda"
cp "$keda_module"/config/crd/bases/*.yaml "$manifests/keda/"
chmod u+w "$manifests/keda"/*.yaml
# The Inference Extension's CRDs (InferencePool v1, and the x-k8s kinds its picker watches)
# from its module; the Gateway API's HTTPRoute CRD from its own (downloaded, not built).
epp_module="$(cd "$here/fleet" && go mod download -json "sigs.k8s.io/gateway-api-inference-extension@${EPP_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
mkdir -p "$manifests/epp"
cp "$epp_module"/config/crd/bases/*.yaml "$manifests/epp/"
gwapi_module="$(cd "$here/fleet" && go mod download -json "sigs.k8s.io/gateway-api@${GATEWAY_API_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
cp "$gwapi_module/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml" "$manifests/epp/"
chmod u+w "$manifests/epp"/*.yaml
promop_module="$(module_dir "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}")"
# All of them: the Prometheus Operator's controllers wait for every kind they watch.
cp "$promop_module"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$manifests/"
chmod u+w "$manifests"/*.yaml
touch "$manifests/.complete"

touch "$stamp"
echo "cluster tools built in $(( $(date +%s) - started ))s into $bin" >&2
echo "$bin"
