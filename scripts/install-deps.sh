#!/usr/bin/env bash
# Installs the Debian packages the suite calls when they are missing: openssl and curl for
# the control plane, prometheus and promtool for the observability tier, and for the one
# real node containerd, runc, the CNI plugins, buildah and mmdebstrap. `make test` runs
# this first, exactly as CI does; it needs root (or sudo) only when something is missing.
set -euo pipefail
missing=()
for tool in openssl curl make prometheus promtool containerd runc buildah mmdebstrap ip; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
((${#missing[@]})) || [[ ! -x /usr/lib/cni/bridge ]] || exit 0
packages=()
for tool in "${missing[@]}"; do
  case "$tool" in
    promtool) packages+=(prometheus) ;;
    ip) packages+=(iproute2) ;;
    *) packages+=("$tool") ;;
  esac
done
[[ -x /usr/lib/cni/bridge ]] || packages+=(containernetworking-plugins)
sudo=()
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || { echo "install as root: apt-get install ${packages[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
mapfile -t packages < <(printf "%s\n" "${packages[@]}" | sort -u)
echo "installing ${packages[*]} (Debian packages)" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
# The Debian package starts a Prometheus service; the tests run their own.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  "${sudo[@]}" systemctl stop prometheus || true
fi
