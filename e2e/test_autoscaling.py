"""Autoscaling on the real control plane: KEDA v2.21.0 built from its module (its operator and
its metrics adapter, registered as the external-metrics API), the HPA of the real
kube-controller-manager, a real Prometheus, the real LeaderWorkerSet controller and scheduler,
and KWOK GPU nodes (fake: no kubelet, no GPU, since neither can exist here).

Stand-ins: KWOK's pods run nothing, so the leaders' vLLM series come from a fake exporter
(e2e/support/vllm_exporter.py): Prometheus scrapes them labelled as the operator's PodMonitor
labels a leader's series (namespace, app_kubernetes_io_instance, pod), and the operator's own
acceptance scrape reads each leader's spec-decode counters from it.

The chain is the one a cluster runs: waiting requests -> Prometheus -> KEDA's prometheus
scaler -> the adapter -> the HPA -> the KimiK3Deployment's scale subresource -> the operator ->
the LeaderWorkerSet -> groups.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from e2e.support.cluster import RUN, Cluster, OperatorProcess, condition, kimi, wait_for
from e2e.support.keda import Keda
from e2e.support.prometheus import Prometheus, chart_rules, operator_job, start_prometheus
from e2e.support.vllm_exporter import FakeLeader, serve_text

pytestmark = pytest.mark.kwok

GOOD = (0.9, 0.8, 0.7, 0.6)  # 75 % of drafted tokens accepted
BAD = (0.1, 0.05, 0.0, 0.0)  # under 4 %
PER_GROUP = 4  # waiting requests one group is sized for


class Load:
    """The leaders' load, per deployment: the waiting requests Prometheus reads (on the
    leader of group 0: the query sums over leaders) and the drafter's acceptance the
    operator reads from every leader."""

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, str], float] = {}
        self.acceptance: dict[tuple[str, str], tuple[float, ...]] = {}
        self.leaders: dict[str, FakeLeader] = {}
        self.lock = threading.Lock()

    def leader(self, namespace: str, pod: str) -> str:
        deployment = pod.rsplit("-", 1)[0]
        key = (namespace, deployment)
        with self.lock:
            found = self.leaders.get(f"{namespace}/{pod}")
            quality = self.acceptance.get(key, GOOD)
            if found is None or tuple(found.per_position) != quality:
                found = FakeLeader(per_position=quality, drafts_per_second=20.0)
                self.leaders[f"{namespace}/{pod}"] = found
        return found.exposition()

    def series(self) -> str:
        """What Prometheus scrapes: the series as a PodMonitor labels them."""
        labels = ["namespace", "app_kubernetes_io_instance", "pod", "model_name"]
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "waiting", labels=labels)
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "kv", labels=labels)
        with self.lock:
            for (namespace, name), value in self.waiting.items():
                values = [namespace, name, f"{name}-0", "moonshotai/Kimi-K3"]
                waiting.add_metric(values, value)
                usage.add_metric(values, 0.3)

        class _Families:
            def collect(self) -> Iterator[Metric]:
                yield waiting
                yield usage

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families())  # type: ignore[arg-type]
        return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def keda(cluster: Cluster) -> Iterator[Keda]:
    found = Keda(cluster)
    found.start()
    yield found
    found.stop()


@pytest.fixture(scope="module")
def load() -> Iterator[tuple[Load, int]]:
    found = Load()

    def text_for(path: str) -> str | None:
        if path == "/prometheus":
            return found.series()
        _, namespace, pod = path.split("/", 2)
        return found.leader(namespace, pod)

    server = serve_text(text_for)
    yield found, server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def prometheus(load: tuple[Load, int]) -> Iterator[Prometheus]:
    scrape = {
        "job_name": "leaders",
        "honor_labels": True,
        "metrics_path": "/prometheus",
        "static_configs": [{"targets": [f"127.0.0.1:{load[1]}"]}],
    }
    process, found = start_prometheus(RUN / "prometheus-autoscaling", [scrape])
    wait_for(lambda: _up(found), 60, "Prometheus up")
    yield found
    process.terminate()
    process.wait(timeout=30)


def _alerting(prometheus: Prometheus, alert: str, namespace: str, name: str) -> bool:
    try:
        found = prometheus.query(alert)
    except (AssertionError, OSError):
        return False
    return any(
        s["metric"].get("namespace") == namespace and s["metric"].get("name") == name for s in found
    )


def _up(prometheus: Prometheus) -> bool:
    try:
        return bool(prometheus.query("up"))
    except (AssertionError, OSError):
        return False


@pytest.fixture
def scaling_operator(
    cluster: Cluster,
    namespace: str,
    keda: Keda,
    load: tuple[Load, int],
    prometheus: Prometheus,
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(
        cluster,
        namespace,
        extra_env={
            "KIMIK3_PROMETHEUS_URL": prometheus.url,
            "KIMIK3_SCRAPE_URL": f"http://127.0.0.1:{load[1]}/{{namespace}}/{{pod}}",
            "KIMIK3_SCRAPE_SECONDS": "1",
            "KIMIK3_ACCEPTANCE_WINDOW_SECONDS": "5",
            "KIMIK3_RESYNC_SECONDS": "2",
        },
        label="-autoscaling",
    )
    operator.start()
    yield operator
    operator.stop()
    cluster.kubectl("delete", "kk3d", "--all", "-n", namespace, "--wait=false", check=False)


def spec(max_replicas: int = 3, window: int = 10) -> dict[str, Any]:
    return {
        "replicas": 1,
        "drafter": {"method": "dspark"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0"},
        "parallelism": {"tensor": 8},
        "preflight": {"probe": False},
        "monitoring": {"minAcceptanceRate": 0.5},
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": max_replicas,
            "target": {"waitingRequestsPerGroup": PER_GROUP},
            "behavior": {"scaleDownStabilizationSeconds": window, "pollingIntervalSeconds": 5},
        },
    }


def body(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get("kk3d", name, namespace) or {}


def groups(cluster: Cluster, namespace: str, name: str) -> tuple[int, int]:
    """(spec.replicas as the HPA wrote it, the LeaderWorkerSet's replicas)."""
    asked = int(body(cluster, namespace, name).get("spec", {}).get("replicas", 0))
    lws = cluster.get("leaderworkerset", name, namespace) or {}
    return asked, int(lws.get("spec", {}).get("replicas", 0))


def ready_groups(cluster: Cluster, namespace: str, name: str) -> int:
    lws = cluster.get("leaderworkerset", name, namespace) or {}
    return int(lws.get("status", {}).get("readyReplicas", 0))


def describe(cluster: Cluster, namespace: str, name: str) -> str:
    found = body(cluster, namespace, name)
    hpa = cluster.kubectl("get", "hpa", "-n", namespace, "-o", "json", check=False).stdout
    so = cluster.get("scaledobject", name, namespace) or {}
    return json.dumps(
        {
            "status": found.get("status", {}),
            "spec.replicas": found.get("spec", {}).get("replicas"),
            "scaledobject": {"metadata": so.get("metadata", {}), "status": so.get("status")},
            "hpa": [h.get("status") for h in json.loads(hpa or '{"items": []}')["items"]],
        },
        indent=1,
    )[-6000:]


def started(cluster: Cluster, namespace: str, name: str, max_replicas: int = 3) -> None:
    """The deployment applied, its one group Ready and KEDA's HPA made."""
    cluster.apply(kimi(name, **spec(max_replicas)), namespace)
    wait_for(
        lambda: (
            ready_groups(cluster, namespace, name) == 1
            and cluster.kubectl(
                "get", "hpa", f"keda-hpa-{name}", "-n", namespace, check=False
            ).returncode
            == 0
        ),
        120,
        "one Ready group and KEDA's HPA",
        lambda: describe(cluster, namespace, name),
    )


def test_groups_follow_the_waiting_requests_up_and_down(
    cluster: Cluster,
    namespace: str,
    scaling_operator: OperatorProcess,
    load: tuple[Load, int],
) -> None:
    fleet, _ = load
    name = "k3-load"
    started(cluster, namespace, name)
    so = cluster.get("scaledobject", name, namespace) or {}
    trigger = so["spec"]["triggers"][0]
    assert so["spec"]["scaleTargetRef"]["kind"] == "KimiK3Deployment"
    assert trigger["metricType"] == "AverageValue"
    assert f'app_kubernetes_io_instance="{name}"' in trigger["metadata"]["query"]

    # 10 waiting requests at 4 per group: ceil(10 / 4) = 3 groups.
    began = time.monotonic()
    fleet.waiting[(namespace, name)] = 10
    wait_for(
        lambda: (
            groups(cluster, namespace, name) == (3, 3)
            and ready_groups(cluster, namespace, name) == 3
        ),
        120,
        "three Ready groups after the queue grew",
        lambda: describe(cluster, namespace, name),
    )
    print(f"queue up -> 3 groups Ready in {time.monotonic() - began:.1f}s")
    found = body(cluster, namespace, name)
    assert condition(found, "Autoscaling")["reason"] == "AutoscalingActive"
    assert found["status"]["autoscaling"]["acceptedReplicas"] == 3

    # The queue drains: back to minReplicas once the 10 s window has passed, one group at a time.
    fleet.waiting[(namespace, name)] = 0
    seen: list[int] = []

    def back_to_one() -> bool:
        seen.append(groups(cluster, namespace, name)[1])
        return seen[-1] == 1

    wait_for(back_to_one, 180, "one group after the queue drained")
    assert min(seen) == 1 and all(b <= a for a, b in itertools.pairwise(seen)), seen


def test_a_collapsed_drafter_holds_scale_out_under_the_same_queue(
    cluster: Cluster,
    namespace: str,
    scaling_operator: OperatorProcess,
    load: tuple[Load, int],
) -> None:
    fleet, _ = load
    name = "k3-drafter"
    started(cluster, namespace, name)
    fleet.acceptance[(namespace, name)] = BAD
    wait_for(
        lambda: (
            (condition(body(cluster, namespace, name), "Autoscaling") or {}).get("reason")
            == "HeldForAcceptance"
        ),
        90,
        "scaling held for the collapsed acceptance",
        lambda: describe(cluster, namespace, name),
    )
    so = cluster.get("scaledobject", name, namespace) or {}
    assert so["metadata"]["annotations"]["autoscaling.keda.sh/paused-scale-out"] == "true"
    message = condition(body(cluster, namespace, name), "Autoscaling")["message"]
    assert "acceptance" in message and "no group is added" in message

    # The same queue that bought two groups above buys none while the drafter is broken.
    fleet.waiting[(namespace, name)] = 12
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        assert groups(cluster, namespace, name)[1] == 1, describe(cluster, namespace, name)
        time.sleep(2)
    events = cluster.events(namespace, f"involvedObject.name={name},reason=HeldForAcceptance")
    assert events, "no event named the hold"
    # The chart's alert, evaluated by a real Prometheus on the operator's own metrics: pending
    # at once (it fires after the chart's 5 minutes, which the promtool test covers).
    process, rules = start_prometheus(
        RUN / "prometheus-autoscaling-rules",
        [operator_job(scaling_operator.metrics_port)],
        chart_rules(),
    )
    try:
        alert = 'ALERTS{alertname="KimiK3AutoscalingHeldForAcceptance",alertstate="pending"}'
        wait_for(
            lambda: _alerting(rules, alert, namespace, name),
            60,
            "the held-for-acceptance alert pending",
        )
    finally:
        process.terminate()
        process.wait(timeout=30)

    # Acceptance recovers: scaling resumes on the queue it held back.
    fleet.acceptance[(namespace, name)] = GOOD
    wait_for(
        lambda: (
            groups(cluster, namespace, name)[1] == 3
            and ready_groups(cluster, namespace, name) == 3
            and condition(body(cluster, namespace, name), "Autoscaling")["reason"]
            == "AutoscalingActive"
        ),
        150,
        "three Ready groups once acceptance recovered",
        lambda: describe(cluster, namespace, name),
    )


def test_a_scale_up_the_gpus_cannot_place_is_clamped_and_nothing_waits_pending(
    cluster: Cluster,
    namespace: str,
    scaling_operator: OperatorProcess,
    load: tuple[Load, int],
) -> None:
    fleet, _ = load
    name = "k3-clamp"
    started(cluster, namespace, name, max_replicas=12)
    fleet.waiting[(namespace, name)] = 12 * PER_GROUP
    wait_for(
        lambda: (
            (condition(body(cluster, namespace, name), "Autoscaling") or {}).get("reason")
            == "ClampedByGPUs"
            and groups(cluster, namespace, name)[0] == 12
        ),
        120,
        "the scale-up clamped",
        lambda: describe(cluster, namespace, name),
    )
    # Settled: every group made is placed and Ready; no pod waits for GPUs.
    wait_for(
        lambda: ready_groups(cluster, namespace, name) == groups(cluster, namespace, name)[1],
        120,
        "every accepted group Ready",
        lambda: describe(cluster, namespace, name),
    )
    made = groups(cluster, namespace, name)[1]
    assert made < 12
    time.sleep(10)
    assert groups(cluster, namespace, name)[1] == made
    pods = cluster.items("pods", namespace, f"app.kubernetes.io/instance={name}")
    assert pods and all(p["spec"].get("nodeName") for p in pods), [
        (p["metadata"]["name"], p["status"].get("phase")) for p in pods
    ]
    found = body(cluster, namespace, name)
    message = condition(found, "Autoscaling")["message"]
    assert f"KEDA asks for 12 group(s); {made} are made" in message, message
    assert found["status"]["autoscaling"] == {
        "desiredReplicas": 12,
        "acceptedReplicas": made,
        "maxReplicaCount": 12,
        "scaleOut": "Allowed",
        "scaleIn": "Allowed",
    }
    assert cluster.events(namespace, f"involvedObject.name={name},reason=ClampedByGPUs")
