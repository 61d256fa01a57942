"""The Helm chart and the kubectl bundle: lint, offline and server-side schema checks, drift,
install/upgrade/test/uninstall on the real control plane with the operator reconciling in
between as the chart's ServiceAccount, least-privilege RBAC, and leader election.

KWOK runs no container: the chart's operator pods are scheduled and marked Ready but do not
run, so the operator runs as a host process with the ServiceAccount's token (exactly its
RBAC), and the `helm test` Job completes without its container running; the test runs the
Job's check itself."""

from __future__ import annotations

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

from e2e.conftest import (
    RUN,
    Cluster,
    OperatorProcess,
    create_test_namespace,
    kimi,
    service_account_kubeconfig,
    wait_for,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kimik3-operator"
VARIANTS = ["default", *sorted(p.stem for p in (CHART / "ci").glob("*-values.yaml"))]
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "PodMonitor", "KopfPeering", "ClusterKopfPeering"}
# kopf's log lines when a replica stops and starts serving the resources.
PAUSED = "Pausing the watch-stream for kimik3deployments"
RESUMED = "Resuming the watch-stream for kimik3deployments"
SMALL = {
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "preflight": {"probe": False},
    "parallelism": {"tensor": 8},
}


def helm(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(cluster.bin_dir / "helm"), *args],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=300,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {result.stderr}")
    return result


def render(
    cluster: Cluster, variant: str, namespace: str = "kimik3-system"
) -> list[dict[str, Any]]:
    values = [] if variant == "default" else ["-f", str(CHART / "ci" / f"{variant}.yaml")]
    out = helm(cluster, "template", "kimik3-operator", str(CHART), "-n", namespace, *values).stdout
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
    for name in ("kimik3deployments.yaml", "kopf-peering.yaml"):
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
    assert kinds.count("CustomResourceDefinition") == 3 and "Deployment" in kinds


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


def _operator_as(
    cluster: Cluster,
    system: str,
    account: str,
    namespace: str,
    label: str,
    env: dict[str, str] | None = None,
) -> OperatorProcess:
    kubeconfig = service_account_kubeconfig(
        cluster, system, account, RUN / f"sa-{system}{label}.kubeconfig"
    )
    return OperatorProcess(cluster, namespace, kubeconfig, env, label)


def test_install_upgrade_test_uninstall(
    cluster: Cluster, release: tuple[str, str], wait_condition: Callable[..., dict[str, Any]]
) -> None:
    name, system = release
    watched = system.replace("kimik3-", "llm-")
    started = time.monotonic()
    helm(
        cluster,
        "install",
        name,
        str(CHART),
        "-n",
        system,
        "--wait",
        "--timeout",
        "120s",
        "--set",
        f"watchNamespaces={{{watched}}}",
        "--set",
        "leaderElection.enabled=false",
    )
    install_seconds = time.monotonic() - started
    deployment = json.loads(
        cluster.kubectl("get", "deployment", name, "-n", system, "-o", "json").stdout
    )
    assert deployment["status"]["readyReplicas"] == 2
    print(f"chart install to ready: {install_seconds:.1f}s")

    operator = _operator_as(cluster, system, name, watched, "-sa")
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

    tested = helm(cluster, "test", name, "-n", system, "--timeout", "120s")
    assert "Phase:          Succeeded" in tested.stdout or "Succeeded" in tested.stdout
    # The test Job's container does not run on KWOK: run its check here.
    job = next(d for d in render(cluster, "default", system) if d["kind"] == "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    command = command.replace("deployment/kimik3-operator", f"deployment/{name}").replace(
        "-n kimik3-system", f"-n {system}"
    )
    check = subprocess.run(
        ["sh", "-c", command],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert check.returncode == 0, check.stderr

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
    helm(
        cluster,
        "install",
        name,
        str(CHART),
        "-n",
        system,
        "--set",
        f"watchNamespaces={{{watched}}}",
    )
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


def test_leader_election_fails_over(
    cluster: Cluster, release: tuple[str, str], wait_condition: Callable[..., dict[str, Any]]
) -> None:
    name, system = release
    watched = system.replace("kimik3-", "llm-")
    helm(
        cluster,
        "install",
        name,
        str(CHART),
        "-n",
        system,
        "--set",
        f"watchNamespaces={{{watched}}}",
        "--set",
        "leaderElection.lifetimeSeconds=5",
    )
    peering = {"KIMIK3_PEERING_NAME": name, "KIMIK3_PEERING_LIFETIME_SECONDS": "5"}
    first = _operator_as(
        cluster, system, name, watched, "-a", {**peering, "KIMIK3_PRIORITY": "200"}
    )
    second = _operator_as(
        cluster, system, name, watched, "-b", {**peering, "KIMIK3_PRIORITY": "100"}
    )
    first.start()
    second.start()
    try:
        wait_for(
            lambda: PAUSED in second.log.read_text(),
            30,
            "the lower-priority replica to pause",
        )
        cluster.apply(kimi("k3", **SMALL), watched)
        wait_condition("k3", watched, "Available", "True", "Available", timeout=120)
        after_pause = second.log.read_text().split(PAUSED, 1)[1]
        assert "Handler 'on_change'" not in after_pause, "the paused replica stays idle"
        assert first.process is not None
        first.process.kill()  # a crash: no goodbye in the peering object
        killed = time.monotonic()
        wait_for(
            lambda: RESUMED in second.log.read_text(),
            60,
            "the other replica to take over",
        )
        print(f"leader failover: {time.monotonic() - killed:.1f}s")
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
    finally:
        first.stop()
        second.stop()
