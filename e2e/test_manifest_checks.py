"""kube-score and checkov, the checks a platform team runs, on every pod the operator makes for
each example (the leader and worker templates of a LeaderWorkerSet, or of each role of a
DisaggregatedSet, scored as the Pods they become, since neither tool reads either) and on the
chart: every finding is fixed or
explained in docs/manifest-checks.md, and that page explains no finding that is gone.

Needs no cluster: it sits in the KWOK tier because that is where the tools are built.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.support.cluster import ROOT, tools_bin
from kimik3_operator.cli import load_resource, render

pytestmark = pytest.mark.kwok

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DOC = ROOT / "docs" / "manifest-checks.md"
NAMESPACE = "llm"
# kube-score's grades: 1 critical, 5 warning, 10 ok.
FAILING_GRADES = (1, 5)


def as_pods(child: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Pods a LeaderWorkerSet makes (its leader's and workers' templates), or each role's
    of a DisaggregatedSet; nothing of any other child."""
    namespace = child["metadata"]["namespace"]
    if child["kind"] == "LeaderWorkerSet":
        sets = [(child["metadata"]["name"], child["spec"])]
    elif child["kind"] == "DisaggregatedSet":
        sets = [
            (f"{child['metadata']['name']}-{r['name']}", r["spec"]) for r in child["spec"]["roles"]
        ]
    else:
        return
    for name, spec in sets:
        for role, template in spec["leaderWorkerTemplate"].items():
            if not role.endswith("Template"):
                continue
            meta = {**template["metadata"], "name": f"{name}-{role.removesuffix('Template')}"}
            meta["namespace"] = namespace
            yield {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def rendered(tmp_path: pathlib.Path) -> list[pathlib.Path]:
    """One file per example (its children, the groups' pods among them), and the chart."""
    files = []
    for example in EXAMPLES:
        resource = load_resource(str(example))
        children = render(resource, NAMESPACE, verdict="Pass")
        pods = [pod for c in children for pod in as_pods(c)]
        path = tmp_path / example.name
        path.write_text(yaml.safe_dump_all([*children, *pods]))
        files.append(path)
    helm = str(tools_bin() / "helm")
    chart = subprocess.run(
        [helm, "template", "kimik3-operator", str(ROOT / "charts/kimik3-operator"),
         "-n", "kimik3-system"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = tmp_path / "chart.yaml"
    path.write_text(chart)
    files.append(path)
    return files


def kube_score(files: list[pathlib.Path]) -> set[tuple[str, str]]:
    """(check id, kind) of every critical or warning finding."""
    result = subprocess.run(
        [str(tools_bin() / "kube-score"), "score", "-o", "json", *map(str, files)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = set()
    for obj in json.loads(result.stdout):
        for check in obj["checks"]:
            if not check["skipped"] and check["grade"] in FAILING_GRADES:
                found.add((check["check"]["id"], obj["type_meta"]["kind"]))
    return found


def checkov(files: list[pathlib.Path]) -> set[tuple[str, str]]:
    command = subprocess.run(
        ["bash", str(ROOT / "scripts/checkov-venv.sh")], check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    args = [command, "--framework", "kubernetes", "--quiet", "--compact", "-o", "json"]
    for path in files:
        args += ["-f", str(path)]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    reports = json.loads(result.stdout)
    found = set()
    for report in reports if isinstance(reports, list) else [reports]:
        for failed in report["results"]["failed_checks"]:
            found.add((failed["check_id"], failed["resource"].split(".")[0]))
    return found


def explained() -> dict[str, set[tuple[str, str]]]:
    """The findings docs/manifest-checks.md explains: its table's tool, check and kinds."""
    found: dict[str, set[tuple[str, str]]] = {"kube-score": set(), "checkov": set()}
    for line in DOC.read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] in found:
            for kind in cells[2].replace("`", "").split(","):
                found[cells[0]].add((cells[1], kind.strip()))
    return found


def test_every_finding_on_what_the_operator_makes_is_explained(tmp_path: pathlib.Path) -> None:
    files = rendered(tmp_path)
    doc = explained()
    for tool, findings in (("kube-score", kube_score(files)), ("checkov", checkov(files))):
        unexplained = findings - doc[tool]
        assert not unexplained, f"{tool} findings not in {DOC.name}: {sorted(unexplained)}"
        stale = doc[tool] - findings
        assert not stale, f"{DOC.name} explains {tool} findings no longer made: {sorted(stale)}"
