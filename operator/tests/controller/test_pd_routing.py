"""Routing a prefill/decode pair: the routing sidecar in front of each decode leader, llm-d's
P/D router in place of the Inference Extension's picker, and the routable label decided per
role (pure: the builders and decide)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from decide_support import owned, said, snapshot

from conftest import spec_of
from kimik3_operator.api import constants as c
from kimik3_operator.builders.children import desired_children
from kimik3_operator.builders.routing import PickerSettings
from kimik3_operator.builders.sidecar import SIDECAR_NAME
from kimik3_operator.controller.decide import decide
from kimik3_operator.controller.snapshot import DS_API
from kimik3_operator.observation.acceptance import Acceptance as Aggregate
from kimik3_operator.observation.acceptance import AcceptanceReading, LeaderSeries, Snapshot
from kimik3_operator.observation.readings import Readings
from kimik3_operator.runtime.readers import engine_port
from kimik3_operator.status_view import render_status
from test_disaggregation import DS, OWNER, PAIR, _pod, _reading, _roles

ROUTED_PAIR: dict[str, Any] = {**PAIR, "routing": {}}
PICKER = ("apps/v1", "Deployment", "k3-epp")
POOL = (f"{c.INFERENCE_GROUP}/{c.INFERENCE_VERSION}", "InferencePool", "k3")


def _templates(spec: dict[str, Any], role: str) -> dict[str, Any]:
    ds = desired_children(spec_of(**spec), OWNER, parts=("groups",))[0]
    template: dict[str, Any] = _roles(ds)[role]["leaderWorkerTemplate"]
    return template


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_decode_leader_serves_behind_the_routing_sidecar_on_the_service_port() -> None:
    pod = _templates(PAIR, "decode")["workerTemplate"]["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["name"] == SIDECAR_NAME
    assert sidecar["image"] == c.DEFAULT_ROUTING_SIDECAR_IMAGE
    # A native sidecar: started before the engine, kept running beside it.
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"] == [
        "--port=8000",
        "--vllm-port=8200",
        "--kv-connector=nixlv2",
        "--secure-proxy=false",
    ]
    assert sidecar["ports"] == [
        {"name": c.SIDECAR_PORT_NAME, "containerPort": 8000, "protocol": "TCP"}
    ]
    engine = pod["containers"][0]
    assert _flag(engine["args"], "--port") == "8200"
    assert {p["name"]: p["containerPort"] for p in engine["ports"]}["http"] == 8200
    # Its probes and its drain read the engine itself, not through the sidecar.
    assert engine["readinessProbe"]["httpGet"]["port"] == "http"
    drain = next(e["value"] for e in engine["env"] if e["name"] == "KIMIK3_DRAIN_URL")
    assert drain == "http://127.0.0.1:8200/metrics"
    context = sidecar["securityContext"]
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]} and context["readOnlyRootFilesystem"]
    assert sidecar["resources"]["limits"]["memory"]


def test_prefill_serves_on_the_service_port_with_no_sidecar() -> None:
    pod = _templates(PAIR, "prefill")["workerTemplate"]["spec"]
    assert "initContainers" not in pod
    assert _flag(pod["containers"][0]["args"], "--port") == "8000"


def test_a_multi_node_decode_role_has_the_sidecar_on_its_leader_only() -> None:
    spec = {
        **PAIR,
        "disaggregation": {
            **PAIR["disaggregation"],
            "decode": {"replicas": 1, "parallelism": {"tensor": 8, "pipeline": 2}},
        },
    }
    template = _templates(spec, "decode")
    assert [s["name"] for s in template["leaderTemplate"]["spec"]["initContainers"]] == [
        SIDECAR_NAME
    ]
    assert "initContainers" not in template["workerTemplate"]["spec"]


def test_a_service_port_of_the_engines_moves_the_engine_to_the_next() -> None:
    spec = {**PAIR, "service": {"port": 8200}}
    pod = _templates(spec, "decode")["workerTemplate"]["spec"]
    assert pod["initContainers"][0]["args"][:2] == ["--port=8200", "--vllm-port=8201"]
    assert _flag(pod["containers"][0]["args"], "--port") == "8201"


def test_the_sidecar_image_is_the_operators_setting() -> None:
    settings = PickerSettings(sidecar_image="registry.example/sidecar:v1")
    ds = desired_children(spec_of(**PAIR), OWNER, parts=("groups",), picker=settings)[0]
    pod = _roles(ds)["decode"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert pod["initContainers"][0]["image"] == "registry.example/sidecar:v1"


def test_the_service_targets_the_decode_leaders_sidecar() -> None:
    service = desired_children(spec_of(**PAIR), OWNER, parts=("serving",))[0]
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8000 and port["targetPort"] == c.SIDECAR_PORT_NAME
    plain = desired_children(spec_of(parallelism={"tensor": 8}), OWNER, parts=("serving",))[0]
    assert plain["spec"]["ports"][0]["targetPort"] == "http"


def test_a_pair_is_routed_by_llm_ds_router_with_its_pd_profiles() -> None:
    settings = PickerSettings(pd_image="registry.example/router:v0.10.0")
    children = desired_children(spec_of(**ROUTED_PAIR), OWNER, parts=("routing",), picker=settings)
    by_kind = {child["kind"]: child for child in children}
    deployment = by_kind["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/router:v0.10.0"
    config = yaml.safe_load(by_kind["ConfigMap"]["data"]["config.yaml"])
    assert config["apiVersion"] == "llm-d.ai/v1"
    profiles = {
        p["name"]: [x["pluginRef"] for x in p["plugins"]] for p in config["schedulingProfiles"]
    }
    assert profiles["prefill"][0] == "prefill-filter"
    assert profiles["decode"][0] == "decode-filter"
    plugins = {p["type"]: p.get("parameters") for p in config["plugins"]}
    assert plugins["disagg-profile-handler"] == {
        "deciders": {"prefill": "always-disagg-pd-decider"}
    }
    # Every referenced plugin is declared.
    assert {ref for refs in profiles.values() for ref in refs} <= set(plugins)
    # One pool of both roles' routable leaders: the router tells them apart by llm-d's label.
    selector = by_kind["InferencePool"]["spec"]["selector"]["matchLabels"]
    assert c.LABEL_ROLE not in selector and selector[c.LABEL_ROUTABLE] == "true"
    assert by_kind["InferencePool"]["spec"]["targetPorts"] == [{"number": 8000}]
    aggregated = desired_children(
        spec_of(parallelism={"tensor": 8}, routing={}), OWNER, parts=("routing",), picker=settings
    )
    picker = next(child for child in aggregated if child["kind"] == "Deployment")
    assert picker["spec"]["template"]["spec"]["containers"][0]["image"] == settings.image


def _routed_pair(pods: tuple[dict[str, Any], ...], rates: dict[str, float]) -> Any:
    live = {
        DS: owned("DisaggregatedSet", "k3", DS_API),
        PICKER: owned("Deployment", "k3-epp", "apps/v1", status={"readyReplicas": 1}),
    }
    return decide(
        snapshot(
            ROUTED_PAIR,
            live=live,
            ds_installed=True,
            pool_installed=True,
            pods=pods,
            readings=_reading(rates),
        )
    )


def _by_group(rates: dict[int, float], drafts: float = 100.0) -> Readings:
    """Each decode leader's two samples 60 s apart, keyed as the reader keys them."""
    series = {
        f"decode-{group}": LeaderSeries(
            str(group),
            "h",
            (Snapshot(0.0, 0.0, 0.0, 0.0), Snapshot(60.0, drafts, drafts * 4, drafts * 4 * rate)),
        )
        for group, rate in rates.items()
    }
    reading = AcceptanceReading(Aggregate(0.5, 3.0, None, drafts, True), 60.0, 300.0, series=series)
    return Readings(acceptance=reading)


def _labels(decision: Any) -> dict[str, str]:
    return {
        w.ref[2]: w.body["metadata"]["labels"][c.LABEL_ROUTABLE]
        for w in decision.writes
        if w.verb == "patch" and w.ref[1] == "Pod"
    }


def test_each_roles_ready_leaders_join_the_pool_and_a_starting_one_does_not() -> None:
    pods = (_pod("prefill", 0, True), _pod("decode", 0, True), _pod("decode", 1, False))
    decision = _routed_pair(pods, {})
    assert _labels(decision) == {"k3-abcd1234-prefill-0": "true", "k3-abcd1234-decode-0": "true"}
    section = decision.status["routing"]
    assert section["routableGroups"] == 2
    assert section["roles"]["decode"]["notRoutable"] == [{"group": 1, "reason": "starting"}]
    assert section["roles"]["prefill"]["routableGroups"] == 1
    assert said(decision, "Routing") == ("True", "GroupsOutOfRouting")
    shown = render_status({"metadata": {"name": "k3"}, "status": decision.status})
    assert "  prefill: 1 routable" in shown and "  decode group 1  out: starting" in shown


def test_a_decode_group_whose_acceptance_collapsed_leaves_and_prefill_never_does() -> None:
    pods = (
        _pod("prefill", 0, True),
        _pod("decode", 0, True),
        _pod("decode", 1, True),
        _pod("decode", 2, True),
    )
    spec = {**ROUTED_PAIR}
    spec["disaggregation"] = {**PAIR["disaggregation"], "decode": {"replicas": 3}}
    live = {
        DS: owned("DisaggregatedSet", "k3", DS_API),
        PICKER: owned("Deployment", "k3-epp", "apps/v1", status={"readyReplicas": 1}),
    }
    decision = decide(
        snapshot(
            spec,
            live=live,
            ds_installed=True,
            pool_installed=True,
            pods=pods,
            readings=_by_group({0: 0.7, 1: 0.72, 2: 0.1}),
        )
    )
    labels = _labels(decision)
    # Never routable before, it needs no "false": the pool selects "true" only.
    assert "k3-abcd1234-decode-2" not in labels and labels["k3-abcd1234-decode-0"] == "true"
    assert labels["k3-abcd1234-prefill-0"] == "true"
    out = decision.status["routing"]["roles"]["decode"]["notRoutable"]
    assert [o["group"] for o in out] == [2] and "acceptance 0.10" in out[0]["reason"]
    assert decision.status["routing"]["roles"]["prefill"]["notRoutable"] == []
    message = next(x["message"] for x in decision.status["conditions"] if x["type"] == "Routing")
    assert message.startswith("decode: ")


def test_a_routed_pair_with_every_group_in_says_so_per_role() -> None:
    pods = (_pod("prefill", 0, True), _pod("decode", 0, True), _pod("decode", 1, True))
    decision = _routed_pair(pods, {})
    assert said(decision, "Routing") == ("True", "RoutingActive")
    message = next(x["message"] for x in decision.status["conditions"] if x["type"] == "Routing")
    assert "1 prefill and 2 decode" in message


def test_a_decode_leader_is_scraped_on_its_engines_port() -> None:
    spec = spec_of(**PAIR)
    assert engine_port(_pod("decode", 0, True), spec) == 8200
    assert engine_port(_pod("prefill", 0, True), spec) == 8000
    assert engine_port(_pod("decode", 0, True), spec_of(parallelism={"tensor": 8})) == 8000


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_someone_elses_pod_with_the_role_label_is_never_labelled(role: str) -> None:
    stranger = _pod(role, 0, True)
    stranger["metadata"]["ownerReferences"] = []
    decision = _routed_pair((stranger,), {})
    assert _labels(decision) == {}
