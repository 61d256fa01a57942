"""Plays the model cache's part where KWOK runs no container, for the demo: a hostPath
volume reserved for the claim the operator makes (no provisioner runs here), then, once the
download Job's pod has finished, the report the real download script writes as its
termination message (a stand-in: no weight is fetched). Never used by the operator."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from e2e.support.play_probe import ROOT, _kubectl, terminated_patch

CACHE_KEY_LABEL = "serving.kimik3.io/cache-key"
REPORT = {
    "phase": "Ready",
    "bytesTotal": 1000,
    "repos": [{"repo": "moonshotai/Kimi-K3", "commit": "a" * 40}],
}


def reserve_volume(namespace: str, name: str) -> None:
    """A volume bound ahead to the claim <name>-model-cache."""
    path = ROOT / "e2e" / ".run" / "volumes" / namespace
    path.mkdir(parents=True, exist_ok=True)
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"cache-{namespace}"},
        "spec": {
            "capacity": {"storage": "2Ti"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": namespace, "name": f"{name}-model-cache"},
        },
    }
    _kubectl("apply", "-f", "-", input_text=json.dumps(volume))


def _wait(what: str, find: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while (found := find()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout}s")
        time.sleep(0.5)
    return found


def play(namespace: str, name: str, timeout: float = 90) -> str:
    def key() -> str | None:
        body = json.loads(_kubectl("get", "kk3d", name, "-n", namespace, "-o", "json"))
        found = ((body.get("status") or {}).get("modelCache") or {}).get("key")
        return str(found) if found else None

    def finished(cache_key: str) -> dict[str, Any] | None:
        pods = json.loads(
            _kubectl(
                "get", "pods", "-n", namespace, "-l", f"{CACHE_KEY_LABEL}={cache_key}", "-o", "json"
            )
        )["items"]
        done = [p for p in pods if p["status"].get("phase") == "Succeeded"]
        return done[0] if done else None

    cache_key = _wait(f"no download Job for {name}", key, timeout)
    pod = _wait(f"no finished download pod in {namespace}", lambda: finished(cache_key), timeout)
    _kubectl(*terminated_patch(pod, json.dumps(REPORT)))
    return str(pod["metadata"]["name"])


if __name__ == "__main__":
    command, namespace, name = sys.argv[1:4]
    if command == "volume":
        reserve_volume(namespace, name)
    else:
        print(f"played the download in pod {play(namespace, name)}")
