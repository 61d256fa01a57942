"""The model cache end to end: the operator creates the claim and the download Job, holds the
LeaderWorkerSet until the weights are in, reports progress and start-up phases, and mounts the
cache read-only into the serving pods.

Two runs of it:
- on the real node, the download Job runs for real (the script in an image with
  huggingface_hub) against a local fake Hub (HF_ENDPOINT), its pod is killed midway and its
  successor resumes; the operator reads the progress from the pod itself;
- on KWOK, where no container runs, the Job's pod is played as the probe's is (its report
  written as the termination message), which covers a changed revision's fresh download.
Stood in for: a storage provisioner (a hostPath PersistentVolume bound to the claim by name),
the Hub (e2e/support/fake_hub.py) and, on KWOK, the download itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.support.cluster import (
    CACHE_KEY_LABEL,
    RUN,
    Cluster,
    OperatorProcess,
    cache_volume,
    describe,
    kimi,
    play_download,
    wait_for,
)
from e2e.support.fake_hub import FakeHub
from e2e.support.real_node import HUB_IMAGE, RealNode, build_images, start_real_node

TARGET = "moonshotai/Kimi-K3"
DRAFTER = "RedHatAI/Kimi-K3-speculator.dspark"
WEIGHTS = 24 * 1024 * 1024


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = (cluster.get("kk3d", "k3", namespace) or {}).get("status") or {}
    return found


def _cached_spec(engine: dict[str, Any], placement: dict[str, Any] | None = None) -> dict[str, Any]:
    # Two connections in 1 MiB chunks: slow enough to watch and to kill midway, with chunks
    # already on disk for the successor to keep.
    cache = {"size": "1Gi", "connections": 2, "chunkSize": "1Mi"}
    return {
        "model": {"repo": TARGET, "cache": cache},
        "drafter": {"method": "dspark", "repo": DRAFTER, "numSpeculativeTokens": 8},
        "engine": engine,
        "parallelism": {"tensor": 8},
        "preflight": {"probe": False},
        "placement": placement or {},
    }


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


@pytest.fixture
def hub_on_the_bridge(cluster: Cluster) -> Iterator[tuple[RealNode, FakeHub]]:
    node = start_real_node(cluster.env)
    hub = FakeHub(host=node.host_address)
    hub.add_repo(
        TARGET,
        {
            "config.json": json.dumps({"architectures": ["KimiLinearForCausalLM"]}).encode(),
            "model-00001-of-00002.safetensors": os.urandom(WEIGHTS // 2),
            "model-00002-of-00002.safetensors": os.urandom(WEIGHTS // 2),
        },
    )
    hub.add_repo(
        DRAFTER,
        {
            "config.json": json.dumps({"architectures": ["K3DSparkModel"]}).encode(),
            "model.safetensors": os.urandom(WEIGHTS // 8),
        },
    )
    hub.bytes_per_second = WEIGHTS / 24  # long enough to watch, and to kill midway
    hub.start()
    yield node, hub
    hub.stop()


@pytest.mark.real_node
def test_a_real_download_fills_the_cache_resumes_after_a_kill_and_gates_the_rollout(
    cluster: Cluster,
    namespace: str,
    volumes: list[str],
    hub_on_the_bridge: tuple[RealNode, FakeHub],
) -> None:
    node, hub = hub_on_the_bridge
    build_images(cluster.env, "hub")
    host_dir = RUN / "volumes" / namespace
    cache_volume(cluster, namespace, "k3-model-cache", host_dir)
    volumes.append(namespace)
    operator = OperatorProcess(cluster, namespace, extra_env={"KIMIK3_SCRAPE_SECONDS": "1"})
    operator.start()
    try:
        started = time.monotonic()
        spec = _cached_spec(
            {
                "image": HUB_IMAGE,
                "version": "0.33.0",
                "env": [{"name": "HF_ENDPOINT", "value": hub.url}],
            },
            {"jobs": node.placement()},
        )
        cluster.apply(kimi("k3", **spec), namespace)
        explain: Callable[[], str] = lambda: describe(cluster, "k3", namespace)  # noqa: E731

        # Progress from the running pod, in the status and the printer column.
        def partly_downloaded() -> dict[str, Any] | None:
            status = _status(cluster, namespace)
            cache = status.get("modelCache") or {}
            done, total = cache.get("bytesDone", 0), cache.get("bytesTotal", 0)
            midway = total / 10 < done < total / 2
            return status if cache.get("phase") == "Downloading" and midway else None

        status = wait_for(partly_downloaded, 120, "download progress in the status", explain)
        cache = status["modelCache"]
        print(f"download progress seen {time.monotonic() - started:.1f}s after apply: {cache}")
        assert cache["progress"].startswith("Downloading ") and "% of " in cache["progress"]
        assert status["startup"]["phase"] == "Downloading"
        assert _condition(status, "ModelCached")["status"] == "Unknown"
        assert _condition(status, "Progressing")["reason"] == "WaitingForModelCache"
        assert cluster.get("leaderworkerset", "k3", namespace) is None, "no serving pod yet"
        wide = cluster.kubectl("get", "kk3d", "k3", "-n", namespace, "-o", "wide").stdout
        assert "STARTUP" in wide and "CACHE" in wide and "Downloading" in wide

        # Kill the download pod midway: the Job's next pod resumes the partial files.
        pods = cluster.items("pod", namespace, "app.kubernetes.io/component=download")
        assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == node.name
        killed = pods[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", killed, "-n", namespace, "--grace-period=0", "--force")

        ready = wait_for(
            lambda: (
                _status(cluster, namespace)
                if _condition(_status(cluster, namespace), "ModelCached").get("status") == "True"
                else None
            ),
            180,
            "the cache to be Ready after the resumed download",
            explain,
        )
        print(f"cache Ready {time.monotonic() - started:.1f}s after apply")
        cache = ready["modelCache"]
        total = sum(f.size for repo in hub.repos.values() for f in repo.files.values())
        assert cache["phase"] == "Ready" and cache["bytesTotal"] == total
        assert {r["repo"]: r["commit"] for r in cache["repos"]} == {
            TARGET: hub.repos[TARGET].commit,
            DRAFTER: hub.repos[DRAFTER].commit,
        }
        # The successor fetched only the chunks the map did not list: what comes twice is at
        # most the two chunks in flight at the kill and those finished in the last half
        # second before it, which the map (written every 0.5 s) had not recorded yet; a
        # download started over would fetch all 25 MB again.
        served = sum(size for name in hub.repos[TARGET].files for _, size in hub.ranges(name))
        target_bytes = sum(f.size for f in hub.repos[TARGET].files.values())
        assert target_bytes <= served <= target_bytes + 4 * 2**20, (served, target_bytes)
        names = [
            p["metadata"]["name"]
            for p in cluster.items("pod", namespace, "app.kubernetes.io/component=download")
        ]
        assert killed not in names and names, "the Job replaced the killed pod"

        # The files are in the volume, in the Hub's cache layout, byte for byte.
        snapshot = (
            host_dir
            / "hub"
            / "models--moonshotai--Kimi-K3"
            / "snapshots"
            / hub.repos[TARGET].commit
        )
        for name, hub_file in hub.repos[TARGET].files.items():
            assert (snapshot / name).read_bytes() == hub_file.data
        ref = host_dir / "hub" / "models--moonshotai--Kimi-K3" / "refs" / "main"
        assert ref.read_text().strip() == hub.repos[TARGET].commit

        # Now, and only now, the serving pods: reading the cache read-only, offline.
        lws = wait_for(
            lambda: cluster.get("leaderworkerset", "k3", namespace),
            30,
            "the LeaderWorkerSet after the cache is Ready",
            explain,
        )
        pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "model-cache")
        assert volume["persistentVolumeClaim"] == {"claimName": "k3-model-cache", "readOnly": True}
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HUB_CACHE"] == "/model-cache/hub"
        wait_for(
            lambda: _status(cluster, namespace).get("startup", {}).get("phase") == "Ready",
            90,
            "start-up phase Ready",
            explain,
        )
        log = operator.log.read_text()
        assert "Traceback" not in log
    finally:
        operator.stop()
        shutil.rmtree(host_dir, ignore_errors=True)


@pytest.mark.kwok
def test_a_new_revision_is_downloaded_before_the_rollout_on_kwok(
    cluster: Cluster, namespace: str, volumes: list[str], operator: OperatorProcess
) -> None:
    host_dir = RUN / "volumes" / namespace
    cache_volume(cluster, namespace, "k3-model-cache", host_dir)
    volumes.append(namespace)
    explain: Callable[[], str] = lambda: describe(cluster, "k3", namespace)  # noqa: E731
    cluster.apply(kimi("k3", **_cached_spec({"image": "vllm/vllm-openai:v0.33.0"})), namespace)

    def cache_key() -> str | None:
        key: str | None = (_status(cluster, namespace).get("modelCache") or {}).get("key")
        return key

    first = wait_for(cache_key, 60, "the first download's key", explain)
    assert cluster.get("leaderworkerset", "k3", namespace) is None
    claim = wait_for(lambda: cluster.get("pvc", "k3-model-cache", namespace), 30, "the claim")
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "KimiK3Deployment"
    report = {"phase": "Ready", "bytesTotal": 1000, "repos": [{"repo": TARGET, "commit": "a" * 40}]}
    play_download(cluster, namespace, first, report)
    lws = wait_for(
        lambda: cluster.get("leaderworkerset", "k3", namespace), 60, "the LeaderWorkerSet", explain
    )
    # The old revision serves before the change (KWOK marks the pods Ready; on a loaded machine
    # that can come after the LeaderWorkerSet).
    wait_for(
        lambda: _condition(_status(cluster, namespace), "Available").get("status") == "True",
        60,
        "the first revision Available",
        explain,
    )

    # A new revision: a new download, while the running LeaderWorkerSet keeps the old one.
    patch = {"spec": {"model": {"revision": "v2"}}}
    cluster.kubectl("patch", "kk3d", "k3", "-n", namespace, "--type=merge", "-p", json.dumps(patch))

    def new_key() -> str | None:
        key = cache_key()
        return key if key and key != first else None

    second = wait_for(new_key, 60, "the second download's key", explain)
    status = _status(cluster, namespace)
    assert _condition(status, "Progressing")["reason"] == "WaitingForModelCache"
    assert _condition(status, "Available")["status"] == "True", "the old revision still serves"
    time.sleep(2)
    unchanged = cluster.get("leaderworkerset", "k3", namespace)
    assert unchanged is not None
    assert unchanged["metadata"]["generation"] == lws["metadata"]["generation"]
    jobs = cluster.items("job", namespace, "app.kubernetes.io/component=download")
    assert [j["metadata"]["labels"][CACHE_KEY_LABEL] for j in jobs] == [second]
    old = f"{TARGET}@{'a' * 12}"
    play_download(
        cluster,
        namespace,
        second,
        {
            **report,
            "repos": [{"repo": TARGET, "commit": "b" * 40}],
            "oldRevisions": [old],
            "oldBytes": 900,
        },
    )

    def rolled() -> bool:
        found = cluster.get("leaderworkerset", "k3", namespace) or {}
        return int(found.get("metadata", {}).get("generation", 0)) > lws["metadata"]["generation"]

    wait_for(rolled, 60, "the rollout once the new revision is cached", explain)
    args = (cluster.get("leaderworkerset", "k3", namespace) or {})["spec"]["leaderWorkerTemplate"][
        "workerTemplate"
    ]["spec"]["containers"][0]["args"]
    assert args[args.index("--revision") + 1] == "v2"

    # Once every serving pod is one made for v2 and Ready, the old revision is collected.
    collect = wait_for(
        lambda: cluster.items("job", namespace, "app.kubernetes.io/component=collect"),
        120,
        "the collect Job after the rollout",
        explain,
    )
    assert len(collect) == 1
    request = json.loads(collect[0]["spec"]["template"]["spec"]["containers"][0]["args"][0])
    assert request == {"mode": "collect", "keep": [{"repo": TARGET, "commit": "b" * 40}]}
    play_download(
        cluster,
        namespace,
        second,
        {"phase": "Collected", "bytesFreed": 900, "removed": [old]},
        label="serving.kimik3.io/collect-key",
    )

    def freed() -> dict[str, Any] | None:
        cache = _status(cluster, namespace).get("modelCache") or {}
        return cache if cache.get("bytesFreed") == 900 else None

    cache = wait_for(freed, 60, "bytesFreed in status.modelCache", explain)
    assert "oldRevisions" not in cache
    subprocess.run(["rm", "-rf", str(host_dir)], check=False)
