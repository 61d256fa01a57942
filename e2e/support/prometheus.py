"""A real Prometheus for the tests: started on the operator's and the leaders' metrics, with the
chart's rules and the dashboards' queries."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import yaml

from e2e.support.cluster import ROOT, free_port, tools_bin

CHART = ROOT / "charts" / "kimik3-operator"


DASHBOARDS = CHART / "dashboards"


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{exc}: {exc.read().decode()} for {expr}") from exc
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def values(self, expr: str) -> dict[str, float]:
        return {
            json.dumps(s["metric"], sort_keys=True): float(s["value"][1]) for s in self.query(expr)
        }


def operator_job(port: int) -> dict[str, Any]:
    """The operator's own metrics, its labels kept (they name the deployment)."""
    return {
        "job_name": "operator",
        "honor_labels": True,
        "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
    }


def start_prometheus(
    work: pathlib.Path,
    scrape_configs: list[dict[str, Any]],
    rules: list[dict[str, Any]] | None = None,
) -> tuple[subprocess.Popen[bytes], Prometheus]:
    """Debian's Prometheus on 127.0.0.1, scraping and evaluating ``rules`` every second; the
    caller stops it."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is needed (.ci/run installs it)"
    work.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": scrape_configs,
    }
    if rules:
        (work / "rules.yml").write_text(
            yaml.safe_dump({"groups": [{"name": "kimik3", "rules": rules}]})
        )
        config["rule_files"] = [str(work / "rules.yml")]
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work}/data",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "log").open("w"),
    )
    return process, Prometheus(f"http://127.0.0.1:{port}")


def expand(expr: str) -> str:
    """Grafana's variables as the test selects them: everything, a 30 s rate window."""
    for variable, value in (
        ("$__rate_interval", "30s"),
        ("$namespace", ".*"),
        ("$deployment", ".*"),
        ("$model_name", ".*"),
    ):
        expr = expr.replace(variable, value)
    return expr


def chart_rules() -> list[dict[str, Any]]:
    rendered = subprocess.run(
        [
            "helm",
            "template",
            "t",
            str(CHART),
            "--set",
            "prometheusRule.enabled=true",
            "--show-only",
            "templates/prometheusrule.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tools_bin()}:{os.environ['PATH']}"},
    ).stdout
    rules: list[dict[str, Any]] = yaml.safe_load(rendered)["spec"]["groups"][0]["rules"]
    return rules
