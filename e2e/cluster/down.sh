#!/usr/bin/env bash
# Stops every process cluster-up started (by PID) and removes its state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/paths.sh"
run="$run_dir"
export KWOK_WORKDIR="$run/kwok"
bash "$cluster_dir/../runtime/node-down.sh"
for pidfile in "$run"/*.pid; do
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  kill "$pid" 2>/dev/null && for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
done
# kube-proxy's rules stay in this machine's iptables until it is asked to remove them.
if [[ -f "$run/kube-proxy.yaml" && -x "$bin/kube-proxy" ]]; then
  "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
if [[ -x "$bin/kwokctl" ]]; then
  "$bin/kwokctl" delete cluster --name kimik3-e2e >&2 || true
fi
rm -rf "$run"
echo "control plane down" >&2
