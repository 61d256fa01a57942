"""One tenant's object cannot stop the operator for the others, on the real API server.

Real: the API server (it stores open fields up to 10,000 levels deep, and prunes and
validates the CRD's closed ones), the LeaderWorkerSet controller, the operator as a process.
KWOK stands in for the GPU nodes."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from e2e.support.cluster import (
    RUN,
    Cluster,
    OperatorProcess,
    create_test_namespace,
    describe,
    kimi,
    service_account_kubeconfig,
    wait_for,
)

pytestmark = pytest.mark.kwok

LEVELS = 1_200
SMALL = {
    "drafter": {"method": "dspark"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "preflight": {"probe": False},
}


def nested(levels: int) -> str:
    """JSON ``levels`` objects deep, written by hand: Python's encoder stops near 1,000."""
    return '{"a":' * levels + "1" + "}" * levels


def kubectl_json(cluster: Cluster, args: list[str], body: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(*args, "-f", "-", input=body, check=False)


def deep_status(cluster: Cluster, name: str, namespace: str) -> None:
    """Writes status.capabilities (an open field) 1,200 levels deep, as anyone allowed to
    write the status can."""
    patch = '{"status":{"capabilities":' + nested(LEVELS) + "}}"
    cluster.kubectl(
        "patch", "kk3d", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch
    )


def test_a_spec_nested_deep_is_refused_by_the_schema(cluster: Cluster, namespace: str) -> None:
    engine = {"image": "vllm/vllm-openai:v0.33.0", "env": "ENV"}
    env = '[{"name":"X","valueFrom":{"secretKeyRef":{"key":"k"},"extra":' + nested(LEVELS) + "}}]"
    body = json.dumps(kimi("deep-env", **{**SMALL, "engine": engine})).replace('"ENV"', env)
    result = kubectl_json(cluster, ["create", "-n", namespace], body)
    # kubectl asks for strict field validation: the unknown field is named and refused.
    assert result.returncode != 0, "a spec with a deep unknown field was stored"
    assert 'unknown field "spec.engine.env[0].valueFrom.extra"' in result.stderr, result.stderr
    assert cluster.get("kk3d", "deep-env", namespace) is None
    # A client that skips it gets the field dropped: what is stored is shallow.
    kubectl_json(cluster, ["create", "--validate=false", "-n", namespace], body)
    stored = cluster.get("kk3d", "deep-env", namespace)
    assert stored is not None
    assert stored["spec"]["engine"]["env"] == [
        {"name": "X", "valueFrom": {"secretKeyRef": {"key": "k"}}}
    ]
    # The closed schema's rules still hold: a valueFrom emptied by the pruning is refused.
    empty = body.replace('{"secretKeyRef":{"key":"k"},', "{").replace("deep-env", "emptied")
    result = kubectl_json(cluster, ["create", "--validate=false", "-n", namespace], empty)
    assert "valueFrom takes exactly one of" in result.stderr, result.stderr


def test_one_deployment_nested_too_deep_stops_no_other_tenant(
    cluster: Cluster, namespace: str
) -> None:
    other = create_test_namespace(cluster, f"e2e-tenant-{uuid.uuid4().hex[:6]}")
    operator = OperatorProcess(
        cluster, namespace, extra_env={"KIMIK3_NAMESPACES": f"{namespace},{other}"}
    )
    try:
        cluster.apply(kimi("deep", **SMALL), namespace)
        deep_status(cluster, "deep", namespace)
        stored = cluster.kubectl("get", "kk3d", "deep", "-n", namespace, "-o", "json").stdout
        assert stored.count('"a"') == LEVELS, "the API server stores the 1,200 levels"
        cluster.apply(kimi("fine", **SMALL), other)

        # Started with the deep object present: its first list holds it.
        operator.start()
        wait_for(
            lambda: cluster.get("lws", "fine", other),
            60,
            "the other tenant's LeaderWorkerSet",
            lambda: describe(cluster, "fine", other) + operator.log.read_text()[-3000:],
        )
        cluster.events(namespace, "involvedObject.name=deep,reason=ObjectTooDeep", timeout=30)
        assert operator.metric('kimik3_rejected_objects_total{kind="KimiK3Deployment"}') >= 1
        assert cluster.get("lws", "deep", namespace) is None, "nothing is built for it"

        # A watch event of the same depth is passed over too: later changes still arrive.
        cluster.apply(kimi("second", **SMALL), namespace)
        deep_status(cluster, "second", namespace)
        cluster.apply(kimi("later", **SMALL), other)
        wait_for(
            lambda: cluster.get("lws", "later", other),
            60,
            "a LeaderWorkerSet for a deployment made after the deep watch event",
            lambda: describe(cluster, "later", other) + operator.log.read_text()[-3000:],
        )
        cluster.events(namespace, "involvedObject.name=second,reason=ObjectTooDeep", timeout=30)
        # The fix: the deep field replaced; the deployment is the operator's again.
        cluster.kubectl(
            "patch",
            "kk3d",
            "deep",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status":{"capabilities":null}}',
        )
        wait_for(
            lambda: cluster.get("lws", "deep", namespace),
            60,
            "the LeaderWorkerSet once the deep field is gone",
            lambda: describe(cluster, "deep", namespace),
        )
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def read_everything_write_in(cluster: Cluster, namespaces: list[str], tag: str) -> None:
    """A ServiceAccount that reads every namespace, as the chart's default operator does, and
    writes only in ``namespaces``: watching every namespace, the test's operator leaves the
    other sessions' deployments alone (their writes are refused)."""
    home = namespaces[0]
    cluster.kubectl("create", "serviceaccount", "wide", "-n", home)
    cluster.kubectl(
        "create", "clusterrole", tag, "--verb=get,list,watch", "--resource=*.*",
    )  # fmt: skip
    cluster.kubectl(
        "create", "clusterrolebinding", tag, f"--clusterrole={tag}",
        f"--serviceaccount={home}:wide",
    )  # fmt: skip
    for namespace in namespaces:
        cluster.kubectl(
            "create", "rolebinding", "wide", "-n", namespace, "--clusterrole=cluster-admin",
            f"--serviceaccount={home}:wide",
        )  # fmt: skip


def test_watching_every_namespace_a_large_tenant_holds_no_one_else(
    cluster: Cluster, namespace: str
) -> None:
    """Watching every namespace (the chart's default), with one tenant holding over 16 MiB of
    labelled ConfigMaps: every tenant's deployment is built, those whose namespace the first
    list of KimiK3Deployments passed were handed over before it ended, in the API server's
    own order. Which resources went on their namespace's own lists of the other kinds
    depends on how long the cluster-wide lists take here (bench/hostile.py measures it); the
    decision is unit-tested in runtime/test_manager.py."""
    from kimik3_operator.api import constants as c

    tag = uuid.uuid4().hex[:6]
    first = create_test_namespace(cluster, f"e2e-a-{tag}")
    last = create_test_namespace(cluster, f"e2e-z-{tag}")
    tenants = [first, namespace, last]
    read_everything_write_in(cluster, tenants, f"e2e-every-ns-{tag}")
    labels = {c.LABEL_MANAGED_BY: c.OPERATOR_NAME, c.LABEL_INSTANCE: "large"}
    config_maps = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"large-{n}", "labels": labels},
                "data": {"k": "#" * 250_000},
            }
            for n in range(70)
        ],
    }
    # create, not apply: apply would keep a second copy of each in an annotation
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(config_maps))
    for tenant, name in ((first, "first"), (namespace, "large"), (last, "last")):
        cluster.apply(kimi(name, **SMALL), tenant)
    operator = OperatorProcess(
        cluster,
        namespace,
        kubeconfig=service_account_kubeconfig(
            cluster, first, "wide", RUN / f"every-namespace-{tag}.kubeconfig"
        ),
        extra_env={"KIMIK3_NAMESPACES": "", "KIMIK3_LEASE_NAMESPACE": first},
        label="-every-namespace",
    )
    try:
        operator.start()
        for tenant, name in ((first, "first"), (namespace, "large"), (last, "last")):
            wait_for(
                lambda t=tenant, n=name: cluster.get("lws", n, t),
                90,
                f"the LeaderWorkerSet of {tenant}/{name}",
                lambda t=tenant, n=name: describe(cluster, n, t) + operator.log.read_text()[-3000:],
            )
        handed = operator.metric('kimik3_namespaces_listed_early_total{how="handed_over"}')
        assert handed >= 2, "the first list handed over the namespaces it passed"
        log = operator.log.read_text()
        assert "not in namespace order" not in log
        print(operator.metrics_text("kimik3_namespaces_listed_early"))
        assert len(cluster.items("configmap", namespace, "app.kubernetes.io/instance=large")) == 70
    finally:
        operator.stop()
        cluster.kubectl(
            "delete", "clusterrolebinding,clusterrole", f"e2e-every-ns-{tag}", check=False
        )
