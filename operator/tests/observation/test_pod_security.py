"""The Pod Security prediction: the standards' controls on a pod, the namespace's labels read
as PodSecurity reads them, and the reconcile refusing before any child exists. The
end-to-end tier checks each prediction against the real API server's PodSecurity admission
(e2e/test_pod_security.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from conftest import ROOT, FakeKube, resource, settle, spec_of
from kimik3_operator.api.constants import Reason
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.pods import pod_specs
from kimik3_operator.controller.admission import needed_level, predict
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.observation.pod_security import Policy, namespace_policy, violations

OWNER = Owner("k3", "llm", "uid-1")
COMPLIANT: dict[str, Any] = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": "c",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
    "volumes": [{"name": "v", "emptyDir": {}}],
}


def pod_with(path: str, value: Any) -> dict[str, Any]:
    """COMPLIANT with one field set: "containers.securityContext.privileged" and the like."""
    pod = copy.deepcopy(COMPLIANT)
    *parents, last = path.split(".")
    where: Any = pod
    for part in parents:
        where = where["containers"][0] if part == "containers" else where.setdefault(part, {})
    where[last] = value
    return pod


def fields(pod: dict[str, Any], level: str) -> set[str]:
    return {v.field for v in violations(pod, Policy(level))}  # type: ignore[arg-type]


def test_a_compliant_pod_meets_every_level() -> None:
    for level in ("privileged", "baseline", "restricted"):
        assert fields(COMPLIANT, level) == set()


@pytest.mark.parametrize(
    ("path", "value", "refused_at"),
    [
        ("hostNetwork", True, "baseline"),
        ("hostPID", True, "baseline"),
        ("containers.securityContext.privileged", True, "baseline"),
        (
            "containers.securityContext.capabilities",
            {"drop": ["ALL"], "add": ["IPC_LOCK"]},
            "baseline",
        ),
        (
            "containers.securityContext.capabilities",
            {"drop": ["ALL"], "add": ["SYS_NICE"]},
            "baseline",
        ),
        (
            "containers.securityContext.capabilities",
            {"drop": ["ALL"], "add": ["CHOWN"]},
            "restricted",
        ),
        ("containers.securityContext.capabilities", {"add": ["NET_BIND_SERVICE"]}, "restricted"),
        ("containers.securityContext.allowPrivilegeEscalation", True, "restricted"),
        ("containers.securityContext.runAsNonRoot", False, "restricted"),
        ("containers.securityContext.runAsUser", 0, "restricted"),
        ("containers.securityContext.seccompProfile", {"type": "Unconfined"}, "baseline"),
        ("containers.securityContext.procMount", "Unmasked", "baseline"),
        ("containers.ports", [{"containerPort": 80, "hostPort": 80}], "baseline"),
        ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "baseline"),
        ("volumes", [{"name": "h", "hostPath": {"path": "/"}}], "baseline"),
        ("volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}], "restricted"),
    ],
)
def test_each_control_is_refused_from_its_level(path: str, value: Any, refused_at: str) -> None:
    pod = pod_with(path, value)
    assert fields(pod, "privileged") == set()
    assert bool(fields(pod, "baseline")) == (refused_at == "baseline")
    assert fields(pod, "restricted"), f"{path}={value} passed restricted"


def test_non_root_needs_the_pod_or_every_container_to_say_so() -> None:
    pod = copy.deepcopy(COMPLIANT)
    del pod["securityContext"]["runAsNonRoot"]
    assert "spec.containers[c].securityContext.runAsNonRoot" in fields(pod, "restricted")
    pod["containers"][0]["securityContext"]["runAsNonRoot"] = True
    assert fields(pod, "restricted") == set()


def test_the_namespace_labels_as_podsecurity_reads_them() -> None:
    assert namespace_policy(None) == Policy("privileged")
    assert namespace_policy({"pod-security.kubernetes.io/enforce": "baseline"}).level == "baseline"
    pinned = namespace_policy(
        {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "v1.21",
        }
    )
    assert (pinned.level, pinned.minor) == ("restricted", 21)
    # Before v1.22 restricted did not require dropping every capability.
    pod = pod_with("containers.securityContext.capabilities", {})
    assert fields(pod, "restricted") and not violations(pod, pinned)
    # Only the warn and audit modes: nothing is enforced.
    assert namespace_policy({"pod-security.kubernetes.io/warn": "restricted"}).level == (
        "privileged"
    )
    for bad in (
        {"pod-security.kubernetes.io/enforce": "strict"},
        {
            "pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/enforce-version": "1.30",
        },
    ):
        policy = namespace_policy(bad)
        assert policy.level == "restricted" and policy.invalid, bad


def test_the_operators_own_pods_meet_restricted_by_default() -> None:
    for example in (
        spec_of(),
        spec_of(model={"cache": {}}),
        spec_of(
            drafter={"method": "ngram", "numSpeculativeTokens": 3},
            model={"source": {"pvc": {"claimName": "w"}}},
        ),
    ):
        pods = pod_specs(example, OWNER)
        assert pods and needed_level(pods) == "restricted"
        assert predict(example, OWNER, Policy("restricted")) is None


def test_capabilities_need_privileged_and_the_message_names_field_level_and_fix() -> None:
    rdma = spec_of(engine={"addCapabilities": ["IPC_LOCK"]}, model={"cache": {}})
    assert predict(rdma, OWNER, Policy("privileged")) is None
    refusal = predict(rdma, OWNER, Policy("baseline"))
    assert refusal is not None and refusal.needed == "privileged"
    assert refusal.spec_fields == ("spec.engine.addCapabilities",)
    text = refusal.message("llm")
    assert "namespace llm enforces Pod Security baseline" in text
    assert "spec.engine.addCapabilities gives" in text and "IPC_LOCK" in text
    assert "remove spec.engine.addCapabilities" in text
    assert "pod-security.kubernetes.io/enforce=privileged" in text
    # The Jobs are not what the namespace refuses: only the serving pods are named.
    assert {what for what, _ in refusal.found} == {"the serving pods"}
    restricted = predict(rdma, OWNER, Policy("restricted"))
    assert restricted is not None
    assert set(restricted.spec_fields) == {
        "spec.engine.addCapabilities",
        "spec.securityContext.runAsNonRoot",
    }


def test_root_without_capabilities_needs_baseline() -> None:
    root = spec_of(securityContext={"runAsNonRoot": False, "runAsUser": 0})
    refusal = predict(root, OWNER, Policy("restricted"))
    assert refusal is not None and refusal.needed == "baseline"
    assert predict(root, OWNER, Policy("baseline")) is None


def _namespace(labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "llm", "labels": labels}}


def test_the_reconcile_refuses_before_any_child_and_names_the_fix() -> None:
    kube = FakeKube()
    kube.put(_namespace({"pod-security.kubernetes.io/enforce": "baseline"}))
    body = resource(engine={"addCapabilities": ["IPC_LOCK", "SYS_NICE"]})
    kube.put(body)
    result = reconcile(kube, ("llm", "k3"))
    assert result.applied == [], "nothing is created for pods the namespace refuses"
    status = kube.objects[("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "llm", "k3")]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == Reason.POD_SECURITY_REFUSED
    assert "IPC_LOCK,SYS_NICE" in degraded["message"]
    assert status["reason"] == Reason.POD_SECURITY_REFUSED
    # Relabelled, the same spec deploys; a second pass writes nothing.
    kube.put(_namespace({"pod-security.kubernetes.io/enforce": "privileged"}))
    assert any(a.startswith("LeaderWorkerSet/") for a in settle(kube, ("llm", "k3")).applied)
    kube.writes.clear()
    reconcile(kube, ("llm", "k3"))
    assert kube.writes == []


def test_a_namespace_that_cannot_be_read_is_no_refusal() -> None:
    kube = FakeKube()
    kube.put(resource(engine={"addCapabilities": ["IPC_LOCK"]}))
    context = Context(namespace_labels=lambda _kube, _ns: None)
    assert any(
        a.startswith("LeaderWorkerSet/") for a in reconcile(kube, ("llm", "k3"), context).applied
    )


def test_the_cli_predicts_offline(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from kimik3_operator.cli import main

    example = ROOT / "examples" / "kimi-k3-text-dspark.yaml"
    assert main(["preflight", "-f", str(example), "--pod-security", "restricted"]) == 0
    assert "PodSecurityAdmitted" in capsys.readouterr().out
    rdma = yaml.safe_load(example.read_text())
    rdma["spec"]["engine"]["addCapabilities"] = ["IPC_LOCK"]
    path = tmp_path / "rdma.yaml"
    path.write_text(yaml.safe_dump(rdma))
    assert main(["preflight", "-f", str(path), "--pod-security", "baseline"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("verdict: Fail")
    assert "PodSecurityRefused" in out and "spec.engine.addCapabilities" in out
    assert main(["preflight", "-f", str(path), "--pod-security", "privileged"]) == 0


def test_the_runtime_asks_the_server_once_per_ttl_per_namespace() -> None:
    from kimik3_operator.runtime.namespaces import NamespaceLabels

    class Counting(FakeKube):
        asked = 0

        def get_from_server(
            self, api_version: str, kind: str, name: str, namespace: str | None = None
        ) -> Any:
            self.asked += 1
            return super().get_from_server(api_version, kind, name, namespace)

    kube = Counting()
    kube.put(_namespace({"pod-security.kubernetes.io/enforce": "baseline"}))
    now = [0.0]
    labels = NamespaceLabels(ttl=30, clock=lambda: now[0])
    for _ in range(5):
        assert labels(kube, "llm") == {"pod-security.kubernetes.io/enforce": "baseline"}
    assert kube.asked == 1
    kube.put(_namespace({"pod-security.kubernetes.io/enforce": "restricted"}))
    now[0] = 31
    assert labels(kube, "llm") == {"pod-security.kubernetes.io/enforce": "restricted"}
    assert kube.asked == 2
