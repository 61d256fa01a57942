"""The download Job's script, run with the real huggingface_hub that vLLM 0.33.0 ships (the
package the serving image has) against a local fake Hub: it fills the Hub's cache layout,
verifies sizes and checksums, resumes after being killed, refuses a corrupted file, and leaves
a cache that huggingface_hub reads offline, as the serving pods do."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.fake_hub import FakeHub

from .helpers import ROOT, vllm_python

pytestmark = pytest.mark.vllm
SCRIPT = ROOT / "operator" / "kimik3_operator" / "weights" / "download_script.py"
TARGET = "moonshotai/Kimi-K3-tiny"
DRAFTER = "RedHatAI/Kimi-K3-tiny-speculator.dspark"
WEIGHTS = 4 * 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    served = FakeHub()
    served.add_repo(
        TARGET,
        {
            "config.json": json.dumps({"architectures": ["KimiLinearForCausalLM"]}).encode(),
            "model.safetensors": os.urandom(WEIGHTS),
        },
    )
    served.add_repo(
        DRAFTER,
        {
            "config.json": json.dumps({"architectures": ["K3DSparkModel"]}).encode(),
            "model.safetensors": os.urandom(WEIGHTS // 4),
        },
    )
    served.start()
    yield served
    served.stop()


def _request(port: int, verify_only: bool = False) -> str:
    return json.dumps(
        {
            "repos": [
                {"repo": TARGET, "revision": "main"},
                {"repo": DRAFTER, "revision": "main"},
            ],
            "verifyOnly": verify_only,
            "progressPort": port,
        }
    )


def _env(hub: FakeHub, cache: pathlib.Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(cache.parent / "home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }


def _run(hub: FakeHub, cache: pathlib.Path, verify_only: bool = False) -> dict[str, Any]:
    done = subprocess.run(
        [vllm_python(), str(SCRIPT), _request(_free_port(), verify_only)],
        env=_env(hub, cache),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert (done.returncode == 0) == (report["phase"] == "Ready"), done.stderr[-2000:]
    return report


def test_fills_the_hub_cache_verified_and_readable_offline(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    cache = tmp_path / "hub"
    report = _run(hub, cache)
    assert report["phase"] == "Ready"
    assert report["bytesTotal"] == sum(
        len(f.data) for repo in hub.repos.values() for f in repo.files.values()
    )
    assert [(r["repo"], r["commit"]) for r in report["repos"]] == [
        (TARGET, hub.repos[TARGET].commit),
        (DRAFTER, hub.repos[DRAFTER].commit),
    ]
    snapshot = cache / "models--moonshotai--Kimi-K3-tiny" / "snapshots" / hub.repos[TARGET].commit
    assert (snapshot / "model.safetensors").read_bytes() == hub.repos[TARGET].files[
        "model.safetensors"
    ].data
    # The serving pods run vLLM with HF_HUB_OFFLINE=1: the revision resolves from the cache.
    offline = subprocess.run(
        [
            vllm_python(),
            "-c",
            "import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1], revision='main'))",
            TARGET,
        ],
        env={**_env(hub, cache), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert offline.stdout.strip() == str(snapshot)

    # A second Job for the same snapshot checks sizes against its marker: nothing is fetched.
    before = len(hub.ranges("model.safetensors"))
    again = _run(hub, cache)
    assert again["phase"] == "Ready"
    assert len(hub.ranges("model.safetensors")) == before


def test_a_corrupted_file_fails_verification_naming_it(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    cache = tmp_path / "hub"
    assert _run(hub, cache)["phase"] == "Ready"
    blob = (
        cache
        / "models--moonshotai--Kimi-K3-tiny"
        / "blobs"
        / hub.repos[TARGET].files["model.safetensors"].sha256
    )
    blob.write_bytes(os.urandom(WEIGHTS))  # same size, other bytes
    for marker in (cache / ".kimik3-verified").rglob("*.json"):
        marker.unlink()
    report = _run(hub, cache)
    assert report["phase"] == "Failed"
    assert any(
        p.startswith(f"{TARGET}/model.safetensors: sha256") and "the Hub says" in p
        for p in report["problems"]
    )


def test_a_killed_download_resumes_where_it_stopped(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "hub"
    hub.bytes_per_second = WEIGHTS / 4  # about four seconds for the target's weights
    port = _free_port()
    first = subprocess.Popen(
        [vllm_python(), str(SCRIPT), _request(port)],
        env=_env(hub, cache),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    progress: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=2) as r:
                    progress = json.loads(r.read())
            except OSError:
                progress = {}
            if progress.get("bytesDone", 0) > WEIGHTS // 3:
                break
            time.sleep(0.2)
        assert progress.get("phase") == "Downloading", progress
        assert 0 < progress["bytesDone"] < progress["bytesTotal"]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    hub.bytes_per_second = 0
    report = _run(hub, cache)
    assert report["phase"] == "Ready"
    ranges = hub.ranges("model.safetensors")
    resumed = [(start, size) for start, size in ranges if start > 0]
    assert resumed, f"the second run fetched the weights again from the start: {ranges}"
    assert sum(size for _, size in ranges) < 2 * WEIGHTS
