#!/usr/bin/env bash
# The README's first command: a local control plane with fake GPU nodes, the operator, a
# sample deployment, and an example the preflight refuses.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
python="${PYTHON:-python3}"
bin="$(bash "$here/cluster/build-tools.sh" | tail -n 1)"
export PATH="$bin:$PATH" KUBECONFIG="$root/e2e/.run/kubeconfig"
ns=kimik3-demo
# shellcheck source=cluster/paths.sh
source "$here/cluster/paths.sh"
cd "$root"

bash "$here/cluster/up.sh"
kubectl apply --server-side --force-conflicts -f "$root/manifests/crd/" >/dev/null
established crd/kimik3deployments.serving.kimik3.io
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The demo brings its own two fake GPU nodes, tainted so that only the demo lands there and
# the demo never takes the end-to-end tests' nodes (`make test` may run while it is up).
"$python" "$here/cluster/nodes.py" --count 2 --prefix demo-gpu \
  --label kimik3.io/pool=demo --taint kimik3.io/pool=demo:NoSchedule | kubectl apply -f - >/dev/null

# KWOK pods have no network and made-up IPs: a fake vLLM leader on 127.0.0.1 stands in for
# the leaders' /metrics (e2e/support/vllm_exporter.py), and the operator's scrape is pointed at it.
if ! { [[ -f "$root/e2e/.run/exporter.pid" ]] && kill -0 "$(cat "$root/e2e/.run/exporter.pid")" 2>/dev/null; }; then
  nohup "$python" -m e2e.support.vllm_exporter --port 18090 > "$root/e2e/.run/exporter.log" 2>&1 < /dev/null &
  echo $! > "$root/e2e/.run/exporter.pid"
fi

# The operator runs as a host process here (KWOK runs no containers); in a cluster it is the
# Deployment of manifests/ or the Helm chart.
if ! { [[ -f "$root/e2e/.run/operator.pid" ]] && kill -0 "$(cat "$root/e2e/.run/operator.pid")" 2>/dev/null; }; then
  KIMIK3_NAMESPACES="$ns" KIMIK3_RESYNC_SECONDS=5 KIMIK3_HEALTH_ENDPOINT=http://127.0.0.1:18080/healthz \
    KIMIK3_SCRAPE_URL="http://127.0.0.1:18090/metrics" KIMIK3_SCRAPE_SECONDS=2 \
    KIMIK3_ACCEPTANCE_WINDOW_SECONDS=10 \
    KIMIK3_METRICS_PORT=18082 KIMIK3_METRICS_ADDRESS=127.0.0.1 \
    nohup "$python" -m kimik3_operator run > "$root/e2e/.run/operator.log" 2>&1 < /dev/null &
  echo $! > "$root/e2e/.run/operator.pid"
fi

# The sample uses the model cache: a volume for its claim (no provisioner runs here).
(cd "$root" && "$python" -m e2e.support.play_download volume "$ns" kimi-k3)

# The sample as it is, placed on the demo's nodes.
"$python" - "$root/examples/kimi-k3-text-dspark.yaml" <<'PY' | kubectl apply -n "$ns" -f -
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
placement = doc["spec"].setdefault("placement", {})
placement.setdefault("nodeSelector", {})["kimik3.io/pool"] = "demo"
placement["tolerations"] = [
    {"key": "kimik3.io/pool", "operator": "Equal", "value": "demo", "effect": "NoSchedule"}
]
print(yaml.safe_dump(doc))
PY
# The image probe runs first, as a CPU-only Job in the serving image. KWOK runs no
# container: play the probe's part with the report the real probe gave for vllm 0.33.0.
# A second run finds the probe's answer already recorded for this image (and its Job gone).
if [[ "$(kubectl get -n "$ns" kk3d/kimi-k3 -o jsonpath='{.status.capabilities.source}')" != Probe ]]; then
  "$python" "$here/support/play_probe.py" "$ns"
fi
# Then the weights: KWOK runs no container either, so the download's report is played into
# its finished pod (nothing is fetched). A second run finds the cache Ready already.
if [[ "$(kubectl get -n "$ns" kk3d/kimi-k3 -o jsonpath='{.status.modelCache.phase}')" != Ready ]]; then
  (cd "$root" && "$python" -m e2e.support.play_download play "$ns" kimi-k3)
fi
kubectl get -n "$ns" jobs
echo "waiting for kimi-k3 to become Available..."
kubectl wait -n "$ns" kk3d/kimi-k3 --for=condition=Available --timeout=180s
echo
kubectl get -n "$ns" kk3d,lws,pods -o wide
echo
kubectl get -n "$ns" kk3d/kimi-k3 -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'

echo
echo "waiting for the first acceptance window (10 s here, 5 min by default)..."
for _ in $(seq 1 30); do
  kubectl get -n "$ns" kk3d/kimi-k3 -o jsonpath='{.status.speculative.acceptanceRate}' | grep -q . && break
  sleep 1
done
"$python" -m kimik3_operator status kimi-k3 -n "$ns"

echo
echo "Now an example the preflight must refuse (vLLM 0.27.1 lacks SupportsEagle3 for the text-only class):"
kubectl apply -n "$ns" -f "$root/examples/kimi-k3-text-dspark-old-vllm.yaml"
kubectl wait -n "$ns" kk3d/kimi-k3-old --for=condition=CapabilitiesVerified=False --timeout=60s >/dev/null || true
kubectl get -n "$ns" kk3d/kimi-k3-old -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
echo "LeaderWorkerSets for kimi-k3-old: $(kubectl get -n "$ns" lws kimi-k3-old --no-headers 2>/dev/null | wc -l)"

cat <<MSG

The cluster stays up. Reach it with:
  export PATH=$bin:\$PATH KUBECONFIG=$root/e2e/.run/kubeconfig
  kubectl get kk3d -A
Tear it down (and stop the operator) with:
  make cluster-down
MSG
