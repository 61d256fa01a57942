"""A bad operator setting stops the operator at once, naming the variable, the value and what
it takes: its pod goes to CrashLoopBackOff with the reason, never Running while it retries."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from kimik3_operator.config import Settings, SettingsError

OPERATOR = pathlib.Path(__file__).resolve().parents[2]

BAD = [
    ("KIMIK3_RESYNC_SECONDS", "abc", "is not a number"),
    ("KIMIK3_RESYNC_SECONDS", "0", "out of range"),
    ("KIMIK3_RESYNC_SECONDS", "nan", "out of range"),
    ("KIMIK3_METRICS_PORT", "70000", "out of range: a whole number from 0 to 65535"),
    ("KIMIK3_METRICS_PORT", "8081.5", "is not a whole number"),
    ("KIMIK3_WORKERS", "0", "out of range"),
    ("KIMIK3_GPU_INVENTORY", "maybe", "is not true or false"),
    ("KIMIK3_HEALTH_ENDPOINT", "0.0.0.0:8080", "is not an http:// URL"),
    ("KIMIK3_HEALTH_ENDPOINT", "http://0.0.0.0/healthz", "names no port"),
    ("KIMIK3_HEALTH_ENDPOINT", "http://0.0.0.0:99999/healthz", "port out of range"),
    ("KIMIK3_METRICS_ADDRESS", "everywhere", "is not an IP address"),
    ("KIMIK3_NAMESPACES", "team-a,Team_B", "is not a namespace name"),
    ("KIMIK3_LEASE_NAMESPACE", "kube system", "is not a namespace name"),
    ("KIMIK3_LEASE_NAME", "Operator!", "is not an object name"),
    ("KIMIK3_SCRAPE_URL", "file:///etc/passwd", "is not an http:// URL"),
    ("KIMIK3_PODMONITOR_LABELS", "release", "'release' is not a label"),
    ("KIMIK3_PODMONITOR_LABELS", "release=a b", "is not a label"),
]


@pytest.mark.parametrize(("name", "value", "problem"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_a_bad_setting_is_named_with_its_value_and_what_it_takes(
    name: str, value: str, problem: str
) -> None:
    with pytest.raises(SettingsError, match=problem) as raised:
        Settings.from_env({name: value})
    assert str(raised.value).startswith(f"{name}={value!r}:")


def test_the_defaults_and_the_values_the_chart_and_tests_use_are_taken() -> None:
    assert Settings.from_env({}).resync_seconds == 30.0
    settings = Settings.from_env(
        {
            "KIMIK3_NAMESPACES": "team-a, team-b",
            "KIMIK3_RESYNC_SECONDS": "5",
            "KIMIK3_HEALTH_ENDPOINT": "http://0.0.0.0:8080/healthz",
            "KIMIK3_METRICS_PORT": "0",
            "KIMIK3_GPU_INVENTORY": "False",
            "KIMIK3_SCRAPE_URL": "http://127.0.0.1:9/{namespace}/{pod}",
            "KIMIK3_LEASE_NAME": "kimik3-operator",
            "KIMIK3_LEASE_SECONDS": "12",
            "KIMIK3_ACCEPTANCE_WINDOW_SECONDS": "5",
            "KIMIK3_WORKERS": "",
            "KIMIK3_PODMONITOR_LABELS": "release=kube-prometheus-stack, example.com/team=llm",
        }
    )
    assert settings.pod_monitor_labels == (
        ("release", "kube-prometheus-stack"),
        ("example.com/team", "llm"),
    )
    assert settings.namespaces == ("team-a", "team-b")
    assert (settings.metrics_port, settings.gpu_inventory, settings.workers) == (0, False, 8)


def run_operator(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kimik3_operator", "run"],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(OPERATOR),
            "HOME": "/nonexistent",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_operator_exits_at_once_on_a_bad_setting_without_a_traceback() -> None:
    done = run_operator({"KIMIK3_RESYNC_SECONDS": "abc", "KUBECONFIG": "/nonexistent"})
    assert done.returncode == 2
    assert "kimik3 run: KIMIK3_RESYNC_SECONDS='abc': is not a number" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_operator_exits_at_once_when_it_cannot_reach_any_api_server() -> None:
    done = run_operator({"KUBECONFIG": "/nonexistent/kubeconfig"})
    assert done.returncode == 2
    assert "kimik3 run: no way to reach the API server" in done.stderr
    assert "KUBECONFIG" in done.stderr and "Traceback" not in done.stderr


def test_every_alert_says_what_alertmanager_reads_and_links_its_troubleshooting_section() -> None:
    """summary, description and runbook_url on every alert of the chart; each runbook_url's
    anchor is a heading of docs/troubleshooting.md (GitHub's anchor: the heading, lowercase)."""
    import re

    root = OPERATOR.parent
    rules = (root / "charts/kimik3-operator/templates/prometheusrule.yaml").read_text()
    headings = {
        line.removeprefix("### ").strip().lower()
        for line in (root / "docs/troubleshooting.md").read_text().splitlines()
        if line.startswith("### ")
    }
    alerts = re.split(r"\n    - alert: ", rules)[1:]
    assert len(alerts) >= 7
    for alert in alerts:
        name = alert.split("\n", 1)[0].strip()
        for key in ("summary:", "description:", "runbook_url:"):
            assert key in alert, f"{name} has no {key}"
        assert f"runbookURL }}}}#{name.lower()}" in alert, name
        assert name.lower() in headings, f"docs/troubleshooting.md has no section {name}"


def test_the_client_keeps_as_many_connections_as_the_operator_uses_at_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the pool's size each request opens and drops a TLS connection: the operator's
    client keeps one for each write its workers may have in flight."""
    import yaml

    from kimik3_operator.kube import ApiKube

    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def pool_size(kube: ApiKube) -> int:
        size: int = kube.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"]
        return size

    assert pool_size(ApiKube.from_environment(connections=56)) == 56
    assert pool_size(ApiKube.from_environment()) == 5 * (os.cpu_count() or 1)
