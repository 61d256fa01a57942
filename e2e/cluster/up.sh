#!/usr/bin/env bash
# Starts (or reuses) the real control plane for the end-to-end tests and the demo:
# etcd, kube-apiserver, kube-controller-manager and kube-scheduler run by kwokctl's binary
# runtime from the binaries build-tools.sh made; KWOK fakes the GPU nodes' kubelets; the
# LeaderWorkerSet manager runs as a host process with its webhooks on 127.0.0.1.
# Leaves the kubeconfig at e2e/.run/kubeconfig.
#
# Settings: KIMIK3_E2E_NODES (4), KIMIK3_E2E_GPUS_PER_NODE (8), KIMIK3_E2E_DOMAINS (2).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/paths.sh"
bash "$here/build-tools.sh" >/dev/null
run="$run_dir"
cluster="kimik3-e2e"
kubeconfig="$run/kubeconfig"
lws_port="${KIMIK3_E2E_LWS_WEBHOOK_PORT:-19443}"
python="${PYTHON:-python3}"
export PATH="$bin:$PATH"
export KWOK_WORKDIR="$run/kwok"
mkdir -p "$run"
started=$(date +%s)

k() { kubectl --kubeconfig "$kubeconfig" "$@"; }

lws_running() {
  [[ -f "$run/lws.pid" ]] && kill -0 "$(cat "$run/lws.pid")" 2>/dev/null
}

if [[ -f "$kubeconfig" ]] && k get --raw /readyz >/dev/null 2>&1; then
  echo "control plane already up; reusing it" >&2
else
  kwokctl delete cluster --name "$cluster" >/dev/null 2>&1 || true
  # Audit only the benchmark's operator identity, so bench/scale.py can count the API
  # requests the operator makes (by verb and resource) from the API server's own record.
  # kwokctl v0.8.0 files a component's later --extra-args under the index of its first one in
  # the whole list: each component's first argument must come at its own position (the
  # first component's, here the API server's, may come again later). The HPA syncs every 5 s
  # for the autoscaling tests; the API server routes to an APIService's endpoints (KEDA's
  # adapter on this machine's address).
  cat > "$run/audit-policy.yaml" <<POLICY
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["system:serviceaccount:kimik3-bench:kimik3-operator"]
- level: None
POLICY
  kwokctl create cluster --name "$cluster" --runtime binary \
    --kube-audit-policy "$run/audit-policy.yaml" \
    --extra-args kube-apiserver=kubelet-preferred-address-types=InternalIP \
    --extra-args kube-controller-manager=horizontal-pod-autoscaler-sync-period=5s \
    --extra-args kwok-controller=manage-all-nodes=false \
    --extra-args kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --extra-args kube-apiserver=enable-aggregator-routing=true \
    --kube-apiserver-binary "$bin/kube-apiserver" \
    --kube-controller-manager-binary "$bin/kube-controller-manager" \
    --kube-scheduler-binary "$bin/kube-scheduler" \
    --kwok-controller-binary "$bin/kwok" \
    --etcd-binary "$bin/etcd" \
    --kubeconfig "" \
    --wait 120s >&2
  kwokctl get kubeconfig --name "$cluster" > "$kubeconfig"
fi

# Fake GPU nodes (idempotent: apply).
"$python" "$here/nodes.py" --count "${KIMIK3_E2E_NODES:-4}" \
  --gpus "${KIMIK3_E2E_GPUS_PER_NODE:-8}" --domains "${KIMIK3_E2E_DOMAINS:-2}" \
  | k apply -f - >&2

# CRDs: LeaderWorkerSet and the Prometheus Operator's monitors and rules.
for crd in "$manifests"/*_leaderworkersets.yaml "$manifests"/*_disaggregatedsets.yaml \
  "$manifests"/monitoring.coreos.com_*.yaml; do
  k apply --server-side --force-conflicts -f "$crd" >/dev/null
done
KUBECONFIG="$kubeconfig" established crd/leaderworkersets.leaderworkerset.x-k8s.io
# LeaderWorkerSet's manager (v0.9.0 on) runs the DisaggregatedSet controller beside its own.
KUBECONFIG="$kubeconfig" established crd/disaggregatedsets.disaggregatedset.x-k8s.io
KUBECONFIG="$kubeconfig" established crd/podmonitors.monitoring.coreos.com

# The LeaderWorkerSet manager with its webhooks served on 127.0.0.1.
if ! lws_running; then
  certs="$run/lws-certs"
  mkdir -p "$certs"
  if [[ ! -f "$certs/tls.crt" ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kimik3-e2e-ca" \
      -keyout "$certs/ca.key" -out "$certs/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
      -keyout "$certs/tls.key" -out "$certs/tls.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$certs/san.ext"
    openssl x509 -req -in "$certs/tls.csr" -CA "$certs/ca.crt" -CAkey "$certs/ca.key" \
      -CAcreateserial -days 3650 -extfile "$certs/san.ext" -out "$certs/tls.crt" 2>/dev/null
  fi
  cat > "$run/lws-config.yaml" <<CONFIG
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  port: ${lws_port}
  host: 127.0.0.1
  certDir: ${certs}
metrics:
  bindAddress: "127.0.0.1:0"
health:
  healthProbeBindAddress: "127.0.0.1:18081"
CONFIG
  KUBECONFIG="$kubeconfig" nohup "$bin/lws-manager" --config "$run/lws-config.yaml" \
    > "$run/lws.log" 2>&1 &
  echo $! > "$run/lws.pid"
  "$python" "$here/lws_webhooks.py" "$manifests/lws-webhooks.yaml" "$certs/ca.crt" "$lws_port" \
    | k apply -f - >&2
fi
for _ in $(seq 1 60); do
  curl -fsk "https://127.0.0.1:${lws_port}/" >/dev/null 2>&1 && break
  [[ "$(curl -sk -o /dev/null -w '%{http_code}' "https://127.0.0.1:${lws_port}/")" != "000" ]] && break
  lws_running || { echo "LWS manager exited; see $run/lws.log" >&2; tail -20 "$run/lws.log" >&2; exit 1; }
  sleep 1
done
for _ in $(seq 1 60); do
  [[ "$(k get nodes --no-headers 2>/dev/null | grep -c ' Ready')" -ge "${KIMIK3_E2E_NODES:-4}" ]] && break
  sleep 1
done
# Real nodes (containerd, runc, the kubelet; KIMIK3_REAL_NODES of them, 2 by default) beside
# the KWOK nodes, with kube-proxy and CoreDNS, where this machine can run them; the scripts
# say why not where they cannot (exit 3), and the KWOK cluster works without them.
source "$cluster_dir/../runtime/runtime.env"
for index in $(seq 0 $(( ${KIMIK3_REAL_NODES:-$REAL_NODES} - 1 ))); do
  bash "$cluster_dir/../runtime/node-up.sh" "$index" || { [[ $? == 3 ]] && break; }
done
if [[ -d "$run/node-0" ]]; then
  bash "$cluster_dir/../runtime/services-up.sh" || [[ $? == 3 ]]
fi
echo "control plane up in $(( $(date +%s) - started ))s; export KUBECONFIG=$kubeconfig" >&2
