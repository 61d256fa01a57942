"""Plays the image probe's container where KWOK runs none: waits for the probe pod of a
namespace to finish, then writes, as its termination message, the report the real probe
printed for vllm 0.33.0 (operator/tests/fixtures, checked against a live run in the vllm
tier). Used by the demo and the end-to-end tests; never by the operator."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPORT = ROOT / "operator" / "tests" / "fixtures" / "probe-report-vllm-0.33.0-nvidia.json"


def _kubectl(*args: str, input_text: str | None = None) -> str:
    return subprocess.run(
        ["kubectl", *args],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ,
        input=input_text,
    ).stdout


def finished_probe_pod(namespace: str) -> dict[str, Any] | None:
    pods = json.loads(
        _kubectl(
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            "app.kubernetes.io/component=preflight",
            "-o",
            "json",
        )
    )["items"]
    done = [p for p in pods if p["status"].get("phase") == "Succeeded"]
    return done[0] if done else None


def play(namespace: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    pod = finished_probe_pod(namespace)
    while pod is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no finished probe pod in {namespace} after {timeout}s")
        time.sleep(0.5)
        pod = finished_probe_pod(namespace)
    report = json.dumps(json.loads(REPORT.read_text()), separators=(",", ":"))
    name: str = pod["metadata"]["name"]
    _kubectl(*terminated_patch(pod, report))
    return name


def terminated_status(
    pod: dict[str, Any], terminated: dict[str, Any], message: str
) -> dict[str, Any]:
    """The status of the pod's first container, terminated as ``terminated`` says, with
    ``message`` as its termination message."""
    container = pod["spec"]["containers"][0]
    return {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": {**terminated, "message": message}},
    }


def terminated_patch(pod: dict[str, Any], message: str) -> list[str]:
    """kubectl arguments that mark the pod's container Completed with ``message`` as its
    termination message, as the kubelet would write it."""
    status = {
        "containerStatuses": [
            terminated_status(pod, {"exitCode": 0, "reason": "Completed"}, message)
        ]
    }
    return [
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        pod["metadata"]["namespace"],
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    ]


if __name__ == "__main__":
    print(f"played the probe in pod {play(sys.argv[1])}")
