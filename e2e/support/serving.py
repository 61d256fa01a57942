"""Real vLLM serving on the real nodes: the tiny model's volume, the serving spec, a completion."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import urllib.request
from typing import Any

from e2e.support.cluster import (
    ROOT,
    RUN,
    Cluster,
    cache_volume,
)
from e2e.support.real_node import SETTINGS, RealNode

VLLM_CPU_IMAGE = SETTINGS["VLLM_CPU_IMAGE"]


# The operator against real pods: their own addresses scraped, every 2 s, over a 20 s window.
SCRAPE_REAL_LEADERS = {
    "KIMIK3_SCRAPE_URL": "",
    "KIMIK3_SCRAPE_SECONDS": "2",
    "KIMIK3_ACCEPTANCE_WINDOW_SECONDS": "20",
}
PROMPTS = [
    "The operator checks the model, the drafter",
    "Speculative decoding is effective when",
    "Kimi-K3 is served by vLLM across",
]


def vllm_cpu_python() -> str:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-cpu-venv.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def model_infos(python: str, architectures: set[str]) -> pathlib.Path:
    """A vLLM cache root holding vLLM's model-info entries for these architectures
    (e2e/support/modelinfos.py), kept beside the vllm-cpu environment it was computed with and
    grown when a test asks for an architecture it lacks."""
    venv = pathlib.Path(python).parents[1]
    root = venv.with_name(f"{venv.name}-modelinfos")
    done = root / "architectures.txt"
    known = set(done.read_text().split()) if done.exists() else set()
    missing = sorted(architectures - known)
    if missing:
        subprocess.run(
            [python, str(ROOT / "e2e" / "support" / "modelinfos.py"), str(root), *missing],
            check=True,
            capture_output=True,
        )
        done.write_text("\n".join(sorted(known | set(missing))) + "\n")
    return root


def model_volume(cluster: Cluster, namespace: str, models: dict[str, str]) -> pathlib.Path:
    """Tiny checkpoints (directory: kind of e2e/support/tiny_model.py) on a volume that the
    namespace's claim tiny-model binds to, with vLLM's model-info entries for their classes
    under vllm-cache/ (serving_spec points VLLM_CACHE_ROOT there)."""
    volume = RUN / "volumes" / namespace
    python = vllm_cpu_python()
    architectures: set[str] = set()
    for where, kind in models.items():
        subprocess.run(
            [python, str(ROOT / "e2e" / "support" / "tiny_model.py"), str(volume / where), kind],
            check=True,
            capture_output=True,
        )
        config = json.loads((volume / where / "config.json").read_text())
        # An EAGLE3 drafter of a class is registered as Eagle3<class>.
        for name in config.get("architectures", []):
            architectures |= {name, f"Eagle3{name}"}
    shutil.copytree(model_infos(python, architectures), volume / "vllm-cache", dirs_exist_ok=True)
    cache_volume(cluster, namespace, "tiny-model", volume)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "tiny-model"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"cache-{namespace}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.apply(claim, namespace)
    return volume


def forget_model_volume(cluster: Cluster, namespace: str, volume: pathlib.Path) -> None:
    cluster.kubectl("delete", "pv", f"cache-{namespace}", "--wait=false", check=False)
    shutil.rmtree(volume, ignore_errors=True)


def serving_spec(node: RealNode) -> dict[str, Any]:
    placement = node.placement()
    return {
        "model": {
            "repo": "tiny",
            "architecture": "LlamaForCausalLM",
            "source": {"pvc": {"claimName": "tiny-model", "path": "tiny"}},
        },
        # The target as its own draft model: every draft is accepted.
        "drafter": {
            "method": "draft_model",
            "source": {"pvc": {"claimName": "tiny-model", "path": "tiny"}},
            "numSpeculativeTokens": 3,
        },
        "engine": {
            "image": VLLM_CPU_IMAGE,
            "version": "0.32.0",
            "maxModelLen": 512,
            # vLLM's CPU build keeps an fp8 KV cache only on x86 with AVX-512 or AMX ("FP8 KV
            # cache on CPU requires x86 with AVX-512 or AMX" at engine start): the default
            # fp8 is for GPUs, and a CPU without either (an AVX2-only EPYC) must run "auto".
            "kvCacheDtype": "auto",
            "extraArgs": ["--enforce-eager"],
            # vLLM's CPU build binds its memory to a NUMA node (set_mempolicy), which the
            # RuntimeDefault seccomp profile allows only with CAP_SYS_NICE.
            "addCapabilities": ["SYS_NICE"],
            "env": [
                {"name": "VLLM_TARGET_DEVICE", "value": "cpu"},
                {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
                # vLLM's model-info entries for the tiny models' classes, on their volume
                # (model_volume): a start skips the two subprocesses that would compute them.
                # On a CPU with --enforce-eager vLLM writes nothing else under its cache root
                # (compile caches, GPU tuning), and a failed write of an entry is only logged.
                {"name": "VLLM_CACHE_ROOT", "value": "/models/vllm-cache"},
                {"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/tmp/inductor"},
                {"name": "HF_HUB_OFFLINE", "value": "1"},
            ],
        },
        "parallelism": {"tensor": 1},
        "placement": {
            "gpusPerNode": 1,
            "gpuResource": "cpu",
            "nodeSelector": placement["nodeSelector"],
            "tolerations": placement["tolerations"],
            "jobs": placement,
        },
        "resources": {"memory": "6Gi", "sharedMemory": "1Gi"},
        "preflight": {"mode": "Enforce", "probe": True},
        "monitoring": {"podMonitor": False, "minAcceptanceRate": 0.5},
    }


def complete(url: str, prompt: str) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": 48,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer
