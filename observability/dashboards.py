"""The Grafana dashboards, built with grafana-foundation-sdk (Grafana 11) and written as JSON
into charts/kimik3-operator/dashboards/ by `python -m observability.dashboards`. A test fails
when the JSON drifts from this code; another runs every panel query against a real
Prometheus scraping vLLM's metric names.

Every ratio guards its denominator (`> 0`), so an idle model shows no data, not NaN or 0.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from grafana_foundation_sdk.builders.bargauge import Panel as BarGauge
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = pathlib.Path(__file__).resolve().parents[1] / "charts" / "kimik3-operator" / "dashboards"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
SEL = (
    'namespace=~"$namespace", app_kubernetes_io_instance=~"$deployment", model_name=~"$model_name"'
)
BY = "namespace, app_kubernetes_io_instance"


def rate(metric: str, by: str = BY, window: str = RATE, extra: str = "") -> str:
    selector = SEL + (f", {extra}" if extra else "")
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{window}]))"


def ratio(numerator: str, denominator: str) -> str:
    return f"{numerator} / ({denominator} > 0)"


def quantile(q: float, histogram: str) -> str:
    """histogram_quantile, only where the histogram has observations."""
    return (
        f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{{{SEL}}}[{RATE}])))"
        f" and on() (sum(rate({histogram}_count{{{SEL}}}[{RATE}])) > 0)"
    )


ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION = "vllm:generation_tokens_total"


def target(expr: str, legend: str, ref: str = "A") -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)


def variables(dashboard: Dashboard, vllm: bool = True) -> Dashboard:
    dashboard = dashboard.with_variable(
        DatasourceVariable("datasource").label("Data source").type("prometheus")
    )
    source = "vllm:num_requests_running" if vllm else "kimik3_deployment_condition"
    instance = "app_kubernetes_io_instance" if vllm else "name"
    dashboard = dashboard.with_variable(
        QueryVariable("namespace")
        .label("Namespace")
        .datasource(DS)
        .query(f"label_values({source}, namespace)")
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    dashboard = dashboard.with_variable(
        QueryVariable("deployment")
        .label("Deployment")
        .datasource(DS)
        .query(f'label_values({source}{{namespace=~"$namespace"}}, {instance})')
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    if vllm:
        dashboard = dashboard.with_variable(
            QueryVariable("model_name")
            .label("Model")
            .datasource(DS)
            .query('label_values(vllm:num_requests_running{namespace=~"$namespace"}, model_name)')
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    return dashboard


def speculative_decoding() -> Dashboard:
    acceptance = ratio(rate(ACCEPTED), rate(DRAFT_TOKENS))
    mean_length = "1 + " + ratio(rate(ACCEPTED), rate(DRAFTS))
    dashboard = (
        Dashboard("Kimi-K3 speculative decoding")
        .uid("kimik3-speculative")
        .tags(["kimi-k3", "vllm", "speculative-decoding"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
    )
    dashboard = variables(dashboard)
    dashboard = dashboard.with_row(Row("Acceptance"))
    dashboard = dashboard.with_panel(
        Stat()
        .title("Acceptance rate (last 5m)")
        .unit("percentunit")
        .decimals(2)
        .description(
            "Accepted draft tokens / drafted tokens over 5m, per deployment: "
            f"rate({ACCEPTED}) / rate({DRAFT_TOKENS}). No data when idle."
        )
        .with_target(
            target(
                ratio(rate(ACCEPTED, window="5m"), rate(DRAFT_TOKENS, window="5m")),
                "{{app_kubernetes_io_instance}}",
            )
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Acceptance rate")
        .unit("percentunit")
        .min(0)
        .max(1)
        .description(f"rate({ACCEPTED}) / rate({DRAFT_TOKENS}) per deployment.")
        .with_target(target(acceptance, "{{namespace}}/{{app_kubernetes_io_instance}}"))
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Mean acceptance length")
        .unit("short")
        .description(
            f"Tokens emitted per verification step: 1 + rate({ACCEPTED}) / rate({DRAFTS})."
        )
        .with_target(target(mean_length, "{{namespace}}/{{app_kubernetes_io_instance}}"))
    )
    dashboard = dashboard.with_panel(
        BarGauge()
        .title("Acceptance by draft position")
        .unit("percentunit")
        .min(0)
        .max(1)
        .description(
            f"rate({PER_POS}) by position / rate({DRAFTS}): how often the i-th "
            "drafted token is accepted."
        )
        .with_target(
            target(
                f"sum by (position) (rate({PER_POS}{{{SEL}}}[5m])) / on() group_left() "
                f"(sum(rate({DRAFTS}{{{SEL}}}[5m])) > 0)",
                "position {{position}}",
            )
        )
    )
    dashboard = dashboard.with_row(Row("Tokens"))
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Drafted vs accepted tokens per second")
        .unit("short")
        .description(f"rate({DRAFT_TOKENS}) and rate({ACCEPTED}), summed over the selection.")
        .with_target(target(f"sum(rate({DRAFT_TOKENS}{{{SEL}}}[{RATE}]))", "drafted", "A"))
        .with_target(target(f"sum(rate({ACCEPTED}{{{SEL}}}[{RATE}]))", "accepted", "B"))
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Output tokens from the drafter")
        .unit("percentunit")
        .min(0)
        .description(
            f"rate({ACCEPTED}) / rate({GENERATION}): the share of generated tokens "
            "the drafter proposed and the target accepted."
        )
        .with_target(
            target(
                ratio(rate(ACCEPTED), rate(GENERATION)),
                "{{namespace}}/{{app_kubernetes_io_instance}}",
            )
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Acceptance rate per pod")
        .unit("percentunit")
        .min(0)
        .max(1)
        .description(f"rate({ACCEPTED}) / rate({DRAFT_TOKENS}) per leader pod.")
        .with_target(
            target(ratio(rate(ACCEPTED, by="pod"), rate(DRAFT_TOKENS, by="pod")), "{{pod}}")
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Canary vs stable acceptance")
        .unit("percentunit")
        .min(0)
        .max(1)
        .description(
            "kimik3_rollout_acceptance_rate while a change is on its canary groups "
            "(spec.rollout.canary): the canary groups' and the stable groups' acceptance over "
            "the canary's window, as the operator judges them."
        )
        .with_target(
            target(
                "max by (namespace, name, track) (kimik3_rollout_acceptance_rate{namespace=~"
                '"$namespace", name=~"$deployment"})',
                "{{name}} {{track}}",
            )
        )
    )
    return dashboard


def serving() -> Dashboard:
    dashboard = (
        Dashboard("Kimi-K3 serving")
        .uid("kimik3-serving")
        .tags(["kimi-k3", "vllm"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
    )
    dashboard = variables(dashboard)
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Generation throughput")
        .unit("short")
        .description(f"rate({GENERATION}) per deployment, tokens per second.")
        .with_target(target(rate(GENERATION), "{{namespace}}/{{app_kubernetes_io_instance}}"))
    )
    for name, metric in (
        ("Time to first token", "vllm:time_to_first_token_seconds"),
        ("Inter-token latency", "vllm:inter_token_latency_seconds"),
    ):
        dashboard = dashboard.with_panel(
            Timeseries()
            .title(f"{name} (p50, p99)")
            .unit("s")
            .description(f"histogram_quantile over {metric}_bucket; no data without requests.")
            .with_target(target(quantile(0.5, metric), "p50", "A"))
            .with_target(target(quantile(0.99, metric), "p99", "B"))
        )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Requests running and waiting")
        .unit("short")
        .description("vllm:num_requests_running and vllm:num_requests_waiting, summed.")
        .with_target(target(f"sum(vllm:num_requests_running{{{SEL}}})", "running", "A"))
        .with_target(target(f"sum(vllm:num_requests_waiting{{{SEL}}})", "waiting", "B"))
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("KV-cache use")
        .unit("percentunit")
        .min(0)
        .max(1)
        .description("vllm:kv_cache_usage_perc (1 = full), averaged over the leaders.")
        .with_target(
            target(
                f"avg by ({BY}) (vllm:kv_cache_usage_perc{{{SEL}}})",
                "{{namespace}}/{{app_kubernetes_io_instance}}",
            )
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Preemptions")
        .unit("short")
        .description("rate(vllm:num_preemptions_total): requests evicted for lack of KV cache.")
        .with_target(
            target(
                rate("vllm:num_preemptions_total"), "{{namespace}}/{{app_kubernetes_io_instance}}"
            )
        )
    )
    picker = 'namespace=~"$namespace", app_kubernetes_io_instance=~"$deployment"'
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Endpoint picker: routable leaders and their average queue")
        .unit("short")
        .description(
            "With spec.routing, the endpoint picker's own view of its InferencePool: "
            "inference_pool_ready_pods (the leaders it may pick: Ready and routable) and "
            "inference_pool_average_queue_size (their vllm:num_requests_waiting, averaged)."
        )
        .with_target(
            target(
                f"sum by ({BY}) (inference_pool_ready_pods{{{picker}}})",
                "{{namespace}}/{{app_kubernetes_io_instance}} routable",
                "A",
            )
        )
        .with_target(
            target(
                f"avg by ({BY}) (inference_pool_average_queue_size{{{picker}}})",
                "{{namespace}}/{{app_kubernetes_io_instance}} queue",
                "B",
            )
        )
    )
    return dashboard


def operator() -> Dashboard:
    ns = 'namespace=~"$namespace"'
    dashboard = (
        Dashboard("kimik3-operator")
        .uid("kimik3-operator")
        .tags(["kimi-k3", "operator"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
    )
    dashboard = variables(dashboard, vllm=False)
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Reconciles by result")
        .unit("ops")
        .description("rate(kimik3_reconciles_total) by result (ok, invalid, error).")
        .with_target(
            target(f"sum by (result) (rate(kimik3_reconciles_total[{RATE}]))", "{{result}}")
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Reconcile errors")
        .unit("ops")
        .description('rate(kimik3_reconciles_total{result="error"}).')
        .with_target(
            target(f'sum(rate(kimik3_reconciles_total{{result="error"}}[{RATE}]))', "errors")
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Reconcile duration (p99)")
        .unit("s")
        .description("histogram_quantile(0.99) of kimik3_reconcile_duration_seconds.")
        .with_target(
            target(
                "histogram_quantile(0.99, sum by (le) (rate("
                f"kimik3_reconcile_duration_seconds_bucket[{RATE}]))) and on() (sum(rate("
                f"kimik3_reconcile_duration_seconds_count[{RATE}])) > 0)",
                "p99",
            )
        )
    )
    dashboard = dashboard.with_panel(
        BarGauge()
        .title("Preflight failures by reason")
        .unit("short")
        .description(
            "Deployments whose CapabilitiesVerified or DrafterPaired is False now, by "
            "reason (kimik3_deployment_condition); the history of verdicts is in "
            "kimik3_preflight_verdicts_total."
        )
        .with_target(
            target(
                'sum by (reason) (kimik3_deployment_condition{type=~"CapabilitiesVerified|'
                f'DrafterPaired", status="False", {ns}}})',
                "{{reason}}",
            )
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Deployments by condition")
        .unit("short")
        .description("kimik3_deployment_condition summed by type and status.")
        .with_target(
            target(
                f"sum by (type, status) (kimik3_deployment_condition{{{ns}}})",
                "{{type}}={{status}}",
            )
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Routable groups per deployment")
        .unit("short")
        .description(
            "kimik3_deployment_routable_groups (spec.routing): the groups the operator keeps "
            "in the endpoint picker's pool; a drop with Ready groups means a group left for "
            "its acceptance or a canary (kimik3_routing_changes_total, events GroupLeftRouting)."
        )
        .with_target(
            target(
                f'kimik3_deployment_routable_groups{{{ns}, name=~"$deployment"}}',
                "{{namespace}}/{{name}}",
            )
        )
    )
    dashboard = dashboard.with_panel(
        Timeseries()
        .title("Acceptance rate per deployment")
        .unit("percentunit")
        .min(0)
        .max(1)
        .description(
            "kimik3_deployment_acceptance_rate, as the operator computes it for status.speculative."
        )
        .with_target(
            target(
                f'kimik3_deployment_acceptance_rate{{{ns}, name=~"$deployment"}}',
                "{{namespace}}/{{name}}",
            )
        )
    )
    return dashboard


DASHBOARDS = {
    "kimik3-speculative-decoding.json": speculative_decoding,
    "kimik3-serving.json": serving,
    "kimik3-operator.json": operator,
}


def render(builder: Any) -> str:
    return json.dumps(builder().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, builder in DASHBOARDS.items():
        (OUT / name).write_text(render(builder))
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
