"""decide() as a table: a snapshot in, a Decision out, with no API at all. Each row names
what the cluster holds and what the operator must then write and say."""

from __future__ import annotations

from typing import Any

import pytest
from decide_support import (
    CHILDREN,
    LWS,
    OWNER,
    SERVICE,
    said,
    snapshot,
    written,
)

from conftest import spec_of
from kimik3_operator.builders.model_cache import cache_claim_name
from kimik3_operator.controller.decide import decide
from kimik3_operator.controller.snapshot import Ref

ROWS = [
    pytest.param(
        {},
        {},
        ["apply LeaderWorkerSet/k3", "apply Service/k3", "apply PodMonitor/k3"],
        ("True", "WaitingForLeaderWorkerSet"),
        id="a new resource: its children, and Progressing",
    ),
    pytest.param(
        {"engine": {"image": "vllm/vllm-openai:v0.27.1"}},
        {},
        [],
        ("False", "PreflightFailed"),
        id="an image the preflight refuses: no child",
    ),
    pytest.param(
        {},
        {"live": {SERVICE: {"metadata": {"name": "k3", "ownerReferences": []}}}},
        [],
        ("False", "NameConflict"),
        id="a Service of that name is somebody else's: nothing is written",
    ),
    pytest.param(
        {"engine": {"addCapabilities": ["SYS_NICE"]}},
        {"namespace_labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
        [],
        ("False", "PodSecurityRefused"),
        id="a namespace that refuses the pods: no child",
    ),
    pytest.param(
        {"model": {"cache": {}}},
        {},
        [
            "create PersistentVolumeClaim/k3-model-cache",
            "apply ConfigMap/k3-download-script",
            "create Job/",
            "apply Service/k3",
            "apply PodMonitor/k3",
        ],
        ("True", "WaitingForModelCache"),
        id="the cache is empty: the download, and no LeaderWorkerSet yet",
    ),
]


@pytest.mark.parametrize(("spec", "snap", "writes", "progressing"), ROWS)
def test_decide(
    spec: dict[str, Any], snap: dict[str, Any], writes: list[str], progressing: tuple[str, str]
) -> None:
    decision = decide(snapshot(spec, **snap))
    # A download Job's name carries the cache key: compared up to it.
    assert [
        w.split("Job/")[0] + ("Job/" if "Job/" in w else "") for w in written(decision)
    ] == writes
    assert said(decision, "Progressing") == progressing
    assert decision.unread == ()


def test_a_name_the_store_does_not_hold_is_asked_of_the_server_first() -> None:
    decision = decide(snapshot(checked=False))
    assert set(CHILDREN) <= set(decision.unread)


def test_an_unchanged_child_is_not_written_and_a_changed_one_is_forced() -> None:
    first = decide(snapshot())
    live = {w.ref: dict(w.body) for w in first.writes}
    assert written(decide(snapshot(live=live))) == []
    stale = dict(live[SERVICE], spec={"ports": []})
    again = decide(snapshot(live={**live, SERVICE: stale}))
    assert written(again) == ["apply Service/k3"]
    assert again.writes[0].force, "forced over what this resource controls"


def test_parked_frees_the_gpus_and_the_preflight_outranks_it() -> None:
    decision = decide(snapshot(status=PARKED))
    lws = next(w for w in decision.writes if w.ref == LWS)
    assert lws.body["spec"]["replicas"] == 0
    assert said(decision, "Progressing") == ("False", "ParkedAfterStartupFailures")
    refused = decide(snapshot({"engine": {"image": "vllm/vllm-openai:v0.27.1"}}, status=PARKED))
    assert said(refused, "Progressing") == ("False", "PreflightFailed")


def test_a_claim_somebody_else_named_is_read_never_created() -> None:
    spec = {"model": {"cache": {"claimName": "shared-weights"}}}
    claim = cache_claim_name(OWNER, spec_of(**spec).model.cache)  # type: ignore[arg-type]
    decision = decide(snapshot(spec))
    assert claim == "shared-weights"
    assert not [w for w in decision.writes if w.ref[1] == "PersistentVolumeClaim"]


PARKED = {"startupFailures": {"generation": 1, "count": 3, "budget": 3, "parked": True}}


def test_where_two_stages_hold_the_higher_one_decides() -> None:
    """docs/architecture.md's precedence, pair by pair, down the table."""
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}
    foreign = {"metadata": {"name": "k3", "ownerReferences": []}}
    probe_map: Ref = ("v1", "ConfigMap", "k3-preflight-probe")
    cases = [
        (snapshot(invalid="metadata.name: too long"), "InvalidSpec"),
        (
            snapshot(
                {"engine": {"addCapabilities": ["SYS_NICE"]}},
                live={SERVICE: foreign},
                namespace_labels=restricted,
            ),
            "PodSecurityRefused",
        ),
        (
            snapshot({"preflight": {"probe": True}}, live={probe_map: foreign}),
            "NameConflict",
        ),
        (snapshot({"engine": {"image": "vllm/vllm-openai:v0.27.1"}}, status=PARKED), None),
        (snapshot({"model": {"cache": {}}}, status=PARKED), "ParkedAfterStartupFailures"),
        (snapshot({"model": {"cache": {}}}), "WaitingForModelCache"),
    ]
    reasons = [decide(snap).status["reason"] for snap, _ in cases]
    assert reasons[:3] == ["InvalidSpec", "PodSecurityRefused", "NameConflict"]
    assert reasons[3] not in ("ParkedAfterStartupFailures", "AsExpected"), "preflight first"
    assert said(decide(cases[3][0]), "Progressing") == ("False", "PreflightFailed")
    assert reasons[4:] == ["ParkedAfterStartupFailures", "WaitingForModelCache"]
