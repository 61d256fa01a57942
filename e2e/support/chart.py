"""The operator's Helm chart as the tests install it."""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import uuid
from collections.abc import Callable, Iterator

from e2e.support.cluster import (
    ROOT,
    RUN,
    Cluster,
    OperatorProcess,
    create_test_namespace,
    service_account_kubeconfig,
)

CHART = ROOT / "charts" / "kimik3-operator"
# The operator reading each leader at its own address, every second, over a 5 s window, and
# resyncing every 2 s: what a test of the acceptance needs to see it move in seconds.
FAST_READS = {
    "KIMIK3_SCRAPE_URL": "",
    "KIMIK3_SCRAPE_SECONDS": "1",
    "KIMIK3_ACCEPTANCE_WINDOW_SECONDS": "5",
    "KIMIK3_RESYNC_SECONDS": "2",
}


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


@contextlib.contextmanager
def chart_operator(
    cluster: Cluster, label: str, env: Callable[[str], dict[str, str]]
) -> Iterator[tuple[OperatorProcess, str, str]]:
    """The chart installed in a namespace of its own, watching another, and the operator run
    with its ServiceAccount's token (the chart's RBAC and admission policy), with the
    settings ``env`` gives for the release's name; yields it, the watched namespace and the
    chart's. Everything goes afterwards."""
    suffix = uuid.uuid4().hex[:6]
    system, watched = f"kimik3-{suffix}", f"llm-{suffix}"
    for ns in (system, watched):
        create_test_namespace(cluster, ns)
    release = f"kimik3-operator-{suffix}"
    install_chart(cluster, release, system, "leaderElection.enabled=false", watched=watched)
    operator = operator_as(cluster, system, release, watched, label, env(release))
    operator.start()
    try:
        yield operator, watched, system
    finally:
        operator.stop()
        helm(cluster, "uninstall", release, "-n", system, "--wait", check=False)
        for ns in (system, watched):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def admin_service_account(cluster: Cluster, namespace: str, account: str) -> pathlib.Path:
    """A kubeconfig for ``account`` in ``namespace``, bound to cluster-admin: a benchmark's
    operator then goes through the API server's Priority and Fairness as in a cluster (an
    admin's requests are exempt from it and its queues)."""
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace, check=False)
    cluster.kubectl(
        "create", "clusterrolebinding", namespace, "--clusterrole=cluster-admin",
        f"--serviceaccount={namespace}:{account}", check=False,
    )  # fmt: skip
    return service_account_kubeconfig(
        cluster, namespace, account, RUN / f"bench-{namespace}.kubeconfig"
    )
