"""The preflight verdict for one spec: conditions, status.capabilities, and whether GPU pods
may be created. Pure: the reconcile reads the probe and passes its state in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.validation import checkpoint_config
from kimik3_operator.preflight.facts import drafter_facts, target_facts
from kimik3_operator.preflight.probe import ProbeState
from kimik3_operator.preflight.report import (
    capabilities_condition,
    capabilities_status,
    drafter_condition,
)
from kimik3_operator.preflight.rules import Facts, Finding, run_rules
from kimik3_operator.preflight.table import CapabilityTable


@dataclass(frozen=True)
class Gate:
    findings: tuple[Finding, ...]
    capabilities: Condition
    drafter: Condition
    status: dict[str, Any]
    deploy: bool

    @property
    def conditions(self) -> tuple[Condition, Condition]:
        return self.capabilities, self.drafter

    @property
    def failed(self) -> bool:
        return "False" in (self.capabilities.status, self.drafter.status)


def given_facts(spec: KimiK3DeploymentSpec, table: CapabilityTable) -> Facts:
    """The static stage's facts: the table, and the checkpoints' config.json where the spec
    gives them (spec.model.config, spec.drafter.config; checked when the spec was parsed)."""
    return Facts(
        table,
        target=target_facts(_spec_config(spec.model.config), "spec.model.config"),
        drafter=drafter_facts(_spec_config(spec.drafter.config), "spec.drafter.config"),
    )


def _spec_config(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        return checkpoint_config(text)
    except ValueError:
        return None


def probed_facts(table: CapabilityTable, report: Mapping[str, Any]) -> Facts:
    release = {
        key: report.get(key)
        for key in (
            "dspark",
            "drafters",
            "checksAuxHiddenStatesOverPP",
            "draftInheritsExpertParallel",
            "speculative",
            "serve",
            "engine",
            "construct",
            "pair",
            "vllmVersion",
        )
    }
    return Facts(
        table,
        target=target_facts(report.get("targetConfig"), "the target's config.json (probe)"),
        drafter=drafter_facts(report.get("drafterConfig"), "the drafter's config.json (probe)"),
        probed=dict(report.get("architectures") or {}),
        probed_release=release,
    )


def evaluate(
    spec: KimiK3DeploymentSpec,
    table: CapabilityTable,
    now: str,
    probe: ProbeState | None = None,
    probe_key: str = "",
) -> Gate:
    mode = spec.preflight.mode
    if mode == "Disabled":
        capabilities = Condition(
            ConditionType.CAPABILITIES_VERIFIED,
            "Unknown",
            Reason.PREFLIGHT_DISABLED,
            "spec.preflight.mode is Disabled",
        )
        findings: list[Finding] = []
        return Gate(
            (),
            capabilities,
            drafter_condition(spec, findings),
            capabilities_status(spec, Facts(table), "None", now),
            deploy=True,
        )
    facts = given_facts(spec, table)
    source = "Table"
    if probe is not None and probe.phase == "Done" and probe.report is not None:
        facts = probed_facts(table, probe.report)
        source = "Probe"
    findings = run_rules(spec, facts)
    capabilities = capabilities_condition(findings, source)
    if probe is not None and probe.phase != "Done" and capabilities.status != "False":
        capabilities = Condition(
            ConditionType.CAPABILITIES_VERIFIED,
            "False" if probe.phase == "Failed" else "Unknown",
            probe.reason,
            probe.message,
        )
    drafter = drafter_condition(spec, findings)
    status = capabilities_status(spec, facts, source, now)
    if probe is not None and probe.phase == "Done" and probe.report is not None:
        status["probe"] = {"key": probe_key, "report": probe.report}
    deploy = mode == "Warn" or (capabilities.status == "True" and drafter.status == "True")
    return Gate(tuple(findings), capabilities, drafter, status, deploy)
