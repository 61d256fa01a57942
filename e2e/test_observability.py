"""Dashboards and alerts against a real Prometheus (Debian's `prometheus`, on 127.0.0.1),
scraping two fake vLLM leaders (e2e/support/vllm_exporter.py: vLLM's exact metric names with known
rates, standing in for GPU pods that cannot run here) and the operator's own metrics, which
the operator's real acceptance reader fills from the same fake leaders. Every panel query and every
alert expression is evaluated through the HTTP API and compared with what the known rates
imply, within 1%. The alerts' promtool unit tests run here too."""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client import start_http_server

from e2e.support.cluster import ROOT, free_port
from e2e.support.prometheus import (
    DASHBOARDS,
    Prometheus,
    chart_rules,
    expand,
    operator_job,
    start_prometheus,
)
from e2e.support.vllm_exporter import FakeLeader, serve, serve_text
from kimik3_operator import metrics
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.observation.readings import Readings
from kimik3_operator.runtime.readers import AcceptanceReader

pytestmark = pytest.mark.kwok

PICKER_METRICS = (
    "# TYPE inference_pool_ready_pods gauge\n"
    'inference_pool_ready_pods{name="k3"} 2\n'
    "# TYPE inference_pool_average_queue_size gauge\n"
    'inference_pool_average_queue_size{name="k3"} 1.5\n'
)
LEADER_B = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
API = "serving.kimik3.io/v1alpha1"


@pytest.fixture(scope="module")
def leaders() -> Iterator[dict[str, FakeLeader]]:
    started = time.time()
    fleet = {
        "k3-0": FakeLeader(started=started),
        "k3-1": FakeLeader(
            started=started,
            drafts_per_second=30.0,
            per_position=LEADER_B,
            running=5.0,
            kv_cache_usage=0.62,
            generation_tokens_per_second=200,
        ),
    }
    ports = {name: free_port() for name in fleet}
    servers = [serve(leader, ports[name]) for name, leader in fleet.items()]
    for name, leader in fleet.items():
        leader.port = ports[name]  # type: ignore[attr-defined]
    yield fleet
    for server in servers:
        server.shutdown()


@pytest.fixture(scope="module")
def operator_metrics(leaders: dict[str, FakeLeader]) -> Iterator[int]:
    """The operator's metric registry, filled by its real reconcile and acceptance reader."""
    import sys

    sys.path.insert(0, str(ROOT / "operator" / "tests"))
    from conftest import FakeKube, key_of, resource  # the unit tier's recording fake API

    kube = FakeKube()
    # Two one-pod groups with a canary: a change of the pods goes to group 1 (k3-1) first,
    # and its window is long enough to be observed for the whole test.
    kube.put(
        resource(
            replicas=2,
            parallelism={"tensor": 8},
            monitoring={"minAcceptanceRate": 0.6},
            rollout={"canary": {"window": "1h"}},
            routing={},
        )
    )
    kube.put({**resource("old", engine={"image": "vllm/vllm-openai:v0.27.1"})})
    for name in ("k3", "old"):
        body = kube.get(API, "KimiK3Deployment", name, "llm")
        assert body is not None
        reconcile(kube, key_of(body))

    def template() -> str:
        lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
        assert lws is not None
        labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
        return str(labels["serving.kimik3.io/template-hash"])

    stable = template()
    body = kube.get(API, "KimiK3Deployment", "k3", "llm")
    assert body is not None
    body["spec"]["engine"] = {"gpuMemoryUtilization": 0.85}
    kube.put(body)
    reconcile(kube, key_of(body))
    templates = {"k3-0": stable, "k3-1": template()}
    for group, pod in enumerate(leaders):
        kube.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": "llm",
                    "uid": f"uid-{pod}",
                    "labels": {
                        "app.kubernetes.io/instance": "k3",
                        "app.kubernetes.io/component": "leader",
                        "app.kubernetes.io/managed-by": "kimik3-operator",
                        "leaderworkerset.sigs.k8s.io/group-index": str(group),
                        "serving.kimik3.io/template-hash": templates[pod],
                    },
                    # As LeaderWorkerSet makes it: controlled by its leader StatefulSet.
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "StatefulSet",
                            "name": "k3",
                            "uid": "uid-sts",
                            "controller": True,
                        }
                    ],
                },
                "status": {
                    "podIP": "127.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )

    def fetch(url: str) -> str:
        port = leaders[url.rsplit("/", 1)[1]].port  # type: ignore[attr-defined]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text: str = r.read().decode()
            return text

    reader = AcceptanceReader(window_seconds=20, url_override="http://127.0.0.1/{pod}", fetch=fetch)
    port = free_port()
    start_http_server(port, "127.0.0.1")
    # This process stands in for an active operator, as Manager.set_active(True) makes one.
    metrics.LEADING.set(1)
    stop = threading.Event()

    def operate() -> None:
        """What the operator's manager does: scrape, and reconcile with the readings, every
        second."""
        while not stop.is_set():
            body = kube.get(API, "KimiK3Deployment", "k3", "llm")
            assert body is not None
            reader.tick(kube, body)
            for name in ("k3", "old"):
                readings = Readings(acceptance=reader.reading(("llm", name)))
                reconcile(kube, ("llm", name), Context(readings=readings))
            stop.wait(1)

    worker = threading.Thread(target=operate, daemon=True)
    worker.start()
    time.sleep(22)  # one whole acceptance window
    yield port
    stop.set()
    worker.join(timeout=10)


@pytest.fixture(scope="module")
def prometheus(
    leaders: dict[str, FakeLeader], operator_metrics: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    targets = [
        {
            "targets": [f"127.0.0.1:{leader.port}"],  # type: ignore[attr-defined]
            "labels": {"namespace": "llm", "app_kubernetes_io_instance": "k3", "pod": name},
        }
        for name, leader in leaders.items()
    ]
    # The endpoint picker's pool gauges (names checked against the real picker in
    # e2e/test_routing.py), as its PodMonitor labels them.
    picker = serve_text(lambda _path: PICKER_METRICS)
    picker_target = {
        "targets": [f"127.0.0.1:{picker.server_address[1]}"],
        "labels": {"namespace": "llm", "app_kubernetes_io_instance": "k3", "pod": "k3-epp-0"},
    }
    process, server = start_prometheus(
        work,
        [
            {"job_name": "vllm", "static_configs": targets},
            {"job_name": "endpoint-picker", "static_configs": [picker_target]},
            operator_job(operator_metrics),
        ],
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                # rate() over 30 s needs a full window of 1 s scrapes, and 5m panels 2 points.
                up = server.values('count_over_time(up{job="vllm"}[40s])')
                if up and min(up.values()) >= 35:
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            raise AssertionError((work / "log").read_text()[-2000:])
        yield server
    finally:
        process.terminate()
        process.wait(timeout=20)
        picker.shutdown()


def expected(leaders: dict[str, FakeLeader]) -> dict[tuple[str, str, str], Any]:
    a, b = leaders["k3-0"], leaders["k3-1"]
    drafts = a.drafts_per_second + b.drafts_per_second
    accepted = a.drafts_per_second * sum(a.per_position) + b.drafts_per_second * sum(b.per_position)
    drafted = drafts * 8
    per_pos = [
        (a.drafts_per_second * x + b.drafts_per_second * y) / drafts
        for x, y in zip(a.per_position, b.per_position, strict=True)
    ]
    generation = a.generation_tokens_per_second + b.generation_tokens_per_second
    return {
        ("kimik3-speculative-decoding.json", "Acceptance rate (last 5m)", "A"): accepted / drafted,
        ("kimik3-speculative-decoding.json", "Acceptance rate", "A"): accepted / drafted,
        ("kimik3-speculative-decoding.json", "Mean acceptance length", "A"): 1 + accepted / drafts,
        ("kimik3-speculative-decoding.json", "Acceptance by draft position", "A"): per_pos,
        ("kimik3-speculative-decoding.json", "Drafted vs accepted tokens per second", "A"): drafted,
        (
            "kimik3-speculative-decoding.json",
            "Drafted vs accepted tokens per second",
            "B",
        ): accepted,
        ("kimik3-speculative-decoding.json", "Output tokens from the drafter", "A"): accepted
        / generation,
        ("kimik3-speculative-decoding.json", "Acceptance rate per pod", "A"): sorted(
            [sum(a.per_position) / 8, sum(b.per_position) / 8]
        ),
        ("kimik3-serving.json", "Generation throughput", "A"): generation,
        ("kimik3-serving.json", "Time to first token (p50, p99)", "A"): 0.25 + 0.25 * 0.2 / 0.3,
        ("kimik3-serving.json", "Time to first token (p50, p99)", "B"): 1 + 1.5 * 0.09 / 0.095,
        ("kimik3-serving.json", "Inter-token latency (p50, p99)", "A"): 0.01 + 0.015 * 0.3 / 0.35,
        ("kimik3-serving.json", "Inter-token latency (p50, p99)", "B"): 0.05 + 0.05 * 0.09 / 0.095,
        ("kimik3-serving.json", "Requests running and waiting", "A"): a.running + b.running,
        ("kimik3-serving.json", "Requests running and waiting", "B"): a.waiting + b.waiting,
        ("kimik3-serving.json", "KV-cache use", "A"): (a.kv_cache_usage + b.kv_cache_usage) / 2,
        ("kimik3-serving.json", "Preemptions", "A"): a.preemptions_per_second
        + b.preemptions_per_second,
        ("kimik3-operator.json", "Acceptance rate per deployment", "A"): accepted / drafted,
        # The picker's pool as the fake picker below reports it.
        (
            "kimik3-serving.json",
            "Endpoint picker: routable leaders and their average queue",
            "A",
        ): 2,
        (
            "kimik3-serving.json",
            "Endpoint picker: routable leaders and their average queue",
            "B",
        ): 1.5,
        # The canary is k3-1 (group 1), the stable group k3-0.
        ("kimik3-speculative-decoding.json", "Canary vs stable acceptance", "A"): sorted(
            [sum(a.per_position) / 8, sum(b.per_position) / 8]
        ),
    }


def panel_targets() -> Iterator[tuple[str, str, str, str]]:
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                yield path.name, panel["title"], target["refId"], target["expr"]


def close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=0.01)


def test_every_panel_query_gives_the_known_values(
    prometheus: Prometheus, leaders: dict[str, FakeLeader]
) -> None:
    wants = expected(leaders)
    checked = set()
    for dashboard, title, ref, expr in panel_targets():
        result = prometheus.values(expand(expr))
        key = (dashboard, title, ref)
        assert result, f"{dashboard} / {title} / {ref} returned no data: {expr}"
        for value in result.values():
            assert math.isfinite(value), f"{title}: {value}"
        if key not in wants:
            continue
        checked.add(key)
        want = wants[key]
        got = sorted(result.values())
        if isinstance(want, list):
            if title == "Acceptance by draft position":
                series = prometheus.query(expand(expr))
                got = [
                    float(s["value"][1])
                    for s in sorted(series, key=lambda s: int(s["metric"]["position"]))
                ]
            assert len(got) == len(want) and all(
                close(g, w) for g, w in zip(got, want, strict=True)
            ), (title, got, want)
        else:
            assert len(got) == 1 and close(got[0], want), (title, got, want)
    assert checked == set(wants), set(wants) - checked


def test_idle_ratios_show_no_data_not_nan(prometheus: Prometheus) -> None:
    for dashboard, title, _, expr in panel_targets():
        if "> 0)" not in expr or 'namespace=~"$namespace"' not in expr:
            continue  # only the selections a user can narrow to an idle deployment
        idle = expand(expr).replace('namespace=~".*"', 'namespace="nowhere"')
        assert prometheus.query(idle) == [], f"{dashboard} / {title} must guard its ratio"


def test_alert_expressions_on_live_data(prometheus: Prometheus) -> None:
    # The chart's operator alerts select its Service's job; here the operator is job "operator".
    chart_job = 'job="t-kimik3-operator-metrics", namespace="default"'
    firing = {
        rule["alert"]: prometheus.query(rule["expr"].replace(chart_job, 'job="operator"'))
        for rule in chart_rules()
    }
    assert set(firing) == {
        "KimiK3AcceptanceBelowMinimum",
        "KimiK3SpeculativeDecodingStalled",
        "KimiK3DeploymentDegraded",
        "KimiK3PreflightFailed",
        "KimiK3CanaryRolledBack",
        "KimiK3AutoscalingHeldForAcceptance",
        "KimiK3TransferLosesDrafterState",
        "KimiK3OperatorDown",
        "KimiK3OperatorNotLeading",
    }
    assert firing["KimiK3OperatorDown"] == [], "the operator is scraped"
    assert firing["KimiK3OperatorNotLeading"] == [], "a standalone operator leads"
    nowhere = prometheus.query(
        next(r["expr"] for r in chart_rules() if r["alert"] == "KimiK3OperatorDown").replace(
            chart_job, 'job="nowhere"'
        )
    )
    assert len(nowhere) == 1, "no such job: the operator is down"
    below = firing["KimiK3AcceptanceBelowMinimum"]
    assert [s["metric"]["name"] for s in below] == ["k3"], "0.5875 is below the minimum 0.6"
    assert close(float(below[0]["value"][1]), 0.5875)
    assert firing["KimiK3SpeculativeDecodingStalled"] == [], "drafts are flowing"
    degraded = firing["KimiK3DeploymentDegraded"]
    assert [(s["metric"]["name"], s["metric"]["reason"]) for s in degraded] == [
        ("old", "PreflightFailed")
    ], "the refused deployment is Degraded, k3 is not"
    refused = firing["KimiK3PreflightFailed"]
    assert [(s["metric"]["name"], s["metric"]["reason"]) for s in refused] == [
        ("old", "TargetLacksEagle3")
    ]
    assert firing["KimiK3CanaryRolledBack"] == [], "k3's canary is still observed"
    assert firing["KimiK3AutoscalingHeldForAcceptance"] == [], "no deployment is autoscaled"
    assert firing["KimiK3TransferLosesDrafterState"] == [], "no deployment is disaggregated"


def test_alert_unit_tests_with_promtool(tmp_path: pathlib.Path) -> None:
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "kimik3-operator", "rules": chart_rules()}]})
    )
    shutil.copy(ROOT / "observability" / "alerts-test.yaml", tmp_path / "alerts-test.yaml")
    checked = subprocess.run(
        ["promtool", "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        ["promtool", "test", "rules", "alerts-test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_dashboards_json_is_generated_from_the_code() -> None:
    from observability.dashboards import DASHBOARDS as BUILDERS
    from observability.dashboards import render

    for name, builder in BUILDERS.items():
        assert (DASHBOARDS / name).read_text() == render(builder), (
            f"run python -m observability.dashboards: {name} drifted from the code"
        )


def test_every_panel_names_its_metrics() -> None:
    for path in DASHBOARDS.glob("*.json"):
        dashboard = json.loads(path.read_text())
        names = {v["name"] for v in dashboard["templating"]["list"]}
        assert {"datasource", "namespace", "deployment"} <= names
        for panel in dashboard["panels"]:
            if panel.get("type") == "row":
                continue
            description = panel.get("description", "")
            for target in panel["targets"]:
                metric = next(
                    m for m in ("vllm:", "kimik3_", "inference_pool_") if m in target["expr"]
                )
                assert metric in description, (path.name, panel["title"])


def test_operator_writes_acceptance_to_status_on_the_real_control_plane(
    cluster: Any, namespace: str, wait_condition: Any, leaders: dict[str, FakeLeader]
) -> None:
    """KWOK pods have no network: KIMIK3_SCRAPE_URL points the operator's scrape at a fake
    leader, as documented in the README."""
    from e2e.support.cluster import OperatorProcess, kimi, wait_for

    port = leaders["k3-0"].port  # type: ignore[attr-defined]
    operator = OperatorProcess(
        cluster,
        namespace,
        extra_env={
            "KIMIK3_SCRAPE_URL": f"http://127.0.0.1:{port}/metrics",
            "KIMIK3_SCRAPE_SECONDS": "1",
            "KIMIK3_ACCEPTANCE_WINDOW_SECONDS": "5",
        },
        label="-scrape",
    )
    operator.start()
    try:
        cluster.apply(
            kimi(
                "k3",
                engine={"image": "vllm/vllm-openai:v0.33.0"},
                preflight={"probe": False},
                parallelism={"tensor": 8},
            ),
            namespace,
        )
        body = wait_condition(
            "k3", namespace, "SpeculationEffective", "True", "AcceptanceAboveMinimum", timeout=90
        )
        speculative = wait_for(
            lambda: (
                (cluster.get("kk3d", "k3", namespace) or {}).get("status", {}).get("speculative")
                if "acceptanceRate"
                in (cluster.get("kk3d", "k3", namespace) or {})
                .get("status", {})
                .get("speculative", {})
                else None
            ),
            30,
            "status.speculative.acceptanceRate",
        )
        assert close(speculative["acceptanceRate"], 0.7)
        assert close(speculative["meanAcceptanceLength"], 6.6)
        assert all(
            close(g, w)
            for g, w in zip(
                speculative["perPositionAcceptance"], leaders["k3-0"].per_position, strict=True
            )
        )
        assert body["status"]["conditions"]
        table = cluster.kubectl("get", "kk3d", "k3", "-n", namespace).stdout
        assert "0.7" in table.splitlines()[1].split()[6]
        import sys

        shown = subprocess.run(
            [sys.executable, "-m", "kimik3_operator", "status", "k3", "-n", namespace],
            capture_output=True,
            text=True,
            env=cluster.env,
            check=True,
        ).stdout
        print(shown)
        assert "SpeculationEffective" in shown and "acceptance rate 70.0%" in shown
        assert "  7 " in shown and "30.0%" in shown
    finally:
        operator.stop()


def test_speculative_dashboard_renders_to_a_picture(prometheus: Prometheus) -> None:
    from scripts.render_dashboard import render

    out = ROOT / "e2e" / ".run" / "speculative-decoding.png"
    out.parent.mkdir(exist_ok=True)
    panels = render(prometheus.url, DASHBOARDS / "kimik3-speculative-decoding.json", out, 1.0)
    assert panels == 8
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
