"""The operator's Helm chart as the tests install it."""

from __future__ import annotations

import subprocess

from e2e.support.cluster import (
    ROOT,
    RUN,
    Cluster,
    OperatorProcess,
    service_account_kubeconfig,
)

CHART = ROOT / "charts" / "kimik3-operator"


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


def install_chart(
    cluster: Cluster,
    release: str,
    namespace: str,
    *settings: str,
    watched: str = "",
    wait: str = "",
) -> subprocess.CompletedProcess[str]:
    """`helm install` of the chart as release ``release`` in ``namespace``, each of
    ``settings`` a `--set key=value`; ``watched``: the one namespace the operator watches;
    ``wait``: how long helm waits for the release to be ready (no wait when empty)."""
    args = ["install", release, str(CHART), "-n", namespace]
    if wait:
        args += ["--wait", "--timeout", wait]
    if watched:
        settings = (f"watchNamespaces={{{watched}}}", *settings)
    for setting in settings:
        args += ["--set", setting]
    return helm(cluster, *args)


def operator_as(
    cluster: Cluster,
    system: str,
    account: str,
    namespace: str,
    label: str,
    env: dict[str, str] | None = None,
) -> OperatorProcess:
    """The operator as a host process with the token of the chart's ServiceAccount, so it
    has exactly the chart's RBAC and meets the chart's admission policy."""
    kubeconfig = service_account_kubeconfig(
        cluster, system, account, RUN / f"sa-{system}{label}.kubeconfig"
    )
    return OperatorProcess(cluster, namespace, kubeconfig, env, label)
