"""Renders a dashboard's panels from a Prometheus to a PNG with matplotlib, so a reviewer can
look at what a user would see in Grafana (no Grafana runs here).

    python scripts/render_dashboard.py --prometheus http://127.0.0.1:9090 \\
        --dashboard charts/kimik3-operator/dashboards/kimik3-speculative-decoding.json \\
        --out speculative-decoding.png --minutes 2
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
import urllib.parse
import urllib.request
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

VARIABLES = (
    ("$__rate_interval", "30s"),
    ("$namespace", ".*"),
    ("$deployment", ".*"),
    ("$model_name", ".*"),
)


def expand(expr: str) -> str:
    for variable, value in VARIABLES:
        expr = expr.replace(variable, value)
    return expr


def query_range(
    prometheus: str, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode(
        {"query": expand(expr), "start": start, "end": end, "step": step}
    )
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as r:
        result: list[dict[str, Any]] = json.load(r)["data"]["result"]
        return result


def legend(template: str, metric: dict[str, str]) -> str:
    text = template
    for key, value in metric.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def render(prometheus: str, dashboard_path: pathlib.Path, out: pathlib.Path, minutes: float) -> int:
    dashboard = json.loads(dashboard_path.read_text())
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    end = time.time()
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 200)
    columns = 2
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(14, 3.4 * rows), squeeze=False)
    figure.suptitle(dashboard["title"], fontsize=15, fontweight="bold")
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel["title"], fontsize=11, loc="left")
        percent = panel.get("fieldConfig", {}).get("defaults", {}).get("unit") == "percentunit"
        for target in panel.get("targets", []):
            for series in query_range(prometheus, target["expr"], start, end, step):
                xs = [float(t) - end for t, _ in series["values"]]
                ys = [float(v) * (100 if percent else 1) for _, v in series["values"]]
                label = legend(target.get("legendFormat", ""), series["metric"])
                if panel["type"] in ("stat", "bargauge"):
                    ax.barh(label, ys[-1] if ys else 0)
                    ax.text(ys[-1] if ys else 0, label, f" {ys[-1]:.2f}" if ys else "", va="center")
                else:
                    ax.plot(xs, ys, label=label)
        if panel["type"] not in ("stat", "bargauge"):
            ax.set_xlabel("seconds before now")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="best")
        ax.set_ylabel(
            "%" if percent else panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        )
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    figure.tight_layout()
    figure.savefig(out, dpi=80)
    return len(panels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--minutes", type=float, default=5)
    args = parser.parse_args()
    count = render(args.prometheus, args.dashboard, args.out, args.minutes)
    print(f"rendered {count} panels to {args.out}")


if __name__ == "__main__":
    main()
