"""The Prometheus Operator v0.85.0, real (built from its module, a host process against the
real API server), selecting monitors and rules by label as kube-prometheus-stack sets it up
(`release: <its release name>`): with the operator's KIMIK3_PODMONITOR_LABELS (the chart's
`metrics.podMonitorLabels`) a deployment's PodMonitor is in the Prometheus configuration it
generates, without them it is not; the chart's ServiceMonitor and PrometheusRule with their
`labels` are too. What it generates is read from the Secret and ConfigMap it writes; the
Prometheus pods it asks for land on KWOK nodes and run nothing.
"""

from __future__ import annotations

import gzip
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from e2e.support.cluster import (
    ROOT,
    RUN,
    Cluster,
    OperatorProcess,
    create_test_namespace,
    free_port,
    kimi,
    tools_bin,
    wait_for,
)

pytestmark = pytest.mark.kwok

RELEASE = {"release": "kps"}
SMALL = {
    "drafter": {"method": "dspark"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "preflight": {"probe": False},
}


def prometheus(namespace: str) -> dict[str, Any]:
    """A Prometheus as kube-prometheus-stack makes it: monitors and rules of every namespace,
    selected by the release label."""
    selected = {"matchLabels": RELEASE}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": "kps", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "podMonitorSelector": selected,
            "podMonitorNamespaceSelector": {},
            "serviceMonitorSelector": selected,
            "serviceMonitorNamespaceSelector": {},
            "ruleSelector": selected,
            "ruleNamespaceSelector": {},
        },
    }


@pytest.fixture
def prometheus_operator(cluster: Cluster) -> Iterator[subprocess.Popen[bytes]]:
    log = RUN / "prometheus-operator.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [
                str(tools_bin() / "prometheus-operator"),
                f"--web.listen-address=127.0.0.1:{free_port()}",
                "--kubelet-service=",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        )
    yield process
    process.terminate()
    process.wait(timeout=15)


def chart_monitors(namespace: str) -> str:
    """The chart's ServiceMonitor and PrometheusRule, labelled for the stack."""
    rendered = subprocess.run(
        [
            str(tools_bin() / "helm"), "template", "kimik3-operator",
            str(ROOT / "charts/kimik3-operator"), "-n", namespace,
            "--set", "metrics.serviceMonitor.enabled=true",
            "--set", "metrics.serviceMonitor.labels.release=kps",
            "--set", "prometheusRule.enabled=true",
            "--set", "prometheusRule.labels.release=kps",
        ],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    wanted = ("ServiceMonitor", "PrometheusRule")
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in wanted]
    assert len(docs) == 2
    return yaml.safe_dump_all(docs)


def test_kube_prometheus_stacks_selector_picks_up_what_the_chart_labels(
    cluster: Cluster,
    namespace: str,
    prometheus_operator: subprocess.Popen[bytes],
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    unlabelled = create_test_namespace(cluster, f"{namespace}-plain")
    labelled = OperatorProcess(
        cluster, namespace, extra_env={"KIMIK3_PODMONITOR_LABELS": "release=kps"}
    )
    plain = OperatorProcess(cluster, unlabelled)
    labelled.start()
    plain.start()
    try:
        cluster.apply(kimi("seen", **SMALL), namespace)
        cluster.apply(kimi("unseen", **SMALL), unlabelled)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=chart_monitors(namespace))
        for name, where in (("seen", namespace), ("unseen", unlabelled)):
            wait_for(
                lambda n=name, w=where: cluster.get("podmonitor", n, w), 90, f"{name}'s PodMonitor"
            )
        made = cluster.get("podmonitor", "seen", namespace)
        assert made is not None and made["metadata"]["labels"]["release"] == "kps"
        cluster.apply(prometheus(namespace), namespace)

        def config() -> str | None:
            secret = cluster.get("secret", "prometheus-kps", namespace)
            data = ((secret or {}).get("data") or {}).get("prometheus.yaml.gz")
            if not data:
                return None
            import base64

            text = gzip.decompress(base64.b64decode(data)).decode()
            return text if f"podMonitor/{namespace}/seen/" in text else None

        generated = wait_for(
            config, 90, "the Prometheus configuration with the labelled PodMonitor",
            lambda: (RUN / "prometheus-operator.log").read_text()[-3000:],
        )  # fmt: skip
        jobs = [j["job_name"] for j in yaml.safe_load(generated)["scrape_configs"]]
        assert f"podMonitor/{namespace}/seen/0" in jobs
        assert f"serviceMonitor/{namespace}/kimik3-operator/0" in jobs
        assert not [j for j in jobs if f"/{unlabelled}/" in j], "an unlabelled monitor was picked"

        def rules() -> str | None:
            found = cluster.get("configmap", "prometheus-kps-rulefiles-0", namespace)
            text = "".join(((found or {}).get("data") or {}).values())
            return text if "KimiK3DeploymentDegraded" in text else None

        wait_for(rules, 60, "the chart's alert rules in the Prometheus rule files")
    finally:
        labelled.stop()
        plain.stop()
