"""The Helm chart and the kubectl bundle: lint, offline and server-side schema checks, drift,
install/upgrade/test/uninstall on the real control plane with the operator reconciling in
between as the chart's ServiceAccount, least-privilege RBAC, and leader election.

KWOK runs no container: the chart's operator pods are scheduled and marked Ready but do not
run, so the operator runs as a host process with the ServiceAccount's token (exactly its
RBAC), and the `helm test` Job completes without its container running (test_real_node.py
runs it for real)."""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from e2e.support.chart import CHART, SMALL, helm, install_chart, operator_as
from e2e.support.cluster import (
    ROOT,
    RUN,
    Cluster,
    condition,
    create_test_namespace,
    kimi,
    service_account_kubeconfig,
    wait_for,
)
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.preflight_job import build_probe_job

pytestmark = pytest.mark.kwok

VARIANTS = ["default", *sorted(p.stem for p in (CHART / "ci").glob("*-values.yaml"))]
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "PodMonitor"}
LEADING = "leading: holding Lease"
# What a Kubernetes 1.30+ API server serves that the chart renders only where served.
SERVED = ("--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")


def render(
    cluster: Cluster, variant: str, namespace: str = "kimik3-system"
) -> list[dict[str, Any]]:
    values = [] if variant == "default" else ["-f", str(CHART / "ci" / f"{variant}.yaml")]
    out = helm(
        cluster, "template", "kimik3-operator", str(CHART), "-n", namespace, *values, *SERVED
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_lint_strict(cluster: Cluster) -> None:
    result = helm(cluster, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout


def test_values_schema_rejects_wrong_types_and_unknown_keys(cluster: Cluster) -> None:
    wrong = helm(cluster, "template", "x", str(CHART), "--set", "replicas=two", check=False)
    assert wrong.returncode != 0 and "/replicas" in wrong.stderr
    unknown = helm(cluster, "template", "x", str(CHART), "--set", "replica=2", check=False)
    assert unknown.returncode != 0 and "additional properties 'replica'" in unknown.stderr


def test_every_value_is_documented() -> None:
    """Every key with a value has a `# --` comment right above; section headers need none."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        key, value = (part.strip() for part in stripped.split(":", 1))
        above = i - 1
        while (
            above >= 0
            and lines[above].strip().startswith("#")
            and not lines[above].strip().startswith("# --")
        ):
            above -= 1
        if value and not (above >= 0 and lines[above].strip().startswith("# --")):
            undocumented.append(key)
    assert undocumented == []


def test_chart_crds_are_the_manifests_crds() -> None:
    for name in ("kimik3deployments.yaml",):
        assert (CHART / "crds" / name).read_text() == (
            ROOT / "manifests" / "crd" / name
        ).read_text(), f"run scripts/sync-crd.sh: charts/kimik3-operator/crds/{name} drifted"


def test_bundle_is_generated_from_the_chart(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "operator.yaml"
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "render-manifests.sh"), str(out)],
        check=True,
        env={**cluster.env, "HELM": str(cluster.bin_dir / "helm")},
        capture_output=True,
    )
    assert out.read_text() == (ROOT / "manifests" / "operator.yaml").read_text(), (
        "run scripts/render-manifests.sh: manifests/operator.yaml drifted from the chart"
    )


def test_versions_agree() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    assert f"kimik3-operator=={version}" in (ROOT / "images/operator/Dockerfile").read_text()


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_validate_offline(cluster: Cluster, variant: str) -> None:
    docs = render(cluster, variant)
    assert docs
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, "1.36", strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_validate_server_side(cluster: Cluster, variant: str) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "crd"))
    for ns in ("kimik3-system", "llm-a", "llm-b"):
        if cluster.get("namespace", ns, "default") is None:
            create_test_namespace(cluster, ns)
    stream = yaml.safe_dump_all(render(cluster, variant))
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=stream, check=False)
    assert result.returncode == 0, result.stderr


def test_plain_bundle_installs_with_kubectl(cluster: Cluster) -> None:
    result = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        str(ROOT / "manifests" / "crd"),
        "-f",
        str(ROOT / "manifests"),
        check=False,
    )
    assert "Kustomization" not in result.stderr
    kustomized = cluster.kubectl("kustomize", str(ROOT / "manifests")).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(kustomized) if d)
    assert kinds.count("CustomResourceDefinition") == 1 and "Deployment" in kinds


@pytest.fixture
def release(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """A chart release in a fresh namespace, watching a second fresh namespace."""
    suffix = uuid.uuid4().hex[:6]
    system, watched = f"kimik3-{suffix}", f"llm-{suffix}"
    for ns in (system, watched):
        create_test_namespace(cluster, ns)
    name = f"kimik3-operator-{suffix}"
    yield name, system
    helm(cluster, "uninstall", name, "-n", system, "--wait", check=False)
    for ns in (system, watched):
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_install_upgrade_test_uninstall(
    cluster: Cluster, release: tuple[str, str], wait_condition: Callable[..., dict[str, Any]]
) -> None:
    name, system = release
    watched = system.replace("kimik3-", "llm-")
    started = time.monotonic()
    install_chart(
        cluster, name, system, "leaderElection.enabled=false", watched=watched, wait="120s"
    )
    install_seconds = time.monotonic() - started
    deployment = json.loads(
        cluster.kubectl("get", "deployment", name, "-n", system, "-o", "json").stdout
    )
    assert deployment["status"]["readyReplicas"] == 2
    print(f"chart install to ready: {install_seconds:.1f}s")

    operator = operator_as(cluster, system, name, watched, "-sa")
    operator.start()
    try:
        cluster.apply(kimi("k3", **SMALL), watched)
        wait_condition("k3", watched, "Available", "True", "Available", timeout=120)
        log = operator.log.read_text()
        assert "Forbidden" not in log and '" 403 ' not in log, "the chart's RBAC must be enough"
    finally:
        operator.stop()

    helm(
        cluster,
        "upgrade",
        name,
        str(CHART),
        "-n",
        system,
        "--wait",
        "--reuse-values",
        "--set",
        "resyncSeconds=10",
        "--set",
        "replicas=1",
    )
    env = {
        e["name"]: e.get("value")
        for e in json.loads(
            cluster.kubectl("get", "deployment", name, "-n", system, "-o", "json").stdout
        )["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["KIMIK3_RESYNC_SECONDS"] == "10"

    # KWOK marks the test Job's pod done without running it; e2e/test_real_node.py runs
    # `helm test` for real on the real node.
    tested = helm(cluster, "test", name, "-n", system, "--timeout", "120s")
    assert "Succeeded" in tested.stdout

    helm(cluster, "uninstall", name, "-n", system, "--wait")
    assert cluster.get("deployment", name, system) is None
    assert cluster.kubectl("get", "clusterrole", f"{name}-cluster", check=False).returncode != 0
    assert cluster.kubectl("get", "crd", "kimik3deployments.serving.kimik3.io").returncode == 0
    assert cluster.get("kk3d", "k3", watched) is not None, "deployments outlive the operator"


def can_i(cluster: Cluster, account: str, *args: str) -> bool:
    result = cluster.kubectl("auth", "can-i", f"--as={account}", *args, check=False)
    return result.stdout.strip() == "yes"


def test_rbac_is_least_privilege(cluster: Cluster, release: tuple[str, str]) -> None:
    name, system = release
    watched = system.replace("kimik3-", "llm-")
    install_chart(cluster, name, system, watched=watched)
    sa = f"system:serviceaccount:{system}:{name}"
    allowed = [
        ("patch", "kimik3deployments.serving.kimik3.io/status", "-n", watched),
        ("watch", "kimik3deployments.serving.kimik3.io", "-n", watched),
        ("create", "leaderworkersets.leaderworkerset.x-k8s.io", "-n", watched),
        ("patch", "services", "-n", watched),
        ("create", "jobs.batch", "-n", watched),
        ("create", "events", "-n", watched),
        ("list", "pods", "-n", watched),
        ("get", "customresourcedefinitions/leaderworkersets.leaderworkerset.x-k8s.io"),
        ("watch", "customresourcedefinitions/podmonitors.monitoring.coreos.com"),
        ("watch", "jobs.batch", "-n", watched),
        ("watch", "configmaps", "-n", watched),
        ("list", "nodes"),
        ("watch", "pods", "-A"),
    ]
    denied = [
        ("get", "secrets", "-n", watched),
        ("list", "secrets", "-A"),
        ("delete", "nodes"),
        ("delete", "pods", "-n", watched),
        ("create", "leaderworkersets.leaderworkerset.x-k8s.io", "-n", "default"),
        ("delete", "kimik3deployments.serving.kimik3.io", "-n", watched),
        ("get", "customresourcedefinitions/kimik3deployments.serving.kimik3.io"),
        ("list", "customresourcedefinitions"),
        ("create", "clusterrolebindings"),
        ("*", "*"),
    ]
    for verb, *rest in allowed:
        assert can_i(cluster, sa, verb, *rest), (verb, rest)
    for verb, *rest in denied:
        assert not can_i(cluster, sa, verb, *rest), (verb, rest)
    rules = json.loads(
        cluster.kubectl("get", "clusterrole", f"{name}-cluster", "-o", "json").stdout
    )["rules"]
    assert all("*" not in r.get("verbs", []) + r.get("resources", []) for r in rules)


@pytest.mark.timing_sensitive
def test_leader_election_fails_over(
    cluster: Cluster, release: tuple[str, str], wait_condition: Callable[..., dict[str, Any]]
) -> None:
    """Two operator processes with the chart's RBAC elect one leader on a Lease: the other
    reconciles nothing; a kill -9 of the leader hands over within the lease, a SIGTERM at once."""
    name, system = release
    watched = system.replace("kimik3-", "llm-")
    install_chart(cluster, name, system, watched=watched)
    lease = {
        "KIMIK3_LEASE_NAME": name,
        "KIMIK3_LEASE_NAMESPACE": system,
        "KIMIK3_LEASE_SECONDS": "12",
    }
    first = operator_as(cluster, system, name, watched, "-a", {**lease, "POD_NAME": "a"})
    second = operator_as(cluster, system, name, watched, "-b", {**lease, "POD_NAME": "b"})
    first.start()
    wait_for(lambda: LEADING in first.log.read_text(), 30, "the first replica to lead")
    second.start()
    try:
        cluster.apply(kimi("k3", **SMALL), watched)
        wait_condition("k3", watched, "Available", "True", "Available", timeout=120)
        assert first.reconciles() > 0
        assert second.reconciles() == 0, "the standby reconciles nothing"
        assert LEADING not in second.log.read_text()

        assert first.process is not None
        first.process.kill()  # a crash: the Lease is not released
        killed = time.monotonic()
        wait_for(lambda: LEADING in second.log.read_text(), 30, "the standby to take over")
        failover = time.monotonic() - killed
        print(f"leader failover after kill -9: {failover:.1f}s (lease 12 s)")
        assert failover <= 15
        cluster.kubectl(
            "patch", "kk3d", "k3", "-n", watched, "--type=merge", "-p", '{"spec":{"replicas":2}}'
        )
        wait_for(
            lambda: (
                (cluster.get("kk3d", "k3", watched) or {}).get("status", {}).get("readyReplicas")
                == 2
            ),
            120,
            "the survivor to converge the scale-up",
        )

        # A stopped leader (SIGTERM, a rolling update) releases the Lease: no wait.
        first.log.write_text("")
        first.start()
        stopped = time.monotonic()
        second.stop()
        wait_for(lambda: LEADING in first.log.read_text(), 15, "the other replica to lead")
        handover = time.monotonic() - stopped
        print(f"leader handover after SIGTERM: {handover:.1f}s (from the signal)")
        assert handover <= 4
        holder = cluster.kubectl(
            "get", "lease", name, "-n", system, "-o", "jsonpath={.spec.holderIdentity}"
        ).stdout
        assert holder == "a"
    finally:
        first.stop()
        second.stop()


def test_the_admission_policy_fences_the_operators_token(
    cluster: Cluster, release: tuple[str, str], wait_condition: Callable[..., dict[str, Any]]
) -> None:
    """Cluster-wide RBAC lets the operator's ServiceAccount write ConfigMaps anywhere; the
    chart's ValidatingAdmissionPolicy still refuses it kube-system and every object not
    labelled as the operator's, and the operator does its job."""
    name, system = release
    watched = system.replace("kimik3-", "llm-")
    install_chart(
        cluster,
        name,
        system,
        "leaderElection.enabled=false",
        "servingServiceAccounts={weights-reader}",
    )
    kubeconfig = service_account_kubeconfig(
        cluster, system, name, RUN / f"sa-{system}-fence.kubeconfig"
    )

    def as_operator(*args: str, manifest: dict[str, Any] | None = None) -> str:
        result = subprocess.run(
            [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
            input=yaml.safe_dump(manifest) if manifest else None,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return result.stdout + result.stderr

    def config_map(namespace: str, managed: bool) -> dict[str, Any]:
        labels = {"app.kubernetes.io/managed-by": "kimik3-operator"} if managed else {}
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"fence-{uuid.uuid4().hex[:6]}",
                "namespace": namespace,
                "labels": labels,
            },
        }

    plain = config_map("kube-system", managed=False)
    assert can_i(
        cluster,
        f"system:serviceaccount:{system}:{name}",
        "create",
        "configmaps",
        "-n",
        "kube-system",
    ), "RBAC alone would allow it"
    deadline = time.monotonic() + 30
    answer = as_operator("create", "-f", "-", manifest=plain)
    while "kube-system" not in answer and time.monotonic() < deadline:
        # The policy takes effect once the API server has loaded it.
        as_operator("delete", "configmap", plain["metadata"]["name"], "-n", "kube-system")
        time.sleep(1)
        answer = as_operator("create", "-f", "-", manifest=plain)
    assert "writes nothing in kube-system" in answer, answer
    assert "writes nothing in kube-system" in as_operator(
        "create", "-f", "-", manifest=config_map("kube-system", managed=True)
    )
    assert "only objects labelled" in as_operator(
        "create", "-f", "-", manifest=config_map(watched, managed=False)
    )
    # Someone else's object cannot be made the operator's by labelling it.
    theirs = config_map(watched, managed=False)
    cluster.apply(theirs, watched)
    answer = as_operator(
        "label",
        "configmap",
        theirs["metadata"]["name"],
        "-n",
        watched,
        "app.kubernetes.io/managed-by=kimik3-operator",
    )
    assert "already labelled" in answer, answer
    assert "Forbidden" not in as_operator(
        "create", "-f", "-", manifest=config_map(watched, managed=True)
    )

    # What the token may make run: the operator's own Job as it builds it is admitted; the
    # same Job made privileged, with a host path, another ServiceAccount or a token is not.
    spec = parse_spec({**SMALL, "preflight": {"probe": True}})
    own = build_probe_job(spec, Owner("fence", watched, "uid-fence"))
    own["metadata"]["namespace"] = watched

    def job_answer(change: Callable[[dict[str, Any]], None]) -> str:
        job = copy.deepcopy(own)
        change(job["spec"]["template"]["spec"])
        return as_operator("create", "--dry-run=server", "-f", "-", manifest=job)

    def privileged(pod: dict[str, Any]) -> None:
        pod["containers"][0]["securityContext"]["privileged"] = True
        pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True

    def host_path(pod: dict[str, Any]) -> None:
        pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}})

    def other_account(pod: dict[str, Any]) -> None:
        pod["serviceAccountName"] = "deployer"

    def allowed_account(pod: dict[str, Any]) -> None:
        pod["serviceAccountName"] = "weights-reader"

    def token(pod: dict[str, Any]) -> None:
        pod["automountServiceAccountToken"] = True

    def capability(pod: dict[str, Any]) -> None:
        pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]

    def host_network(pod: dict[str, Any]) -> None:
        pod["hostNetwork"] = True

    assert "created (server dry run)" in job_answer(lambda pod: None)
    assert "created (server dry run)" in job_answer(allowed_account), "the chart allows it"
    for change, refusal in (
        (privileged, "are not privileged"),
        (host_path, "no hostPath"),
        (other_account, "default ServiceAccount"),
        (token, "no token mounted"),
        (capability, "no capability but IPC_LOCK and SYS_NICE"),
        (host_network, "no host namespace"),
    ):
        assert refusal in job_answer(change), change.__name__

    # The operator as the chart runs it: an account the chart allows is used, under the
    # policy; another is refused by the operator itself, before any child.
    operator = operator_as(
        cluster, system, name, watched, "-fence", {"KIMIK3_SERVICE_ACCOUNTS": "weights-reader"}
    )
    operator.start()
    try:
        cluster.kubectl("create", "serviceaccount", "weights-reader", "-n", watched)
        account = {"serviceAccountName": "weights-reader"}
        cluster.apply(kimi("k3", **SMALL, pod=account), watched)
        wait_condition("k3", watched, "Available", "True", "Available", timeout=120)
        lws = cluster.get("lws", "k3", watched)
        template = (lws or {})["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        assert template["serviceAccountName"] == "weights-reader"
        assert template["automountServiceAccountToken"] is False
        cluster.apply(kimi("other", **SMALL, pod={"serviceAccountName": "deployer"}), watched)
        body = wait_condition("other", watched, "Degraded", "True", "ServiceAccountNotAllowed")
        assert "weights-reader" in condition(body, "Degraded")["message"]
        assert cluster.get("lws", "other", watched) is None
        log = operator.log.read_text()
        assert "Forbidden" not in log and "denied" not in log, log[-3000:]
    finally:
        operator.stop()
    # Of a KimiK3Deployment, the token writes the status, never the spec.
    answer = as_operator(
        "patch", "kk3d", "k3", "-n", watched, "--type=merge", "-p", '{"spec":{"replicas":5}}'
    )
    assert "writes the status and removes its own finalizer" in answer, answer
    # Events only about KimiK3Deployments.
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "fence.", "namespace": watched},
        "involvedObject": {"kind": "Pod", "name": "someone", "namespace": watched},
        "reason": "Fake",
        "message": "a message in another's name",
    }
    assert "events about KimiK3Deployments only" in as_operator("create", "-f", "-", manifest=event)


def test_replicas_spread_an_optional_budget_and_a_digest(cluster: Cluster) -> None:
    digest = "sha256:" + "a" * 64
    out = helm(
        cluster,
        "template",
        "k",
        str(CHART),
        "--set",
        "podDisruptionBudget.enabled=true",
        "--set",
        f"image.digest={digest}",
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["containers"][0]["image"].endswith(f"@{digest}")
    # Liveness waits for the first list of every watch, which takes minutes on a cluster of
    # 100,000 pods (bench/scale_curve.py), instead of killing the operator during it.
    container = pod["containers"][0]
    startup = container["startupProbe"]
    assert startup["httpGet"] == container["livenessProbe"]["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    budget = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert (
        budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    )
    default = [
        d for d in yaml.safe_load_all(helm(cluster, "template", "k", str(CHART)).stdout) if d
    ]
    assert not any(d["kind"] == "PodDisruptionBudget" for d in default)


def test_the_metrics_port_admits_only_the_listed_peers(cluster: Cluster) -> None:
    """The metrics name every tenant's deployments: by default only the monitoring namespace
    may reach the port, the health port stays open, and the policy selects the operator's
    pods and those only. (No CNI here enforces a NetworkPolicy: the API server validates it
    in test_rendered_objects_validate_server_side; this checks what it says.)"""
    docs = [d for d in yaml.safe_load_all(helm(cluster, "template", "k", str(CHART)).stdout) if d]
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert (
        policy["spec"]["podSelector"]["matchLabels"]
        == (deployment["spec"]["selector"]["matchLabels"])
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    health, metrics = policy["spec"]["ingress"]
    assert health == {"ports": [{"port": "health", "protocol": "TCP"}]}
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {"health", "metrics"} <= ports, "the policy's named ports exist on the container"
    off = helm(cluster, "template", "k", str(CHART), "--set", "networkPolicy.enabled=false")
    assert "kind: NetworkPolicy" not in off.stdout
    wrong = helm(
        cluster,
        "template",
        "k",
        str(CHART),
        "--set-json",
        'networkPolicy.metricsFrom=[{"ipBlock":1}]',
        check=False,
    )
    assert wrong.returncode != 0 and "ipBlock" in wrong.stderr
