#!/usr/bin/env bash
# Makes the Debian root filesystem that stands in for `python:3.11-slim-bookworm` here, where
# no registry is reachable: mmdebstrap from Debian's mirror, Python with pip, the machine's
# CA certificates (pip inside an image build goes through the same egress as the host) and
# no EXTERNALLY-MANAGED marker, so `pip install` behaves as in the official image.
# Cached by suite and package list; prints the tarball's path on its last line.
set -euo pipefail
suite=bookworm
packages=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,passwd,libnuma1
cache="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}/images"
key="$(printf '%s %s 2' "$suite" "$packages" | sha256sum | cut -c1-12)"
out="$cache/rootfs-$suite-$key.tar"
if [[ -f "$out" && -s "$out" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
started=$(date +%s)
mmdebstrap --variant=minbase --format=tar --include="$packages" \
  --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" 2>/dev/null || true' \
  --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
  --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  "$suite" "$out.tmp" http://deb.debian.org/debian >&2
mv "$out.tmp" "$out"
echo "root filesystem built in $(( $(date +%s) - started ))s" >&2
echo "$out"
