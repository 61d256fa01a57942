"""spec.disaggregation: the DisaggregatedSet of a prefill and a decode role, each role's KV
transfer on its pods, the roles' status, the transfer judged from the decode side's
acceptance, and the pair's preflight (pure: builders, decide, rules)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from decide_support import LWS, owned, said, snapshot, written

from conftest import spec_of
from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.types import SpecError
from kimik3_operator.builders.children import Part, desired_children
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.preflight_job import probe_request
from kimik3_operator.controller.decide import decide
from kimik3_operator.controller.snapshot import DS_API
from kimik3_operator.observation.acceptance import Acceptance as Aggregate
from kimik3_operator.observation.acceptance import AcceptanceReading, LeaderSeries, Snapshot
from kimik3_operator.observation.readings import Readings
from kimik3_operator.preflight.rules import Facts, run_rules
from kimik3_operator.preflight.table import load_table
from kimik3_operator.runtime.readers import scraped_leaders
from kimik3_operator.status_view import render_status

PAIR: dict[str, Any] = {
    "parallelism": {"tensor": 8},
    "disaggregation": {
        "prefill": {"replicas": 1, "extraArgs": ["--enforce-eager"]},
        "decode": {"replicas": 2, "parallelism": {"tensor": 1, "data": 8, "expert": True}},
    },
}
DS = (DS_API, "DisaggregatedSet", "k3")
GROUPS: tuple[Part, ...] = ("groups",)
SERVING: tuple[Part, ...] = ("serving",)
OWNER = Owner("k3", "llm", "uid-1")


def _roles(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r["spec"] for r in manifest["spec"]["roles"]}


def _container(role_spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = role_spec["leaderWorkerTemplate"]["workerTemplate"]["spec"][
        "containers"
    ][0]
    return container


def _transfer_config(args: list[str]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(args[args.index("--kv-transfer-config") + 1])
    return loaded


def test_each_role_is_built_from_its_own_groups_parallelism_and_arguments() -> None:
    ds = desired_children(spec_of(**PAIR), OWNER, parts=GROUPS)[0]
    assert (ds["apiVersion"], ds["kind"]) == (DS_API, "DisaggregatedSet")
    roles = _roles(ds)
    assert list(roles) == ["prefill", "decode"]
    prefill, decode = _container(roles["prefill"]), _container(roles["decode"])
    assert roles["prefill"]["replicas"] == 1 and roles["decode"]["replicas"] == 2
    assert prefill["args"][prefill["args"].index("--tensor-parallel-size") + 1] == "8"
    assert "--enforce-eager" in prefill["args"] and "--enforce-eager" not in decode["args"]
    assert decode["args"][decode["args"].index("--data-parallel-size") + 1] == "8"
    assert decode["args"][decode["args"].index("--tensor-parallel-size") + 1] == "1"
    assert "--enable-expert-parallel" in decode["args"]
    assert decode["resources"]["limits"]["nvidia.com/gpu"] == 8
    # The DisaggregatedSet rolls the roles: a partition of a role is refused by its webhook.
    for role in roles.values():
        assert "partition" not in role["rolloutStrategy"]["rollingUpdateConfiguration"]


def test_each_side_gets_its_kv_role_the_side_channel_on_its_ip_and_the_hybrid_settings() -> None:
    roles = _roles(desired_children(spec_of(**PAIR), OWNER, parts=GROUPS)[0])
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        container = _container(roles[role])
        config = _transfer_config(container["args"])
        assert config == {
            "kv_connector": "NixlConnector",
            "kv_role": kv_role,
            "kv_buffer_device": "cuda",
        }
        assert "--no-disable-hybrid-kv-cache-manager" in container["args"]
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "status.podIP"}
        }
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"
        assert env["VLLM_SSM_CONV_STATE_LAYOUT"]["value"] == "DS"
        assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in container["ports"]
        labels = roles[role]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
        assert labels[c.LABEL_ROLE] == role and labels[c.LLM_D_ROLE_LABEL] == role
    # Both sides draft with the same drafter: NIXL's compatibility hash includes it.
    speculative = {
        role: _container(roles[role])["args"][
            _container(roles[role])["args"].index("--speculative-config") + 1
        ]
        for role in roles
    }
    assert speculative["prefill"] == speculative["decode"]


def test_a_multi_node_role_gives_its_workers_the_transfer_too() -> None:
    spec = spec_of(
        parallelism={"tensor": 16},
        disaggregation={"prefill": {}, "decode": {"parallelism": {"tensor": 8}}},
    )
    roles = _roles(desired_children(spec, OWNER, parts=GROUPS)[0])
    template = roles["prefill"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert _transfer_config(worker["args"])["kv_role"] == "kv_producer"
    assert roles["decode"]["leaderWorkerTemplate"]["size"] == 1


def test_the_service_sends_requests_to_the_decode_leaders() -> None:
    service = desired_children(spec_of(**PAIR), OWNER, parts=SERVING)[0]
    assert service["spec"]["selector"][c.LABEL_ROLE] == "decode"
    plain = desired_children(spec_of(parallelism={"tensor": 8}), OWNER, parts=SERVING)[0]
    assert c.LABEL_ROLE not in plain["spec"]["selector"]


def test_a_long_name_is_cut_so_that_each_roles_leaderworkerset_fits() -> None:
    name = "a" * names.MAX_NAME_LENGTH
    short = names.disaggregated_set(name)
    assert len(short) <= names.MAX_SET_NAME
    # <set>-<8-character revision>-<role>, as the DisaggregatedSet's controller names them.
    assert len(f"{short}-12345678-prefill") <= names.MAX_NAME_LENGTH
    assert names.disaggregated_set(name) != names.disaggregated_set(name[:-1] + "b")
    assert names.disaggregated_set("k3") == "k3"


def test_decide_makes_the_set_instead_of_the_leaderworkerset_and_deletes_the_old_one() -> None:
    lws = owned("LeaderWorkerSet", "k3", f"{c.LWS_GROUP}/{c.LWS_VERSION}")
    decision = decide(snapshot(PAIR, live={LWS: lws}, ds_installed=True))
    assert "delete LeaderWorkerSet/k3" in written(decision)
    assert any(w.startswith("apply DisaggregatedSet/k3") for w in written(decision))
    assert not any(w.startswith("apply LeaderWorkerSet") for w in written(decision))
    assert said(decision, "Disaggregated") == ("False", "RoleNotReady")
    section = decision.status["disaggregation"]
    assert section["disaggregatedSet"] == "k3" and section["connector"] == "Nixl"
    assert [(r["name"], r["replicas"], r["readyReplicas"]) for r in section["roles"]] == [
        ("prefill", 1, 0),
        ("decode", 2, 0),
    ]
    # The decode side answers: its groups are the deployment's.
    assert decision.status["replicas"] == 2 and decision.status["ready"] == "0/2"


def test_without_the_disaggregatedset_crd_nothing_is_made_and_it_says_why() -> None:
    decision = decide(snapshot(PAIR, ds_installed=False))
    assert not any("DisaggregatedSet" in w for w in written(decision))
    assert said(decision, "Available") == ("False", "DisaggregatedSetNotInstalled")


def test_a_spec_that_drops_disaggregation_deletes_the_set_and_its_status() -> None:
    ds = owned("DisaggregatedSet", "k3", DS_API)
    status = {
        "disaggregation": {"disaggregatedSet": "k3"},
        "conditions": [
            {"type": "Disaggregated", "status": "True", "reason": "RolesReady", "message": ""},
            {"type": "TransferIntegrity", "status": "True", "reason": "Intact", "message": ""},
        ],
    }
    decision = decide(
        snapshot({"parallelism": {"tensor": 8}}, status=status, live={DS: ds}, ds_installed=True)
    )
    assert "delete DisaggregatedSet/k3" in written(decision)
    assert any(w.startswith("apply LeaderWorkerSet/k3") for w in written(decision))
    assert decision.status_patch.get("disaggregation", "kept") is None
    types = {x["type"] for x in decision.status["conditions"]}
    assert not types & {"Disaggregated", "TransferIntegrity"}


def _pod(role: str, group: int, ready: bool, uid: str = "") -> dict[str, Any]:
    set_name = f"k3-abcd1234-{role}"
    return {
        "metadata": {
            "name": f"{set_name}-{group}",
            "uid": uid or f"{role}-{group}",
            "labels": {
                c.LABEL_INSTANCE: "k3",
                c.LABEL_COMPONENT: c.COMPONENT_LEADER,
                c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
                c.LABEL_ROLE: role,
                c.LWS_NAME_LABEL: set_name,
                c.LWS_GROUP_INDEX_LABEL: str(group),
            },
            "ownerReferences": [{"kind": "StatefulSet", "name": set_name, "controller": True}],
        },
        "spec": {"nodeName": f"node-{role}-{group}"},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_each_roles_groups_are_counted_apart_and_both_must_serve() -> None:
    ds = owned("DisaggregatedSet", "k3", DS_API)
    pods = (_pod("prefill", 0, True), _pod("decode", 0, True), _pod("decode", 1, False))
    decision = decide(snapshot(PAIR, live={DS: ds}, ds_installed=True, pods=pods))
    roles = {r["name"]: r for r in decision.status["disaggregation"]["roles"]}
    assert roles["prefill"]["readyReplicas"] == 1 and roles["decode"]["readyReplicas"] == 1
    status, reason = said(decision, "Disaggregated")
    assert (status, reason) == ("False", "RoleNotReady")
    message = next(
        x["message"] for x in decision.status["conditions"] if x["type"] == "Disaggregated"
    )
    assert "prefill 1/1, decode 1/2" in message and "decode:" in message
    ready = (_pod("prefill", 0, True), _pod("decode", 0, True), _pod("decode", 1, True))
    decision = decide(snapshot(PAIR, live={DS: ds}, ds_installed=True, pods=ready))
    assert said(decision, "Disaggregated") == ("True", "RolesReady")
    assert said(decision, "Available")[0] == "True"
    # No prefill group: nothing is served disaggregated, so the pair is not available.
    no_prefill = (_pod("decode", 0, True), _pod("decode", 1, True))
    decision = decide(snapshot(PAIR, live={DS: ds}, ds_installed=True, pods=no_prefill))
    assert said(decision, "Available")[0] == "False"


def _reading(rates: dict[str, float], drafts: float = 100.0) -> Readings:
    series = {
        uid: LeaderSeries(
            "0",
            "h",
            (Snapshot(0.0, 0.0, 0.0, 0.0), Snapshot(60.0, drafts, drafts * 4, drafts * 4 * rate)),
        )
        for uid, rate in rates.items()
    }
    reading = AcceptanceReading(Aggregate(0.5, 3.0, None, drafts, True), 60.0, 60.0, series=series)
    return Readings(acceptance=reading)


def _transfer(pods: tuple[dict[str, Any], ...], readings: Readings, **status: Any) -> Any:
    ds = owned("DisaggregatedSet", "k3", DS_API)
    return decide(
        snapshot(
            PAIR, status=status, live={DS: ds}, ds_installed=True, pods=pods, readings=readings
        )
    )


def test_a_decode_side_accepting_far_less_than_the_aggregated_groups_did_is_named() -> None:
    pods = (_pod("prefill", 0, True), _pod("decode", 0, True), _pod("decode", 1, True))
    # The first reconcile after the spec turned disaggregated keeps the aggregated reading.
    before = {"speculative": {"acceptanceRate": 0.7}}
    decision = _transfer(pods, _reading({"decode-0": 0.2, "decode-1": 0.25}), **before)
    status, reason = said(decision, "TransferIntegrity")
    assert (status, reason) == ("False", "DrafterStateNotTransferred")
    baseline = decision.status["disaggregation"]["baseline"]
    assert baseline == {"acceptanceRate": 0.7, "source": "the aggregated groups' acceptance"}
    # Later reconciles hold the decode side to the kept baseline, whatever speculative says.
    later = {"disaggregation": {"baseline": baseline}, "speculative": {"acceptanceRate": 0.2}}
    decision = _transfer(pods, _reading({"decode-0": 0.65, "decode-1": 0.6}), **later)
    assert said(decision, "TransferIntegrity") == ("True", "TransferIntact")
    # Prefill leaders draft little (a prompt's one token); their rate never counts.
    decision = _transfer(pods, _reading({"prefill-0": 0.0, "decode-0": 0.66}), **later)
    assert said(decision, "TransferIntegrity") == ("True", "TransferIntact")


def test_without_enough_drafts_or_a_baseline_the_floor_is_the_specs() -> None:
    pods = (_pod("prefill", 0, True), _pod("decode", 0, True))
    decision = _transfer(pods, _reading({"decode-0": 0.1}, drafts=5.0))
    assert said(decision, "TransferIntegrity") == ("Unknown", "AwaitingDrafts")
    decision = _transfer(pods, _reading({"decode-0": 0.45}))
    # minAcceptanceRate 0.5 less maxAcceptanceDrop 0.2: 0.4.
    assert said(decision, "TransferIntegrity") == ("True", "TransferIntact")
    assert decision.status["disaggregation"]["baseline"]["source"] == (
        "spec.monitoring.minAcceptanceRate"
    )
    decision = _transfer(pods, _reading({"decode-0": 0.35}))
    assert said(decision, "TransferIntegrity")[0] == "False"


def test_only_the_sets_own_leaders_are_scraped_one_per_group_and_role() -> None:
    spec = spec_of(**PAIR)
    mine = [_pod("prefill", 0, True), _pod("decode", 0, True), _pod("decode", 1, True)]
    stranger = _pod("decode", 0, True, uid="x")
    stranger["metadata"]["labels"][c.LWS_NAME_LABEL] = "other-abcd1234-decode"
    stranger["metadata"]["ownerReferences"][0]["name"] = "other-abcd1234-decode"
    mislabelled = _pod("decode", 1, True, uid="y")
    mislabelled["metadata"]["labels"][c.LABEL_ROLE] = "prefill"
    chosen = scraped_leaders([*mine, stranger, mislabelled], "k3", spec)
    assert sorted(p["metadata"]["uid"] for p in chosen) == ["decode-0", "decode-1", "prefill-0"]


@pytest.mark.parametrize(
    ("sections", "path"),
    [
        ({"rollout": {"canary": {}}}, "spec.rollout.canary"),
        ({"autoscaling": {"maxReplicas": 2}}, "spec.autoscaling"),
        ({"scheduling": {"queueName": "q"}}, "spec.scheduling.queueName"),
        ({"engine": {"extraArgs": ["--kv-transfer-config={}"]}}, "spec.engine.extraArgs[0]"),
        (
            {"disaggregation": {"decode": {"extraArgs": ["--tensor-parallel-size=2"]}}},
            "spec.disaggregation.decode.extraArgs[0]",
        ),
        (
            {"disaggregation": {"prefill": {"extraArgs": ["--no-disable-hybrid-kv"]}}},
            "spec.disaggregation.prefill.extraArgs[0]",
        ),
        (
            {"disaggregation": {"decode": {"parallelism": {"tensor": 2, "data": 8}}}},
            "spec.disaggregation.decode.parallelism.data",
        ),
    ],
)
def test_what_a_pair_cannot_be_is_refused_naming_the_field(
    sections: dict[str, Any], path: str
) -> None:
    spec: dict[str, Any] = {"parallelism": {"tensor": 8}, "disaggregation": {}}
    for key, value in sections.items():
        spec[key] = {**spec.get(key, {}), **value}
    with pytest.raises(SpecError) as error:
        parse_spec(spec)
    assert str(error.value).startswith(path)


def test_data_parallel_engines_of_one_group_stay_on_one_node() -> None:
    with pytest.raises(SpecError, match=r"spec.parallelism.data"):
        parse_spec({"parallelism": {"tensor": 4, "data": 4}})
    spec = parse_spec({"parallelism": {"tensor": 2, "data": 4}})
    assert spec.gpus_per_replica == 8 and spec.nodes_per_replica == 1


def _kv_finding(**disaggregation: Any) -> Any:
    spec = spec_of(parallelism={"tensor": 8}, disaggregation=disaggregation)
    findings = run_rules(spec, Facts(load_table()))
    return next(f for f in findings if f.id == "kv-transfer"), findings


def test_the_pair_passes_where_the_releases_connector_takes_it() -> None:
    finding, _ = _kv_finding(prefill={}, decode={})
    assert (finding.status, finding.reason) == ("Pass", "KVTransferCompatible")
    assert "connector version 15" in finding.message


@pytest.mark.parametrize(
    ("disaggregation", "words"),
    [
        (
            {"prefill": {"parallelism": {"tensor": 8, "pipeline": 2}}},
            "prefill has pipeline parallelism 2",
        ),
        (
            {"prefill": {"parallelism": {"tensor": 8, "decodeContext": 2}}},
            "decode-context parallel sizes differ (prefill 2, decode 1)",
        ),
    ],
)
def test_a_pair_that_could_not_hand_over_fails_before_any_pod(
    disaggregation: dict[str, Any], words: str
) -> None:
    finding, _ = _kv_finding(**disaggregation)
    assert (finding.status, finding.reason) == ("Fail", "KVTransferIncompatible")
    assert words in finding.message


def test_a_hashed_flag_set_differently_waits_for_vllms_own_hash() -> None:
    finding, _ = _kv_finding(prefill={"extraArgs": ["--dtype", "half"]}, decode={})
    assert (finding.status, finding.reason) == ("Unknown", "KVTransferNeedsProbe")
    assert "--dtype (prefill 'half', decode 'unset'; hashed as dtype)" in finding.message


def test_a_release_whose_connector_lacks_the_hybrid_manager_fails_a_hybrid_target() -> None:
    table = load_table()
    data = json.loads(json.dumps(table.data))
    for release in data["releases"].values():
        release["kvTransfer"]["nixl"]["supportsHybridKvCacheManager"] = False
    spec = spec_of(parallelism={"tensor": 8}, disaggregation={"prefill": {}})
    patched = dataclasses.replace(table, data=data)
    finding = next(f for f in run_rules(spec, Facts(patched)) if f.id == "kv-transfer")
    assert finding.status == "Fail" and "hybrid KV-cache manager" in finding.message


def test_a_role_breaking_a_rule_is_named_and_shared_findings_are_said_once() -> None:
    _, findings = _kv_finding(prefill={"parallelism": {"tensor": 7}}, decode={})
    failed = [f for f in findings if f.status == "Fail"]
    assert failed and all(f.id.startswith("prefill/") for f in failed if f.id != "kv-transfer")
    assert any(f.message.startswith("prefill: ") for f in failed)
    ids = [f.id for f in findings]
    assert "vllm-version" in ids and "prefill/vllm-version" not in ids


def test_the_probe_parses_every_roles_command_line() -> None:
    spec = spec_of(**PAIR)
    serve = probe_request(spec)["serve"]
    assert sorted(serve) == ["leader", "prefill-leader"]
    assert _transfer_config(serve["leader"])["kv_role"] == "kv_consumer"
    assert _transfer_config(serve["prefill-leader"])["kv_role"] == "kv_producer"
    # A spec without the pair asks what it asked before (its probe key is unchanged).
    assert sorted(probe_request(spec_of(parallelism={"tensor": 8}))["serve"]) == ["leader"]


def test_kimik3_status_shows_each_roles_groups_and_what_holds_one() -> None:
    ds = owned("DisaggregatedSet", "k3", DS_API)
    pods = (_pod("prefill", 0, True), _pod("decode", 0, True), _pod("decode", 1, False))
    decision = decide(snapshot(PAIR, live={DS: ds}, ds_installed=True, pods=pods))
    shown = render_status(
        {"metadata": {"name": "k3", "namespace": "llm"}, "status": decision.status}
    )
    assert "Disaggregated: set k3  connector Nixl" in shown
    assert "  prefill  ready groups 1/1" in shown
    assert "  decode  ready groups 1/2  " in shown
    assert "decode held to acceptance 0.5 (spec.monitoring.minAcceptanceRate)" in shown
