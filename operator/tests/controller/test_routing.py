"""spec.routing: the InferencePool of the routable leaders and its endpoint picker, and which
groups the operator keeps in the pool (pure: decide and routing_plan)."""

from __future__ import annotations

from typing import Any

import pytest
from decide_support import owned, said, snapshot, written

from conftest import spec_of
from kimik3_operator.api import constants as c
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.types import SpecError
from kimik3_operator.builders.children import desired_children
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.routing import PickerSettings, picker_args
from kimik3_operator.controller.decide import decide
from kimik3_operator.controller.routing import (
    GroupInput,
    RoutingInput,
    canary_groups,
    group_acceptance,
    routing_plan,
)
from kimik3_operator.observation.acceptance import Acceptance as Aggregate
from kimik3_operator.observation.acceptance import AcceptanceReading, LeaderSeries, Snapshot
from kimik3_operator.observation.readings import Readings

ROUTED = {"parallelism": {"tensor": 8}, "routing": {}}
POOL = (f"{c.INFERENCE_GROUP}/{c.INFERENCE_VERSION}", "InferencePool", "k3")
PICKER = ("apps/v1", "Deployment", "k3-epp")


def leader(group: int, ready: bool = True, label: str = "") -> dict[str, Any]:
    labels = {
        c.LABEL_INSTANCE: "k3",
        c.LABEL_COMPONENT: c.COMPONENT_LEADER,
        c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
        c.LWS_GROUP_INDEX_LABEL: str(group),
    }
    if label:
        labels[c.LABEL_ROUTABLE] = label
    return {
        "metadata": {
            "name": f"k3-{group}",
            "uid": f"pod-{group}",
            "labels": labels,
            "ownerReferences": [{"kind": "StatefulSet", "name": "k3", "controller": True}],
        },
        "spec": {"nodeName": f"node-{group}"},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def series(group: int, rate: float, drafts: float = 100.0) -> LeaderSeries:
    """A leader's two samples 60 s apart: ``drafts`` drafts of 4 tokens, ``rate`` accepted."""
    first = Snapshot(0.0, 0.0, 0.0, 0.0)
    last = Snapshot(60.0, drafts, drafts * 4, drafts * 4 * rate)
    return LeaderSeries(str(group), "h", (first, last))


def readings(rates: dict[int, float]) -> Readings:
    reading = AcceptanceReading(
        acceptance=Aggregate(None, None, None, 0.0, False),
        at=60.0,
        window_seconds=300.0,
        series={f"pod-{g}": series(g, r) for g, r in rates.items()},
    )
    return Readings(acceptance=reading)


def routed(
    pods: list[dict[str, Any]],
    rates: dict[int, float] | None = None,
    picker_ready: bool = True,
    status: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    **fields: Any,
) -> Any:
    live = {PICKER: owned("Deployment", "k3-epp", "apps/v1", status={"readyReplicas": 1})}
    if not picker_ready:
        live = {}
    fields.setdefault("pool_installed", True)
    snap = snapshot(
        {**ROUTED, "replicas": len(pods), **(extra or {})},
        status=status,
        live=live,
        pods=tuple(pods),
        readings=readings(rates or {}),
        **fields,
    )
    return decide(snap)


def labels_written(decision: Any) -> dict[str, str]:
    return {
        w.ref[2]: w.body["metadata"]["labels"][c.LABEL_ROUTABLE]
        for w in decision.writes
        if w.verb == "patch" and w.ref[1] == "Pod"
    }


def test_the_pool_selects_this_deployments_routable_leaders_and_names_its_picker() -> None:
    decision = routed([leader(0)])
    pool = next(w.body for w in decision.writes if w.ref == POOL)
    assert pool["spec"]["selector"]["matchLabels"] == {
        c.LABEL_INSTANCE: "k3",
        c.LABEL_COMPONENT: c.COMPONENT_LEADER,
        c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
        c.LABEL_ROUTABLE: "true",
    }
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "k3-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    made = written(decision)
    for child in (
        "ServiceAccount/k3-epp",
        "RoleBinding/k3-epp",
        "ConfigMap/k3-epp",
        "Deployment/k3-epp",
        "Service/k3-epp",
        "InferencePool/k3",
        "PodMonitor/k3-epp",
    ):
        assert f"apply {child}" in made
    assert not any("HTTPRoute" in w for w in made), "no Gateway named"


def test_the_picker_runs_the_configured_image_bound_to_the_charts_role() -> None:
    settings = PickerSettings("registry.example/epp:v1.5.0", "ops-epp")
    children = desired_children(
        spec_of(**ROUTED), Owner("k3", "llm", "u"), parts=("routing",), picker=settings
    )
    by_kind = {child["kind"]: child for child in children}
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example/epp:v1.5.0"
    assert pod["serviceAccountName"] == "k3-epp"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "--pool-name=k3" in pod["containers"][0]["args"]
    assert "--pool-namespace=llm" in pod["containers"][0]["args"]
    assert by_kind["RoleBinding"]["roleRef"]["name"] == "ops-epp"
    assert by_kind["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "k3-epp", "namespace": "llm"}
    ]
    assert by_kind["ServiceAccount"]["automountServiceAccountToken"] is False
    assert picker_args(Owner("k3", "llm", "u"))[0] == "--pool-name=k3"


def test_a_named_gateway_gets_an_http_route_to_the_pool() -> None:
    spec = {"routing": {"gateway": {"name": "inference", "namespace": "gw", "sectionName": "http"}}}
    decision = routed([leader(0)], extra=spec, gateway_api=True)
    route = next(w.body for w in decision.writes if w.ref[1] == "HTTPRoute")
    assert route["spec"]["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "inference",
            "namespace": "gw",
            "sectionName": "http",
        }
    ]
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": c.INFERENCE_GROUP, "kind": "InferencePool", "name": "k3"}
    ]


def test_ready_leaders_are_labelled_routable_and_starting_ones_not() -> None:
    decision = routed([leader(0), leader(1, ready=False)], rates={0: 0.7})
    # The starting leader is left unlabelled: never routable yet, so no change to write.
    assert labels_written(decision) == {"k3-0": "true"}
    assert said(decision, "Routing") == ("True", "GroupsOutOfRouting")
    assert decision.status["routing"]["notRoutable"] == [{"group": 1, "reason": "starting"}]
    assert decision.status["routing"]["routableGroups"] == 1
    # A first label is no change of routing: no event.
    assert not [e for e in decision.events if e.reason == "GroupLeftRouting"]


def test_a_group_whose_acceptance_collapsed_leaves_with_an_event_and_rejoins() -> None:
    pods = [leader(0, label="true"), leader(1, label="true"), leader(2, label="true")]
    decision = routed(pods, rates={0: 0.7, 1: 0.72, 2: 0.1})
    assert labels_written(decision) == {"k3-2": "false"}
    left = [e for e in decision.events if e.reason == "GroupLeftRouting"]
    assert len(left) == 1 and "group 2" in left[0].message and "0.10" in left[0].message
    assert "median group's 0.70" in left[0].message
    assert said(decision, "Routing") == ("True", "GroupsOutOfRouting")

    pods[2] = leader(2, label="false")
    back = routed(pods, rates={0: 0.7, 1: 0.72, 2: 0.68})
    assert labels_written(back) == {"k3-2": "true"}
    assert [e.reason for e in back.events if e.type == "Routing"][:1] == ["GroupRejoinedRouting"]
    assert said(back, "Routing") == ("True", "RoutingActive")


@pytest.mark.parametrize(
    ("phase", "why"), [("Canary", "a canary judges it"), ("Held", "its canary failed")]
)
def test_groups_a_canary_judges_or_failed_on_are_out(phase: str, why: str) -> None:
    judged, failed = canary_groups({"phase": phase, "canaryGroups": [2]})
    groups = tuple(GroupInput(g, f"k3-{g}", True, "true", 0.7) for g in range(3))
    found = routing_plan(RoutingInput(groups, 0.5, judged, failed, picker_ready=True))
    assert found.routable == (0, 1) and found.out == {2: why}
    assert [(x.pod, x.value, x.change) for x in found.labels] == [("k3-2", "false", "left")]
    assert canary_groups({"phase": "Complete", "canaryGroups": [2]}) == (frozenset(), frozenset())


def test_the_last_routable_group_never_leaves() -> None:
    found = routing_plan(
        RoutingInput(
            groups=(
                GroupInput(0, "k3-0", True, "true", 0.2),
                GroupInput(1, "k3-1", True, "true", 0.4),
            ),
            max_acceptance_drop=0.5,
            canary_failed=frozenset({0, 1}),
            picker_ready=True,
        )
    )
    assert found.routable == (1,) and found.kept == (1,)
    assert "kept in: the last routable group" in found.condition.message


def test_one_group_alone_has_no_baseline_to_collapse_against() -> None:
    found = routing_plan(
        RoutingInput((GroupInput(0, "k3-0", True, "true", 0.05),), 0.5, picker_ready=True)
    )
    assert found.routable == (0,) and found.labels == ()


def test_leaders_of_someone_elses_pods_are_never_labelled() -> None:
    stranger = leader(1)
    stranger["metadata"]["ownerReferences"] = []
    decision = routed([leader(0), stranger])
    assert labels_written(decision) == {"k3-0": "true"}


def test_the_condition_says_why_nothing_routes() -> None:
    missing = routed([leader(0)], pool_installed=False)
    assert said(missing, "Routing") == ("False", "InferencePoolNotInstalled")
    assert not [w for w in missing.writes if w.ref == POOL]
    waiting = routed([leader(0)], picker_ready=False)
    assert said(waiting, "Routing") == ("False", "EndpointPickerNotReady")


def test_a_gateway_that_refused_the_pool_is_named() -> None:
    pool = owned(
        "InferencePool",
        "k3",
        POOL[0],
        status={
            "parents": [
                {
                    "parentRef": {"name": "inference"},
                    "conditions": [
                        {"type": "Accepted", "status": "True", "reason": "Accepted"},
                        {
                            "type": "ResolvedRefs",
                            "status": "False",
                            "reason": "InvalidExtensionRef",
                            "message": "no such Service",
                        },
                    ],
                }
            ]
        },
    )
    picker = owned("Deployment", "k3-epp", "apps/v1", status={"readyReplicas": 1})
    snap = snapshot(
        {**ROUTED, "replicas": 1},
        live={POOL: pool, PICKER: picker},
        pods=(leader(0),),
        pool_installed=True,
    )
    decision = decide(snap)
    status, reason = said(decision, "Routing")
    assert (status, reason) == ("False", "PoolNotAccepted")
    message = next(x for x in decision.status["conditions"] if x["type"] == "Routing")["message"]
    assert "inference" in message and "InvalidExtensionRef" in message


def test_removing_routing_deletes_its_children() -> None:
    live = {
        POOL: owned("InferencePool", "k3", POOL[0]),
        PICKER: owned("Deployment", "k3-epp", "apps/v1"),
        ("v1", "ServiceAccount", "k3-epp"): owned("ServiceAccount", "k3-epp"),
    }
    snap = snapshot({"parallelism": {"tensor": 8}}, live=live, pool_installed=True)
    made = written(decide(snap))
    for child in ("InferencePool/k3", "Deployment/k3-epp", "ServiceAccount/k3-epp"):
        assert f"delete {child}" in made


def test_a_second_reconcile_writes_nothing() -> None:
    pods = [leader(0), leader(1)]
    first = routed(pods, rates={0: 0.7, 1: 0.7})
    children = {
        w.ref: {**w.body, "metadata": {**w.body["metadata"], "uid": "u"}}
        for w in first.writes
        if w.verb == "apply"
    }
    children[PICKER]["status"] = {"readyReplicas": 1}
    labelled = [leader(0, label="true"), leader(1, label="true")]
    snap = snapshot(
        {**ROUTED, "replicas": 2},
        status=first.status,
        live=children,
        pods=tuple(labelled),
        readings=readings({0: 0.7, 1: 0.7}),
        pool_installed=True,
    )
    again = decide(snap)
    assert [w for w in written(again) if "LeaderWorkerSet" not in w] == []


def test_group_acceptance_needs_enough_drafts() -> None:
    found = group_acceptance([series(0, 0.6), series(1, 0.6, drafts=3)], 300.0)
    assert found == {0: pytest.approx(0.6)}


@pytest.mark.parametrize(
    ("routing", "field"),
    [
        ({"maxAcceptanceDrop": 1.0}, "spec.routing.maxAcceptanceDrop"),
        ({"maxAcceptanceDrop": 0}, "spec.routing.maxAcceptanceDrop"),
        ({"gateway": {"name": "Not_A_Name"}}, "spec.routing.gateway.name"),
        ({"gateway": {"name": "gw", "namespace": "a.b"}}, "spec.routing.gateway.namespace"),
        ({"failureMode": "Sometimes"}, "spec.routing.failureMode"),
    ],
)
def test_bad_routing_is_refused_naming_the_field(routing: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec({**ROUTED, "routing": routing})
    assert raised.value.path == field


def test_removing_routing_drops_its_condition_and_status() -> None:
    first = routed([leader(0)])
    assert "routing" in first.status
    snap = snapshot(
        {"parallelism": {"tensor": 8}, "replicas": 1},
        status=first.status,
        pods=(leader(0),),
        pool_installed=True,
    )
    after = decide(snap)
    assert after.status_patch.get("routing", "kept") is None
    assert not [x for x in after.status["conditions"] if x["type"] == "Routing"]


def test_kimik3_status_shows_the_routable_groups_and_why_others_are_out() -> None:
    from kimik3_operator.status_view import render_status

    pods = [leader(0, label="true"), leader(1, label="true"), leader(2, label="true")]
    decision = routed(pods, rates={0: 0.7, 1: 0.72, 2: 0.1})
    shown = render_status(
        {"metadata": {"name": "k3", "namespace": "llm"}, "status": decision.status}
    )
    assert "Routing: 2 group(s) routable" in shown
    assert "group 2  out: acceptance 0.10" in shown


def worker(group: int, ready: bool = True) -> dict[str, Any]:
    pod = leader(group, ready)
    pod["metadata"]["name"] = f"k3-{group}-1"
    pod["metadata"]["labels"][c.LABEL_COMPONENT] = c.COMPONENT_WORKER
    pod["metadata"]["ownerReferences"] = [
        {"kind": "StatefulSet", "name": f"k3-{group}", "controller": True}
    ]
    return pod


def test_a_group_serves_only_with_every_pod_ready() -> None:
    """Two nodes a group: a Ready leader whose worker is missing or not Ready is starting."""
    two_nodes = {"parallelism": {"tensor": 16}}
    pods = [leader(0), worker(0), leader(1), worker(1, ready=False), leader(2)]
    decision = routed(pods, extra={**two_nodes, "replicas": 3})
    assert labels_written(decision) == {"k3-0": "true"}
    assert decision.status["routing"]["notRoutable"] == [
        {"group": 1, "reason": "starting"},
        {"group": 2, "reason": "starting"},
    ]
