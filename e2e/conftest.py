"""Fixtures for the end-to-end tests on the real control plane (e2e/cluster/up.sh).

Real: kube-apiserver, kube-controller-manager, kube-scheduler, etcd, the LeaderWorkerSet
manager and its webhooks, and the operator process (`kimik3 run`). Fake, because they cannot
exist here: the GPU nodes' kubelets (KWOK marks pods Running and Ready; no container runs).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.support.cluster import (
    API,
    CRD,
    KUBECONFIG,
    ROOT,
    Cluster,
    OperatorProcess,
    condition,
    create_test_namespace,
    describe,
    remove_test_namespaces,
    tools_bin,
    wait_established,
    wait_for,
)

TIERS = ("kwok", "real_node")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every end-to-end test belongs to exactly one tier, so none falls outside `make test`."""
    here = pathlib.Path(__file__).parent
    for item in items:
        if here not in pathlib.Path(str(item.path)).parents:
            continue
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: mark it with one of {TIERS}, not {tiers}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    ready = (
        KUBECONFIG.exists()
        and subprocess.run(
            ["kubectl", "--kubeconfig", str(KUBECONFIG), "get", "--raw", "/readyz"],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if not ready:
        subprocess.run(
            ["bash", str(ROOT / "e2e/cluster/up.sh")],
            check=True,
            env={**os.environ, "PYTHON": sys.executable},
        )
    found = Cluster(KUBECONFIG, tools_bin())
    found.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(found, f"crd/{API}")
    remove_test_namespaces(found)  # what an interrupted earlier run left
    yield found
    # Every test leaves nothing behind: its namespaces go, and none hangs in Terminating
    # (a KimiK3Deployment carries no finalizer, so this holds with every operator stopped).
    stuck = remove_test_namespaces(found)
    assert not stuck, f"namespaces left after the tests: {stuck}"


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = create_test_namespace(cluster, f"e2e-{uuid.uuid4().hex[:8]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator(cluster: Cluster, namespace: str) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(cluster, namespace)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def wait_condition(cluster: Cluster) -> Callable[..., dict[str, Any]]:
    def wait(
        name: str,
        namespace: str,
        type_: str,
        status: str,
        reason: str | None = None,
        timeout: float = 90,
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            body = cluster.get("kk3d", name, namespace)
            cond = condition(body, type_)
            if cond.get("status") == status and reason in (None, cond.get("reason")):
                return body
            return None

        result: dict[str, Any] = wait_for(
            check,
            timeout,
            f"{type_}={status} ({reason or 'any reason'}) on {name}",
            lambda: describe(cluster, name, namespace),
        )
        return result

    return wait


@pytest.fixture
def volumes(cluster: Cluster) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for namespace in made:
        cluster.kubectl("delete", "pv", f"cache-{namespace}", "--wait=false", check=False)
