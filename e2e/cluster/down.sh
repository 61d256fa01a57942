#!/usr/bin/env bash
# Stops every process cluster-up and the tests started and removes what they left on this
# machine, also after a run killed midway (when pid files, or the state directory itself,
# may be missing): the real nodes' containers, mounts, bridges, network namespaces and
# cgroups, kube-proxy's iptables rules, the control plane, and e2e/.run. The caches stay.
#
# `down.sh --if-killed`: only when an earlier `make test` was killed (its pid file is left and
# that process is gone); `make test` runs this first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/paths.sh"
source "$here/../runtime/runtime.env"
source "$here/../runtime/node-paths.sh"
run="$run_dir"
root="$(cd "$here/../.." && pwd)"
export KWOK_WORKDIR="$run/kwok"

if [[ "${1:-}" == --if-killed ]]; then
  [[ -f "$run/test.pid" ]] || exit 0
  if kill -0 "$(cat "$run/test.pid")" 2>/dev/null; then
    echo "another make test (pid $(cat "$run/test.pid")) is running in this checkout" >&2
    exit 1
  fi
  echo "an earlier make test was killed midway: removing what it left" >&2
fi

bash "$cluster_dir/../runtime/node-down.sh"
for pidfile in "$run"/*.pid; do
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  kill "$pid" 2>/dev/null && for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
done

# What no pid file names any more: processes whose command line names the run directory or
# the image scripts (the control plane, kubelets, containerd and its shims, Prometheus, the
# background image build), and processes that the tests started against the run's kubeconfig
# (the operator). This script and its callers are spared.
spared=" $$ "
ancestor=$PPID
while [[ "$ancestor" -gt 1 ]]; do
  spared+="$ancestor "
  ancestor="$(awk '{print $4}' "/proc/$ancestor/stat" 2>/dev/null || echo 1)"
done
leftovers() {
  local proc pid
  for proc in /proc/[0-9]*; do
    pid="${proc#/proc/}"
    [[ "$spared" == *" $pid "* ]] && continue
    if tr '\0' ' ' 2>/dev/null < "$proc/cmdline" \
      | grep -qF -e "$run/" -e "$root/e2e/runtime/images.sh" -e "$root/e2e/runtime/prebuild.sh"; then
      echo "$pid"
    elif tr '\0' '\n' 2>/dev/null < "$proc/environ" | grep -qxF "KUBECONFIG=$run/kubeconfig"; then
      echo "$pid"
    fi
  done
}
mapfile -t pids < <(leftovers)
if ((${#pids[@]})); then
  kill "${pids[@]}" 2>/dev/null || true
  sleep 1
  mapfile -t pids < <(leftovers)
  ((${#pids[@]} == 0)) || kill -9 "${pids[@]}" 2>/dev/null || true
fi

# The routing tests' model servers listen on KWOK pod IPs added to the loopback interface.
if command -v ip >/dev/null; then
  while read -r address; do
    [[ -n "$address" ]] && ip addr del "$address" dev lo 2>/dev/null || true
  done < <(ip -4 -o addr show dev lo label lo:kk3 2>/dev/null | awk '{print $4}')
fi

# kube-proxy's rules stay in this machine's iptables until it is asked to remove them.
if [[ -x "$bin/kube-proxy" ]] && command -v iptables >/dev/null \
  && iptables -t nat -S 2>/dev/null | grep -q KUBE-; then
  "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
# The kubelets' own chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT), and any
# KUBE- chain kube-proxy left, once no kubelet runs on this machine.
if ! pgrep -x kubelet >/dev/null; then
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null || continue
    for table in filter nat mangle; do
      # (Captured first: with pipefail, a grep that matches nothing would end the script.)
      rules="$("$tool" -t "$table" -S 2>/dev/null || true)"
      while read -r _ rule; do
        [[ -n "$rule" ]] || continue
        read -ra words <<< "$rule"
        "$tool" -t "$table" -D "${words[@]}" 2>/dev/null || true
      done < <(grep -- '^-A [A-Z]* .*-j KUBE-' <<< "$rules" | grep -v -- '^-A KUBE-' || true)
      chains="$(awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}' <<< "$rules")"
      for chain in $chains; do "$tool" -t "$table" -F "$chain" 2>/dev/null || true; done
      for chain in $chains; do "$tool" -t "$table" -X "$chain" 2>/dev/null || true; done
    done
  done
fi
if [[ -x "$bin/kwokctl" ]]; then
  "$bin/kwokctl" delete cluster --name kimik3-e2e >/dev/null 2>&1 || true
fi

# Mounts under the run directory and the nodes' containerd roots (overlay snapshots, the
# sandboxes' /dev/shm, kubelet volumes), innermost first.
for images_root in "$cache_root"/containerd*/root; do
  { grep -o " $run/[^ ]*\| $images_root/[^ ]*" /proc/mounts || true; } | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null || true
  done
done
{ grep -o " $run/[^ ]*" /proc/mounts || true; } | sort -r | while read -r mount; do
  umount -l "$mount" 2>/dev/null || true
done

if command -v ip >/dev/null; then
  # The nodes' bridges, and the pods' network namespaces no process holds any more (their
  # veth pairs go with them).
  for link in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep "^$BRIDGE_PREFIX" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  for netns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cni-' || true); do
    [[ -z "$(ip netns pids "$netns" 2>/dev/null)" ]] && ip netns delete "$netns" 2>/dev/null || true
  done
fi

# The pods' cgroups: node N's under /kimik3-node-N, node 0's under the machine's kubepods (only
# when no kubelet runs here any more), deepest first; a cgroup with a process in it stays.
cgroups=(/sys/fs/cgroup/kimik3-node-* /sys/fs/cgroup/*/kimik3-node-*)
pgrep -x kubelet >/dev/null || cgroups+=(/sys/fs/cgroup/kubepods* /sys/fs/cgroup/*/kubepods*)
for dir in "${cgroups[@]}"; do
  [[ -d "$dir" ]] || continue
  # Containers whose shim went with a killed containerd still run there.
  find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null && sleep 0.5 || true
  find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
done

# The certificate the Kueue tests put where Kueue reads its metrics certificate.
rm -f /etc/kueue/metrics/certs/tls.crt /etc/kueue/metrics/certs/tls.key
rmdir -p /etc/kueue/metrics/certs 2>/dev/null || true

rm -rf "$run"
echo "control plane down" >&2
