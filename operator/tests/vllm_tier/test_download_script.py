"""The download Job's script, run with the real huggingface_hub that vLLM 0.33.0 ships (the
package the serving image has) against a local fake Hub: it fills the Hub's cache layout,
verifies sizes and checksums, resumes after being killed from the chunks already on disk,
refuses a corrupted file, and leaves a cache that huggingface_hub reads offline, as the
serving pods do. Then the Hub turns hostile (names out of the cache, answers longer than
listed or without end, a redirect to another origin), the volume is too small, and an old
revision is collected."""

from __future__ import annotations

import itertools
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

from e2e.support.fake_hub import FakeHub

from .helpers import ROOT, vllm_python

pytestmark = pytest.mark.vllm
SCRIPT = ROOT / "operator" / "kimik3_operator" / "programs" / "download.py"
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
            "speculator.safetensors": os.urandom(WEIGHTS // 4),
        },
    )
    served.start()
    yield served
    served.stop()


def _request(port: int, mode: str = "fill", **more: Any) -> str:
    return json.dumps(
        {
            "repos": [
                {"repo": TARGET, "revision": "main"},
                {"repo": DRAFTER, "revision": "main"},
            ],
            "mode": mode,
            "progressPort": port,
            **more,
        }
    )


def _run(
    hub: FakeHub,
    cache: pathlib.Path,
    mode: str = "fill",
    env: dict[str, str] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The script's report, with its exit status under "exit"."""
    done = subprocess.run(
        [vllm_python(), str(SCRIPT), _request(_free_port(), mode, **more)],
        env={**hub.client_env(cache), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    finished = report["phase"] in ("Ready", "Collected")
    assert (done.returncode == 0) == finished, done.stderr[-2000:]
    report["exit"] = done.returncode
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
        env={**hub.client_env(cache), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
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
    assert report["phase"] == "Failed" and report["exit"] == 1
    assert any(
        p.startswith(f"{TARGET}/model.safetensors: sha256") and "the Hub says" in p
        for p in report["problems"]
    )


def test_a_killed_download_resumes_from_the_chunks_on_disk(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    cache = tmp_path / "hub"
    hub.bytes_per_second = 1024 * 1024  # per connection: a second a chunk
    port = _free_port()
    chunk = 1024 * 1024
    first = subprocess.Popen(
        [vllm_python(), str(SCRIPT), _request(port, connections=2, chunkBytes=chunk)],
        env=hub.client_env(cache),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    blob = (
        cache
        / "models--moonshotai--Kimi-K3-tiny"
        / "blobs"
        / hub.repos[TARGET].files["model.safetensors"].sha256
    )
    chunk_map = pathlib.Path(f"{blob}.incomplete.chunks")
    progress: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=2) as r:
                    progress = json.loads(r.read())
            except OSError:
                progress = {}
            done = json.loads(chunk_map.read_text())["done"] if chunk_map.exists() else []
            if progress.get("bytesDone", 0) > WEIGHTS // 3 and len(done) >= 2:
                break
            time.sleep(0.1)
        assert progress.get("phase") == "Downloading", progress
        assert 0 < progress["bytesDone"] < progress["bytesTotal"]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    kept = json.loads(chunk_map.read_text())
    assert kept["size"] == WEIGHTS and kept["chunk"] == chunk and len(kept["done"]) >= 2
    hub.bytes_per_second = 0
    wait_for_idle(hub)
    before = len(hub.ranges("model.safetensors"))
    report = _run(hub, cache, connections=2, chunkBytes=chunk)
    assert report["phase"] == "Ready", report
    assert blob.read_bytes() == hub.repos[TARGET].files["model.safetensors"].data
    assert not chunk_map.exists() and not pathlib.Path(f"{blob}.incomplete").exists()
    again = hub.ranges("model.safetensors")[before:]
    # The successor asks only for the chunks the map does not list.
    assert {start // chunk for start, _ in again}.isdisjoint(kept["done"]), (kept, again)
    assert sum(size for _, size in again) <= WEIGHTS - len(kept["done"]) * chunk


def wait_for_idle(hub: FakeHub) -> None:
    """Until the answers to the killed process have ended (and been recorded)."""
    deadline = time.monotonic() + 30
    while hub.active and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not hub.active


def test_a_large_file_comes_over_several_connections_at_once(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    hub.bytes_per_second = 1024 * 1024
    started = time.monotonic()
    report = _run(hub, tmp_path / "hub", connections=8, chunkBytes=1024 * 1024)
    took = time.monotonic() - started
    assert report["phase"] == "Ready"
    # Chunks of a second each at the per-connection cap: the Hub answered several at once
    # (how much sooner that is, bench/download.py measures; a time here fails on a busy CPU).
    assert hub.most_active >= 2, hub.most_active
    wait_for_idle(hub)
    ranges = hub.ranges("model.safetensors")
    # Every byte once, in ranges of at most a chunk (the last chunks cut finer).
    covered = sorted(ranges)
    assert covered[0][0] == 0 and sum(size for _, size in covered) == WEIGHTS
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(covered))
    assert len(covered) >= 4 and max(size for _, size in covered) <= 1024 * 1024
    print(f"4 MiB at 1 MiB/s a connection: {took:.1f}s, {hub.most_active} answers at once")


def _hostile(hub: FakeHub, change: Any) -> None:
    def listing(info: dict[str, Any]) -> dict[str, Any]:
        if info["id"] == TARGET:
            change(info)
        return info

    hub.listing = listing


def _weights_entry(info: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = next(
        s for s in info["siblings"] if s["rfilename"] == "model.safetensors"
    )
    return entry


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda i: _weights_entry(i)["lfs"].update(sha256="../../../../x"), "'../../../../x'"),
        (lambda i: _weights_entry(i).update(blobId="../../outside"), "'../../outside'"),
        (lambda i: i.update(sha="../../../snapshot"), "'../../../snapshot'"),
        (lambda i: _weights_entry(i).update(rfilename="../../../../escaped"), "escaped"),
        (lambda i: _weights_entry(i).update(rfilename="/etc/passwd"), "/etc/passwd"),
    ],
    ids=["sha256", "blob-id", "commit", "relative-name", "absolute-name"],
)
def test_names_from_the_listing_must_be_what_the_hub_allows(
    hub: FakeHub, tmp_path: pathlib.Path, change: Any, named: str
) -> None:
    _hostile(hub, change)
    cache = tmp_path / "deep" / "er" / "hub"
    report = _run(hub, cache)
    assert report["phase"] == "Failed" and report["exit"] == 3, report
    assert named in report["problems"][0] and TARGET in report["problems"][0]
    written = [p for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()]
    assert all(cache in p.parents for p in written), written
    assert not any(p.name == "x" or "outside" in p.name for p in written)


def test_an_answer_longer_than_listed_is_an_error_naming_the_file(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    hub.extra_bytes["model.safetensors"] = 50_000
    cache = tmp_path / "hub"
    report = _run(hub, cache)
    assert report["phase"] == "Failed" and report["exit"] == 3, report
    problem = report["problems"][0]
    assert f"{TARGET}/model.safetensors" in problem and str(WEIGHTS) in problem
    for path in (cache / "models--moonshotai--Kimi-K3-tiny" / "blobs").iterdir():
        assert path.stat().st_size <= WEIGHTS, path


def test_an_answer_that_never_ends_meets_the_deadline(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    hub.endless.add("model.safetensors")
    started = time.monotonic()
    report = _run(hub, tmp_path / "hub", deadlineSeconds=6)
    took = time.monotonic() - started
    assert report["phase"] == "Failed" and report["exit"] == 3, report
    assert "deadline of 6" in report["problems"][0]
    assert took < 60, took


def test_the_token_is_not_sent_to_another_origin(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    cdn = FakeHub()
    cdn.repos = hub.repos
    cdn.start()
    try:
        hub.redirect_to = cdn.url
        report = _run(hub, tmp_path / "hub", env={"HF_TOKEN": "hf_secret_of_the_user"})
        assert report["phase"] == "Ready", report
        assert any(auth == "Bearer hf_secret_of_the_user" for _, auth in hub.authorizations)
        downloads = [(path, auth) for path, auth in cdn.authorizations if "/resolve/" in path]
        assert downloads, "the redirect was not followed"
        assert all(auth is None for _, auth in downloads), downloads
    finally:
        cdn.stop()


def test_a_volume_too_small_is_refused_before_the_download_with_the_size_needed(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    cache = tmp_path / "hub"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(cache)], check=True)
    try:
        report = _run(hub, cache)
        assert report["phase"] == "Failed" and report["exit"] == 3, report
        problem = report["problems"][0]
        assert "too small" in problem and "needs at least" in problem, problem
        assert "spec.model.cache.size" in problem
        assert hub.ranges("model.safetensors") == [], "nothing is fetched"
    finally:
        subprocess.run(["umount", str(cache)], check=True)


def test_an_old_revision_is_reported_then_collected(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "hub"
    assert _run(hub, cache)["phase"] == "Ready"
    old = hub.repos[TARGET]
    config = old.files["config.json"].data
    hub.add_repo(TARGET, {"config.json": config, "model.safetensors": os.urandom(WEIGHTS)})
    new = hub.repos[TARGET]
    report = _run(hub, cache)
    assert report["phase"] == "Ready"
    assert f"{TARGET}@{old.commit[:12]}" in report["oldRevisions"]
    assert report["oldBytes"] >= WEIGHTS
    keep = [
        {"repo": TARGET, "commit": new.commit},
        {"repo": DRAFTER, "commit": hub.repos[DRAFTER].commit},
    ]
    collected = _run(hub, cache, mode="collect", keep=keep)
    assert collected["phase"] == "Collected", collected
    assert collected["bytesFreed"] >= WEIGHTS
    assert collected["removed"] == [f"{TARGET}@{old.commit[:12]}"]
    folder = cache / "models--moonshotai--Kimi-K3-tiny"
    assert not (folder / "snapshots" / old.commit).exists()
    assert not (folder / "blobs" / old.files["model.safetensors"].sha256).exists()
    snapshot = folder / "snapshots" / new.commit
    # What the new revision shares with the old one stays.
    assert (snapshot / "config.json").read_bytes() == config
    assert (snapshot / "model.safetensors").read_bytes() == new.files["model.safetensors"].data
    # Nothing left to collect, and the new revision still verifies.
    again = _run(hub, cache)
    assert again["phase"] == "Ready" and "oldRevisions" not in again
