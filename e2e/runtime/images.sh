#!/usr/bin/env bash
# Builds the test cluster's images without a registry and loads them into a real node's
# containerd: `images.sh pause|operator|hub|kubectl|vllm-cpu ...` (node 0, or the node
# KIMIK3_IMAGE_NODE names). Each is built by buildah from local inputs
# only (the pause program, a Debian root filesystem from mmdebstrap standing in for the
# official Python base, the operator's Dockerfile) and cached as an archive keyed by a hash
# of its inputs, so a warm run only imports. Prints one line per image with its timings.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$here/../cluster/paths.sh"
source "$here/runtime.env"
source "$here/node-paths.sh"
node="${KIMIK3_IMAGE_NODE:-0}"
# Images are built into node 0 and copied from there to another node.
home_sock="$(node_state 0)/containerd.sock"
sock="$(node_state "$node")/containerd.sock"
archives="$cache_root/images"
mkdir -p "$archives"
# One build or import at a time: a test asking for an image that the background build
# (prebuild.sh) is still making waits for it instead of making it a second time. Taken only
# when something is to be done (an image already loaded is answered at once), and each step
# checks again once it holds it.
lock() {
  [[ -n "${locked:-}" ]] && return 0
  exec 9>"$archives/.lock"
  flock 9
  locked=1
}

inputs_key() { cat "$@" | sha256sum | cut -c1-16; }

# The operator image's key: every file its build context copies, and the base's recipe.
tree_key() {
  (cd "$root" && find "$@" -type f -not -path '*/__pycache__/*' -not -path '*/tests/*' | sort \
    | xargs sha256sum; sha256sum "$here/base-rootfs.sh") | sha256sum | cut -c1-16
}

# (Listed first: with pipefail, `ctr ... | grep -q` fails whenever grep stops reading early,
# and an image already loaded would be built again.)
loaded() {
  local refs
  refs="$(ctr --address "${2:-$sock}" -n k8s.io images ls -q 2>/dev/null)" || return 1
  grep -qx "$1" <<< "$refs"
}

load() {
  local ref="$1" archive="$2" t0
  t0=$(date +%s%N)
  loaded "$ref" || { lock; loaded "$ref"; } \
    || ctr --address "$sock" -n k8s.io images import --no-unpack "$archive" >/dev/null
  echo "$ref: loaded in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}

python_base() {
  local rootfs
  rootfs="$(bash "$here/base-rootfs.sh")"
  if ! buildah inspect --type image "$PYTHON_BASE" >/dev/null 2>&1; then
    local c
    c=$(buildah from scratch)
    buildah add "$c" "$rootfs" / >/dev/null
    buildah config --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env LANG=C.UTF-8 --env PIP_NO_CACHE_DIR=1 --cmd python3 "$c"
    buildah commit --rm -q "$c" "$PYTHON_BASE" >/dev/null
  fi
}

build() {
  local name="$1" ref="$2" key="$3" archive t0
  archive="$archives/$name-$key.tar"
  t0=$(date +%s)
  [[ -s "$archive" ]] || lock
  if [[ ! -s "$archive" ]]; then
    "build_$name" "$ref"
    rm -f "$archive.tmp" "$archives/$name"-*.tar
    buildah push -q "$ref" "docker-archive:$archive.tmp:$ref" >/dev/null
    mv "$archive.tmp" "$archive"
    echo "$ref: built in $(( $(date +%s) - t0 ))s" >&2
  fi
  load "$ref" "$archive"
}

build_pause() {
  local out c
  out="$(mktemp -d)"
  (cd "$here/pause" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" -o "$out/pause" .)
  c=$(buildah from scratch)
  buildah copy "$c" "$out/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit --rm -q "$c" "$1" >/dev/null
  rm -rf "$out"
}

# The chart's `helm test` image stood in for by the kubectl built with the cluster's tools
# (a static binary, like the upstream image's, and no shell).
build_kubectl() {
  local c
  c=$(buildah from scratch)
  buildah copy "$c" "$bin/kubectl" /usr/local/bin/kubectl >/dev/null
  buildah config --env PATH=/usr/local/bin --entrypoint '["kubectl"]' --user 10001:10001 "$c"
  buildah commit --rm -q "$c" "$1" >/dev/null
}

build_operator() {
  python_base
  buildah bud -q --pull-never --isolation chroot --network host --layers=false \
    -f "$root/images/operator/Dockerfile" -t "$1" "$root" >/dev/null
}

build_hub() {
  python_base
  local c
  c=$(buildah from --pull-never "$PYTHON_BASE")
  buildah run --isolation chroot --network host "$c" -- \
    pip install -q --no-cache-dir "huggingface_hub==$HUGGINGFACE_HUB_VERSION" >/dev/null
  buildah commit --rm -q "$c" "$1" >/dev/null
}

# The vLLM image: a cached virtual environment's packages on the local Python base, with a
# `vllm` command: vllm-cpu, for serving and for the probe on the real nodes. Written as a
# docker archive straight into containerd (stream_image.py), whose root is in the cache:
# buildah would copy the packages three times over first.
build_vllm() {
  local ref="$1" venv_script="$2" t0 venv site key stamp
  t0=$(date +%s)
  key="$(inputs_key "$here/stream_image.py" "$root/scripts/$venv_script" "$here/base-rootfs.sh")"
  stamp="$archives/$(echo "$ref" | tr '/:' '__').key"
  local build_now=""
  current() { loaded "$ref" "$home_sock" && [[ "$(cat "$stamp" 2>/dev/null)" == "$key" ]]; }
  current || { lock; current; } || build_now=1
  if [[ -z "${build_now:-}" ]]; then
    echo "$ref: already in containerd"
  else
    ctr --address "$home_sock" -n k8s.io images rm "$ref" >/dev/null 2>&1 || true
    venv="$(bash "$root/scripts/$venv_script" | tail -1)"
    site="$("$venv" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # Every module byte-compiled into the venv (once: later runs find them current), so the
    # image carries them (stream_image.py). A source that is not Python 3.11 (torch's tests of
    # 3.12 syntax) is never imported and fails only its own file, hence the status ignored.
    "$venv" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
    # The same stream goes into every other running node's containerd at once, instead of a
    # copy from node 0's afterwards.
    local other fifos=() importers=() others=()
    for other in $(started_nodes); do
      [[ "$other" == 0 || ! -S "$(node_state "$other")/containerd.sock" ]] && continue
      ctr --address "$(node_state "$other")/containerd.sock" -n k8s.io images rm "$ref" \
        >/dev/null 2>&1 || true
      fifos+=("$(mktemp -u)")
      mkfifo "${fifos[-1]}"
      ctr --address "$(node_state "$other")/containerd.sock" -n k8s.io images import - \
        < "${fifos[-1]}" >/dev/null &
      importers+=($!) others+=("$other")
    done
    python3 "$here/stream_image.py" "$ref" "$(bash "$here/base-rootfs.sh")" "$site" "$archives" \
      | tee "${fifos[@]}" | ctr --address "$home_sock" -n k8s.io images import - >/dev/null
    local index
    for index in "${!importers[@]}"; do
      wait "${importers[$index]}"
      echo "$key" > "$stamp.node-${others[$index]}"
    done
    rm -f "${fifos[@]}"
    echo "$key" > "$stamp"
    echo "$ref: built and loaded in $(( $(date +%s) - t0 ))s (into nodes 0 ${others[*]})"
  fi
  [[ "$node" == 0 ]] && return 0
  # Another node: the image as node 0 holds it, exported into this node's containerd.
  local node_stamp="$stamp.node-$node"
  t0=$(date +%s)
  copied() { loaded "$ref" && [[ "$(cat "$node_stamp" 2>/dev/null)" == "$key" ]]; }
  if copied || { lock; copied; }; then
    echo "$ref: already in node $node's containerd"
    return 0
  fi
  ctr --address "$sock" -n k8s.io images rm "$ref" >/dev/null 2>&1 || true
  ctr --address "$home_sock" -n k8s.io images export - "$ref" \
    | ctr --address "$sock" -n k8s.io images import - >/dev/null
  echo "$key" > "$node_stamp"
  echo "$ref: copied to node $node in $(( $(date +%s) - t0 ))s"
}

for image in "$@"; do
  case "$image" in
    pause) build pause "$PAUSE_IMAGE" "$(inputs_key "$here/pause/main.go" "$here/pause/go.mod")" ;;
    operator)
      build operator "$OPERATOR_IMAGE" "$(tree_key images/operator pyproject.toml README.md operator/kimik3_operator)"
      ;;
    vllm-cpu) build_vllm "$VLLM_CPU_IMAGE" vllm-cpu-venv.sh ;;
    kubectl) build kubectl "$KUBECTL_IMAGE" "$(inputs_key "$bin/kubectl")" ;;
    hub) build hub "$HUB_IMAGE" "$(echo "$HUGGINGFACE_HUB_VERSION" | inputs_key - "$here/base-rootfs.sh")" ;;
    *) echo "unknown image $image" >&2; exit 2 ;;
  esac
done
