"""The model cache: its claim and download Job, the serving pods' mounts, the cache's state
and start-up phases, the progress reader, and the reconcile that holds the LeaderWorkerSet
until the weights are in the cache."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from conftest import FakeKube, key_of, resource, settle, spec_of
from kimik3_operator.api.constants import Reason
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.types import SpecError
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.health_checks import startup_budget_seconds
from kimik3_operator.builders.leaderworkerset import build_leader_worker_set
from kimik3_operator.builders.model_cache import (
    HUB_CACHE,
    build_cache_claim,
    build_download_job,
    cache_key,
    download_request,
)
from kimik3_operator.builders.preflight_job import build_probe_job
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.observation.download_progress import Sample, next_sample, progress_fields
from kimik3_operator.observation.model_cache import (
    CacheState,
    cache_section,
    cache_state,
    progress_text,
    startup_section,
)
from kimik3_operator.observation.readings import Readings
from kimik3_operator.runtime.readers import ProgressReader
from kimik3_operator.status_view import render_status

OWNER = Owner("k3", "llm", "uid-1")
API = "serving.kimik3.io/v1alpha1"
NOW = "2026-12-03T00:00:00Z"
CACHE = {"cache": {"size": "1800Gi", "storageClassName": "fast-rwx"}}
TOKEN = {"hfTokenSecretRef": {"name": "hf", "key": "token"}}


def clock() -> str:
    return NOW


def _container(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    return container


# --- builders -----------------------------------------------------------------------------


def test_the_operator_creates_the_claim_unless_one_is_named() -> None:
    claim = build_cache_claim(spec_of(model=CACHE), OWNER)
    assert claim is not None
    assert claim["metadata"]["name"] == "k3-model-cache"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "1800Gi"}},
        "storageClassName": "fast-rwx",
    }
    named = spec_of(model={"cache": {"claimName": "weights"}})
    assert build_cache_claim(named, OWNER) is None
    assert build_cache_claim(spec_of(), OWNER) is None


def test_download_job_fetches_target_and_drafter_at_their_revisions() -> None:
    spec = spec_of(model={**CACHE, **TOKEN, "revision": "v1.0"}, drafter={"revision": "abc123"})
    job = build_download_job(spec, OWNER)
    container = _container(job)
    request = json.loads(container["args"][0])
    drafter = spec.paired_drafter
    assert drafter is not None
    assert request["repos"] == [
        {"repo": "moonshotai/Kimi-K3", "revision": "v1.0"},
        {"repo": drafter.repo, "revision": "abc123"},
    ]
    assert request["verifyOnly"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HUB_CACHE"]["value"] == HUB_CACHE
    # The token only by reference: its value never passes through the operator.
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    pod = job["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    volume = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert volume["persistentVolumeClaim"] == {"claimName": "k3-model-cache", "readOnly": False}
    assert job["spec"]["backoffLimit"] >= 1, "a killed pod is replaced and resumes"
    key = job["metadata"]["labels"]["serving.kimik3.io/cache-key"]
    assert (
        pod is not None
        and job["spec"]["template"]["metadata"]["labels"]["serving.kimik3.io/cache-key"] == key
    )


def test_a_prefilled_read_only_volume_is_only_verified() -> None:
    spec = spec_of(model={"cache": {"claimName": "weights", "accessMode": "ReadOnlyMany"}})
    job = build_download_job(spec, OWNER)
    assert json.loads(_container(job)["args"][0])["verifyOnly"] is True
    mount = next(m for m in _container(job)["volumeMounts"] if m["name"] == "model-cache")
    assert mount["readOnly"] is True


def test_cache_key_follows_revisions_not_the_image() -> None:
    base = spec_of(model=CACHE)
    assert cache_key(base, OWNER) == cache_key(
        spec_of(model=CACHE, engine={"image": "vllm/vllm-openai:v0.34.0"}), OWNER
    )
    assert cache_key(base, OWNER) != cache_key(spec_of(model={**CACHE, "revision": "v2"}), OWNER)
    assert cache_key(base, OWNER) != cache_key(
        spec_of(model=CACHE, drafter={"revision": "v2"}), OWNER
    )
    no_drafter = download_request(spec_of(model=CACHE, drafter={"method": "none"}))
    assert [r["repo"] for r in no_drafter["repos"]] == ["moonshotai/Kimi-K3"]


def test_jobs_run_where_placement_jobs_says() -> None:
    jobs = {
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "cpu", "operator": "Exists"}],
    }
    spec = spec_of(model=CACHE, placement={"jobs": jobs})
    for job in (build_download_job(spec, OWNER), build_probe_job(spec, OWNER)):
        pod = job["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "cpu"}
        assert pod["tolerations"] == [{"key": "cpu", "operator": "Exists"}]
    plain = build_probe_job(spec_of(), OWNER)["spec"]["template"]["spec"]
    assert "nodeSelector" not in plain and "tolerations" not in plain


def test_serving_pods_read_the_cache_read_only_and_offline() -> None:
    spec = spec_of(model=CACHE)
    lws = build_leader_worker_set(spec, OWNER, spec.paired_drafter, weight_bytes=10**12)
    template = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod = template[role]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "model-cache")
        assert volume["persistentVolumeClaim"] == {"claimName": "k3-model-cache", "readOnly": True}
        container = pod["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "model-cache")
        assert mount["readOnly"] is True
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HF_HUB_CACHE"] == HUB_CACHE and env["HF_HUB_OFFLINE"] == "1"
    without = build_leader_worker_set(spec_of(), OWNER, None)
    pod = without["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert all(v["name"] != "model-cache" for v in pod["volumes"])


def test_startup_budget_follows_the_cache() -> None:
    hub = startup_budget_seconds(spec_of())
    cached = startup_budget_seconds(spec_of(model=CACHE))
    measured = startup_budget_seconds(spec_of(model=CACHE), weight_bytes=400 * 10**9)
    assert hub == 900 + 1_700_000_000_000 // 250_000_000
    assert cached == 900 + 1_700_000_000_000 // 2 // 1_000_000_000
    assert measured == 900 + 400 * 10**9 // 2 // 1_000_000_000
    spec = spec_of(model=CACHE)
    lws = build_leader_worker_set(spec, OWNER, spec.paired_drafter, weight_bytes=400 * 10**9)
    probe = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert probe["startupProbe"]["failureThreshold"] == -(-measured // 30)


@pytest.mark.parametrize(
    ("model", "path"),
    [
        ({"cache": {"accessMode": "ReadOnlyMany"}}, "spec.model.cache.accessMode"),
        ({"cache": {"size": "lots"}}, "spec.model.cache.size"),
        (
            {"cache": {}, "source": {"pvc": {"claimName": "w"}}},
            "spec.model.cache",
        ),
    ],
)
def test_cache_specs_that_cannot_work_are_refused(model: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"model": model})
    assert err.value.path == path and err.value.fix


# --- state ------------------------------------------------------------------------------


def _pod(name: str, *, node: str = "cpu-1", phase: str = "Running", **status: Any) -> Any:
    return {
        "metadata": {"name": name, "creationTimestamp": f"2026-12-03T00:00:0{name[-1]}Z"},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, **status},
    }


def _terminated(message: dict[str, Any], code: int = 0) -> dict[str, Any]:
    return {
        "containerStatuses": [
            {"state": {"terminated": {"exitCode": code, "message": json.dumps(message)}}}
        ]
    }


def _state(**kwargs: Any) -> CacheState:
    defaults: dict[str, Any] = {
        "key": "k1",
        "claim_name": "k3-model-cache",
        "job_name": "k3-download-x",
        "claim": {"status": {"phase": "Bound"}},
        "job": {"status": {}},
        "pods": [],
        "stored": {},
    }
    return cache_state(**{**defaults, **kwargs})


def test_cache_state_moves_from_volume_to_download_to_ready() -> None:
    missing = _state(claim=None)
    assert (missing.phase, missing.reason) == ("Pending", "WaitingForVolume")
    assert "k3-model-cache does not exist" in missing.message
    unbound = _state(claim={"status": {"phase": "Pending"}}, pods=[_pod("p1", node="")])
    assert unbound.phase == "Pending" and "no volume is bound" in unbound.message
    running = _state(pods=[_pod("p1")])
    assert (running.phase, running.reason) == ("Downloading", "Downloading")
    retried = _state(pods=[_pod("p1", phase="Failed"), _pod("p2")])
    assert retried.phase == "Downloading" and "attempt 2" in retried.message
    report = {
        "phase": "Ready",
        "bytesTotal": 1234,
        "repos": [{"repo": "moonshotai/Kimi-K3", "commit": "c0ffee" * 7}],
    }
    done = _state(pods=[_pod("p1", phase="Succeeded", **_terminated(report))])
    assert done.ready and done.bytes_total == 1234
    assert "moonshotai/Kimi-K3@c0ffeec0ffee" in done.message
    # Ready is kept in the status: the Job's pods may go, the cache stays Ready.
    kept = _state(job=None, stored=cache_section(done, {}))
    assert kept.ready and kept.bytes_total == 1234


def test_a_failed_download_names_the_file() -> None:
    report = {"phase": "Failed", "problems": ["m/x/model-1.safetensors: 10 bytes, the Hub says 20"]}
    failed = _state(
        job={
            "status": {
                "conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
                ]
            }
        },
        pods=[_pod("p1", phase="Failed", **_terminated(report, 1))],
    )
    assert (failed.phase, failed.reason) == ("Failed", "DownloadFailed")
    assert "model-1.safetensors: 10 bytes, the Hub says 20" in failed.message
    pull = _state(
        pods=[
            _pod(
                "p1",
                phase="Pending",
                containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff"}}}],
            )
        ]
    )
    assert pull.phase == "Failed" and "cannot pull" in pull.message


def test_a_failed_download_is_degraded_unless_an_earlier_problem_holds_it() -> None:
    """Terminal until someone acts: Degraded=True with the download's reason, so the
    Degraded alert fires; a problem already reported keeps its place."""
    from kimik3_operator.api.conditions import Condition
    from kimik3_operator.api.constants import ConditionType
    from kimik3_operator.controller.conditions import Findings, final_conditions
    from kimik3_operator.observation.workload import Observation

    def with_model_cache(pods: Observation, cache: Any) -> Observation:
        return final_conditions(Findings(pods=pods, cache=cache))

    failed = _state(
        job={"status": {"conditions": [{"type": "Failed", "status": "True"}]}},
        pods=[_pod("p1", phase="Failed", **_terminated({"phase": "Failed", "problems": ["x"]}, 1))],
    )
    calm = Condition(ConditionType.DEGRADED, "False", Reason.AS_EXPECTED, "no pod problems seen")
    seen = with_model_cache(Observation(0, (calm,), Reason.AS_EXPECTED), failed)
    degraded = [c for c in seen.conditions if c.type == ConditionType.DEGRADED]
    assert [(c.status, c.reason) for c in degraded] == [("True", "DownloadFailed")]
    assert degraded[0].message.startswith("the model download failed: ")
    earlier = Condition(ConditionType.DEGRADED, "True", "NameConflict", "someone's Service")
    kept = with_model_cache(Observation(0, (earlier,), Reason.AS_EXPECTED), failed)
    assert [c for c in kept.conditions if c.type == ConditionType.DEGRADED] == [earlier]
    running = with_model_cache(
        Observation(0, (calm,), Reason.AS_EXPECTED), _state(pods=[_pod("p")])
    )
    assert [c for c in running.conditions if c.type == ConditionType.DEGRADED] == [calm]


def test_progress_text_and_section_keep_the_readers_numbers() -> None:
    assert progress_text("Downloading", 410, 1000) == "Downloading 41% of 1.0 kB"
    assert progress_text("Ready", 1_700_000_000_000, 1_700_000_000_000) == "Ready 1.7 TB"
    assert progress_text("Pending", 0, 0) == "Pending"
    running = _state(pods=[_pod("p1")])
    stored = {"key": "k1", "phase": "Downloading", "bytesDone": 50, "bytesTotal": 100}
    section = cache_section(running, stored)
    assert section["bytesDone"] == 50 and section["progress"] == "Downloading 50% of 100 B"
    assert "bytesDone" not in cache_section(running, {**stored, "key": "other"})


def test_startup_phases_name_the_slowest_pod() -> None:
    waiting = _state(claim=None)
    assert startup_section(waiting, [], 1, 0)["phase"] == "WaitingForCache"
    assert startup_section(_state(pods=[_pod("p1")]), [], 1, 0)["phase"] == "Downloading"
    leader = {"app.kubernetes.io/component": "leader"}

    def serving(name: str, node: str, ready: bool) -> dict[str, Any]:
        pod = _pod(name, node=node)
        pod["metadata"]["labels"] = leader
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        return pod

    assert startup_section(None, [], 1, 0)["phase"] == "Scheduling"
    scheduling = startup_section(
        None, [serving("k3-1", "", False), serving("k3-2", "", False)], 1, 0
    )
    assert scheduling == {
        "phase": "Scheduling",
        "message": "2 serving pods wait for a node",
        "slowestPod": "k3-1",
    }
    loading = startup_section(
        None, [serving("k3-1", "n1", True), serving("k3-2", "n2", False)], 1, 0
    )
    assert loading["phase"] == "LoadingWeights" and loading["slowestPod"] == "k3-2"
    assert startup_section(None, [serving("k3-1", "n1", True)], 1, 1)["phase"] == "Ready"


# --- progress reader ----------------------------------------------------------------------


def test_rate_and_estimate_from_successive_samples() -> None:
    first = next_sample(None, 100.0, 0)
    second = next_sample(first, 110.0, 1000)
    assert second.rate == 100.0
    third = next_sample(second, 120.0, 3000)
    assert third.rate == pytest.approx(0.5 * 200 + 0.5 * 100)
    # A restarted pod reports less than before: keep the rate, restart from its number.
    assert next_sample(third, 130.0, 500) == Sample(130.0, 500, third.rate)
    stored = {"key": "k", "phase": "Downloading"}
    fields = progress_fields(stored, {"phase": "Downloading", "bytesTotal": 6000}, third)
    assert fields["bytesPerSecond"] == 150 and fields["etaSeconds"] == 20
    assert fields["progress"] == "Downloading 50% of 6.0 kB"


def test_the_reader_only_records_and_the_reconcile_writes_the_numbers(kube: FakeKube) -> None:
    """The reader writes nothing: it keeps the pod's answer and says whether it would change
    status.modelCache; the reconcile folds it in, once, and then writes nothing more."""
    body = resource(model=CACHE)
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    job = next(o for k, o in kube.objects.items() if k[1] == "Job")
    cache_key_ = job["metadata"]["labels"]["serving.kimik3.io/cache-key"]
    kube.put_job_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "k3-download-x-1",
                "namespace": "llm",
                "labels": {"serving.kimik3.io/cache-key": cache_key_},
            },
            "spec": {"nodeName": "cpu-1"},
            "status": {"phase": "Running", "podIP": "10.0.0.9"},
        }
    )
    reconcile(kube, key_of(body), Context(clock=clock))
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm")
    assert stored["status"]["modelCache"]["phase"] == "Downloading"
    answers = iter([{"phase": "Downloading", "bytesDone": 40, "bytesTotal": 100}] * 2)
    seen: list[str] = []

    def fetch(url: str) -> str:
        seen.append(url)
        return json.dumps(next(answers))

    times = iter([10.0, 20.0])
    reader = ProgressReader(fetch=fetch, clock=lambda: next(times))
    kube.writes.clear()
    assert reader.tick(kube, stored), "the numbers moved: the resource is to be reconciled"
    assert seen == ["http://10.0.0.9:8090/progress"]
    assert kube.writes == [], "the reader writes nothing"
    readings = Readings(progress=reader.reading(key_of(stored)))
    reconcile(kube, key_of(stored), Context(clock=clock, readings=readings))
    written = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]["modelCache"]
    assert written["bytesDone"] == 40 and written["progress"] == "Downloading 40% of 100 B"
    assert [w[0] for w in kube.writes] == ["patch_status"], "one status write"
    kube.writes.clear()
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm")
    assert not reader.tick(kube, stored)
    readings = Readings(progress=reader.reading(key_of(stored)))
    reconcile(kube, key_of(stored), Context(clock=clock, readings=readings))
    assert kube.writes == []


# --- reconcile ------------------------------------------------------------------------------


def _applied_kinds(kube: FakeKube) -> set[str]:
    return {w[1] for w in kube.writes if w[0] == "apply"}


def test_no_serving_pod_before_the_cache_is_ready(kube: FakeKube) -> None:
    body = resource(model=CACHE)
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert "LeaderWorkerSet/k3" not in result.applied
    assert {"PersistentVolumeClaim/k3-model-cache", "ConfigMap/k3-download-script"} <= set(
        result.applied
    )
    assert any(a.startswith("Job/k3-download-") for a in result.applied)
    status = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]
    assert status["modelCache"]["phase"] == "Pending"
    assert status["startup"]["phase"] == "WaitingForCache"
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "WaitingForModelCache"
    cached = next(c for c in status["conditions"] if c["type"] == "ModelCached")
    assert cached["status"] == "Unknown"

    # The download finishes: now the LeaderWorkerSet comes, with the cache mounted.
    _download_done(kube, {"phase": "Ready", "bytesTotal": 10**12, "repos": []})
    result = reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm")), Context(clock=clock)
    )
    assert "LeaderWorkerSet/k3" in result.applied
    status = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]
    assert status["modelCache"]["phase"] == "Ready" and status["modelCache"]["bytesTotal"] == 10**12
    assert next(c for c in status["conditions"] if c["type"] == "ModelCached")["status"] == "True"
    settle(kube, ("llm", "k3"), Context(clock=clock))
    kube.writes.clear()
    again = reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm")), Context(clock=clock)
    )
    assert again.applied == [] and kube.writes == []


def test_a_new_revision_is_cached_before_the_rollout(kube: FakeKube) -> None:
    body = resource(model=CACHE)
    body["status"] = {}
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm")
    old_job = next(o for k, o in kube.objects.items() if k[1] == "Job")
    stored["status"]["modelCache"] = {
        **stored["status"]["modelCache"],
        "phase": "Ready",
        "bytesTotal": 5,
    }
    kube.put(stored)
    reconcile(kube, key_of(stored), Context(clock=clock))
    lws_before = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
    assert lws_before is not None

    changed = kube.get(API, "KimiK3Deployment", "k3", "llm")
    changed["spec"]["model"] = {**CACHE, "revision": "v2"}
    changed["metadata"]["generation"] = 2
    kube.put(changed)
    kube.writes.clear()
    result = reconcile(kube, key_of(changed), Context(clock=clock))
    assert "LeaderWorkerSet/k3" not in result.applied, "the old revision keeps serving"
    assert f"Job/{old_job['metadata']['name']}" in result.deleted
    assert kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm") == lws_before
    status = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]
    assert status["modelCache"]["phase"] == "Pending"


def test_status_view_draws_the_download() -> None:
    text = render_status(
        {
            "metadata": {"name": "k3", "namespace": "llm"},
            "status": {
                "startup": {"phase": "Downloading", "message": "the download Job runs"},
                "modelCache": {
                    "phase": "Downloading",
                    "claimName": "k3-model-cache",
                    "bytesDone": 425_000_000_000,
                    "bytesTotal": 1_700_000_000_000,
                    "bytesPerSecond": 500_000_000,
                    "etaSeconds": 2550,
                },
            },
        }
    )
    assert "Start-up: Downloading" in text
    assert "Model cache: Downloading in k3-model-cache" in text
    assert "25.0%  425.0 of 1700.0 GB  500 MB/s  about 42m30s left" in text
    assert "██████████" in text
    old = render_status(
        {
            "metadata": {"name": "k3", "namespace": "llm"},
            "status": {
                "modelCache": {
                    "phase": "Ready",
                    "claimName": "k3-model-cache",
                    "oldRevisions": ["moonshotai/Kimi-K3@0123456789ab"],
                    "oldBytes": 1_600_000_000_000,
                }
            },
        }
    )
    assert "old revisions kept until the rollout completes: moonshotai/Kimi-K3@0123456789ab" in old
    assert "(1600.0 GB)" in old
    freed = render_status(
        {
            "metadata": {"name": "k3", "namespace": "llm"},
            "status": {"modelCache": {"phase": "Ready", "bytesFreed": 1_600_000_000_000}},
        }
    )
    assert "old revisions collected: 1600.0 GB freed" in freed


def test_a_replaced_claim_is_an_empty_volume_filled_again_before_serving(
    kube: FakeKube,
) -> None:
    """The claim deleted and made anew (a new uid) while status.modelCache says Ready: the
    cache is not Ready, the download runs again, and the LeaderWorkerSet is held at zero
    groups, so no serving pod starts offline on the empty volume."""
    body = resource(model=CACHE, replicas=2)
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    claim_key = ("v1", "PersistentVolumeClaim", "llm", "k3-model-cache")
    kube.objects[claim_key]["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z"
    first_uid = kube.objects[claim_key]["metadata"]["uid"]
    job = next(o for k, o in kube.objects.items() if k[1] == "Job")
    key = job["metadata"]["labels"]["serving.kimik3.io/cache-key"]
    old_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "dl-1",
            "namespace": "llm",
            "creationTimestamp": "2026-12-01T00:01:00Z",
            "labels": {"serving.kimik3.io/cache-key": key},
        },
        "spec": {"nodeName": "cpu-1"},
        "status": {"phase": "Succeeded", **_terminated({"phase": "Ready", "bytesTotal": 10})},
    }
    kube.put_job_pod(old_pod)
    reconcile(kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm")), Context(clock=clock))
    cache = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]["modelCache"]
    assert (cache["phase"], cache["claimUID"]) == ("Ready", first_uid)
    lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
    assert lws["spec"]["replicas"] == 2

    # Someone deletes the claim; the operator makes a new one, which the API gives a new uid.
    kube.delete("v1", "PersistentVolumeClaim", "k3-model-cache", "llm")
    reconcile(kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm")), Context(clock=clock))
    kube.objects[claim_key]["metadata"].update(
        {"uid": "claim-2", "creationTimestamp": "2026-12-02T00:00:00Z"}
    )
    result = reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm")), Context(clock=clock)
    )
    status = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]
    assert status["modelCache"]["phase"] != "Ready"
    assert status["modelCache"]["claimUID"] == "claim-2"
    assert next(c for c in status["conditions"] if c["type"] == "ModelCached")["status"] != "True"
    assert any(d.startswith("Job/k3-download-") for d in result.deleted), "filled again"
    lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
    assert lws["spec"]["replicas"] == 0, "held: no serving pod on an empty volume"
    # Made again at once here; on the API server, once the deletion has gone through.
    again = reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm")), Context(clock=clock)
    )
    assert any(a.startswith("Job/k3-download-") for a in result.applied + again.applied)


# --- the download's settings, deadline and failure policy ---------------------------------


def test_download_settings_reach_the_script_and_bound_the_job() -> None:
    spec = spec_of(
        model={**CACHE, "cache": {**CACHE["cache"], "connections": 32, "chunkSize": "64Mi"}}
    )
    job = build_download_job(spec, OWNER)
    request = json.loads(_container(job)["args"][0])
    assert request["mode"] == "fill"
    assert (request["connections"], request["chunkBytes"]) == (32, 64 * 2**20)
    # 1800Gi at the minimum rate of 50 MB/s, plus the slack: the Job ends whatever the Hub does.
    deadline = 600 + 1800 * 2**30 // 50_000_000
    assert job["spec"]["activeDeadlineSeconds"] == request["deadlineSeconds"] == deadline
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "download", "operator": "In", "values": [3]},
    }
    assert rules[1]["action"] == "Ignore"
    # How it is fetched is not what is fetched: the same cache, no new download.
    assert cache_key(spec, OWNER) == cache_key(spec_of(model=CACHE), OWNER)


@pytest.mark.parametrize(
    ("cache", "path"),
    [
        ({"connections": 0}, "spec.model.cache.connections"),
        ({"connections": 65}, "spec.model.cache.connections"),
        ({"chunkSize": "512Ki"}, "spec.model.cache.chunkSize"),
        ({"chunkSize": "2Gi"}, "spec.model.cache.chunkSize"),
        ({"chunkSize": "big"}, "spec.model.cache.chunkSize"),
    ],
)
def test_download_settings_out_of_range_are_refused(cache: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"model": {"cache": cache}})
    assert err.value.path == path and err.value.fix


def test_a_volume_too_small_names_the_size_needed_and_the_fix() -> None:
    report = {
        "phase": "Failed",
        "final": True,
        "reason": "VolumeTooSmall",
        "problems": ["the model cache volume is too small: ... it needs at least 2.9 TiB (2970Gi)"],
    }
    failed = _state(
        job={
            "status": {
                "conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]
            }
        },
        pods=[_pod("p1", phase="Failed", **_terminated(report, 3))],
    )
    assert (failed.phase, failed.reason) == ("Failed", "ModelCacheTooSmall")
    assert "needs at least 2.9 TiB (2970Gi)" in failed.message
    assert "grow the claim" in failed.message and "delete the Job" in failed.message


# --- old revisions ------------------------------------------------------------------------

OLD = "moonshotai/Kimi-K3@0123456789ab"


def _serving_pod(name: str, component: str, group: str, worker: str, *, created: str) -> Any:
    from kimik3_operator.api import constants as c
    from kimik3_operator.builders.common import labels

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "creationTimestamp": created,
            "labels": {
                **labels(OWNER, component),
                c.LWS_GROUP_INDEX_LABEL: group,
                c.LWS_WORKER_INDEX_LABEL: worker,
            },
        },
        "spec": {"nodeName": f"gpu-{worker}"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_wants_collection_only_after_the_rollout_to_this_revision() -> None:
    from kimik3_operator.observation.model_cache import wants_collection

    ready = CacheState(
        "Ready", Reason.CACHE_READY, "", "k1", "c", "j", ready_at=NOW, old_revisions=(OLD,)
    )
    new = [
        _serving_pod("k3-0", "leader", "0", "0", created="2026-12-03T00:01:00Z"),
        _serving_pod("k3-0-1", "worker", "0", "1", created="2026-12-03T00:01:00Z"),
    ]
    old_pod = _serving_pod("k3-0-1", "worker", "0", "1", created="2026-12-02T23:59:00Z")
    unready = {**new[1], "status": {"phase": "Running", "conditions": []}}
    assert wants_collection(ready, new, replicas=1, ready_replicas=1)
    assert not wants_collection(ready, [new[0], old_pod], 1, 1), "a pod may read the old one"
    assert not wants_collection(ready, [new[0], unready], 1, 1)
    assert not wants_collection(ready, new, replicas=2, ready_replicas=1)
    assert not wants_collection(dataclasses.replace(ready, old_revisions=()), new, 1, 1)
    assert not wants_collection(dataclasses.replace(ready, ready_at=""), new, 1, 1)


def _download_done(kube: FakeKube, report: dict[str, Any]) -> None:
    job = next(o for k, o in kube.objects.items() if k[1] == "Job" and "-download-" in k[3])
    key = job["metadata"]["labels"]["serving.kimik3.io/cache-key"]
    kube.put_job_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "dl-1",
                "namespace": "llm",
                "labels": {"serving.kimik3.io/cache-key": key},
            },
            "spec": {"nodeName": "cpu-1"},
            "status": {"phase": "Succeeded", **_terminated(report)},
        }
    )


def _again(kube: FakeKube) -> Any:
    return reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm")), Context(clock=clock)
    )


def test_old_revisions_are_collected_once_the_rollout_is_complete(kube: FakeKube) -> None:
    kube.put(resource(model=CACHE))
    _again(kube)
    commit = "c0ffee" * 6 + "c0ff"
    _download_done(
        kube,
        {
            "phase": "Ready",
            "bytesTotal": 10**12,
            "repos": [{"repo": "moonshotai/Kimi-K3", "commit": commit}],
            "oldRevisions": [OLD],
            "oldBytes": 9 * 10**11,
        },
    )
    _again(kube)
    cache = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]["modelCache"]
    assert cache["phase"] == "Ready" and cache["readyAt"] == NOW
    assert cache["oldRevisions"] == [OLD] and cache["oldBytes"] == 9 * 10**11
    assert not [k for k in kube.objects if k[1] == "Job" and "-collect-" in k[3]], (
        "nothing is collected while no pod serves the new revision"
    )

    # The rollout completes: both pods of the group made after the cache was Ready.
    for pod in (
        _serving_pod("k3-0", "leader", "0", "0", created="2026-12-03T00:05:00Z"),
        _serving_pod("k3-0-1", "worker", "0", "1", created="2026-12-03T00:05:00Z"),
    ):
        kube.put(pod)
    result = _again(kube)
    collect = [o for k, o in kube.objects.items() if k[1] == "Job" and "-collect-" in k[3]]
    assert len(collect) == 1 and any(a.startswith("Job/k3-collect-") for a in result.applied)
    request = json.loads(_container(collect[0])["args"][0])
    assert request == {
        "mode": "collect",
        "keep": [{"repo": "moonshotai/Kimi-K3", "commit": commit}],
    }
    volume = next(
        v for v in collect[0]["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-cache"
    )
    assert volume["persistentVolumeClaim"] == {"claimName": "k3-model-cache", "readOnly": False}

    # Its report: the bytes freed, nothing old left, and no second collection.
    key = collect[0]["metadata"]["labels"]["serving.kimik3.io/collect-key"]
    kube.put_job_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "collect-1",
                "namespace": "llm",
                "creationTimestamp": "2026-12-03T00:06:00Z",
                "labels": {
                    "app.kubernetes.io/instance": "k3",
                    "app.kubernetes.io/managed-by": "kimik3-operator",
                    "app.kubernetes.io/component": "collect",
                    "serving.kimik3.io/collect-key": key,
                },
            },
            "spec": {"nodeName": "cpu-1"},
            "status": {
                "phase": "Succeeded",
                **_terminated({"phase": "Collected", "bytesFreed": 9 * 10**11, "removed": [OLD]}),
            },
        }
    )
    _again(kube)
    cache = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]["modelCache"]
    assert cache["bytesFreed"] == 9 * 10**11
    assert "oldRevisions" not in cache and "oldBytes" not in cache
    kube.writes.clear()
    assert _again(kube).applied == [] and kube.writes == []


def test_a_claim_somebody_else_named_is_never_collected(kube: FakeKube) -> None:
    kube.put(resource(model={"cache": {"claimName": "shared-weights"}}))
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "shared-weights", "namespace": "llm", "uid": "claim-1"},
            "status": {"phase": "Bound"},
        }
    )
    _again(kube)
    _download_done(
        kube,
        {
            "phase": "Ready",
            "bytesTotal": 10,
            "repos": [{"repo": "moonshotai/Kimi-K3", "commit": "a" * 40}],
            "oldRevisions": [OLD],
            "oldBytes": 10,
        },
    )
    _again(kube)
    for pod in (
        _serving_pod("k3-0", "leader", "0", "0", created="2026-12-03T00:05:00Z"),
        _serving_pod("k3-0-1", "worker", "0", "1", created="2026-12-03T00:05:00Z"),
    ):
        kube.put(pod)
    _again(kube)
    assert not [k for k in kube.objects if k[1] == "Job" and "-collect-" in k[3]]
    cache = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]["modelCache"]
    assert cache["oldRevisions"] == [OLD], "still reported, for whoever owns the claim"


def test_one_pod_without_a_cache_is_not_warned_about() -> None:
    from kimik3_operator.observation.model_cache import every_pod_downloads

    assert every_pod_downloads(spec_of(parallelism={"tensor": 8})) is None
    assert every_pod_downloads(spec_of(model=CACHE)) is None
    assert every_pod_downloads(spec_of(model={"source": {"pvc": {"claimName": "w"}}})) is None
    warned = every_pod_downloads(spec_of(parallelism={"tensor": 8}, replicas=3))
    assert warned is not None and "each of the 3 serving pods" in warned.message


@pytest.mark.parametrize(
    "report",
    [
        {"phase": "Ready", "bytesTotal": "1234"},
        {"phase": "Ready", "bytesTotal": 1234, "repos": ["moonshotai/Kimi-K3"]},
        {"phase": "Ready", "bytesTotal": 1234, "repos": [{"repo": ["x"], "commit": "c"}]},
        {"phase": "Ready", "bytesTotal": -1},
        {"phase": ["Ready"]},
        {"phase": "Ready", "oldRevisions": "abc"},
        {"phase": "Failed", "problems": [{"file": "x"}]},
        ["Ready"],
    ],
)
def test_a_malformed_report_is_no_report_and_fails_nothing(report: Any) -> None:
    """The download pod runs the user's image: what it writes is checked before it is read."""
    state = _state(pods=[_pod("p1", phase="Succeeded", **_terminated(report))])
    assert not state.ready
    assert state.phase == "Downloading"
