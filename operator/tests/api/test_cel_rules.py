"""The CRD's CEL rules run offline by cel-python (the CLI's check), against the rules' own
messages: what `kubectl apply` says, the CLI says, without a cluster."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kimik3_operator.api.cel_rules import cel_errors, with_defaults
from kimik3_operator.api.schema_check import crd_schema, schema_errors


def resource(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "metadata": {"name": "k3"},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (
            # Only after the schema's defaults (parallelism.tensor 16) does the rule refuse 4.
            {"drafter": {"draftTensorParallelSize": 4}},
            "spec.drafter.draftTensorParallelSize: Invalid value: drafter.draftTensorParallelSize "
            "must be 1 or parallelism.tensor",
        ),
        (
            {"engine": {"extraArgs": ["--max_num_seqs=8"]}},
            "spec.engine.extraArgs[0]: Invalid value: engine.extraArgs spells a flag name with _",
        ),
        (
            {
                "engine": {
                    "env": [
                        {"name": "A", "value": "x" * 30000},
                        {"name": "B", "value": "y" * 30000},
                        {"name": "C", "value": "z" * 30000},
                    ]
                }
            },
            "spec.engine.env: Invalid value: the env values together are over 64 KiB",
        ),
        (
            {"scheduling": {"queueName": "q", "topology": {"required": "a", "preferred": "b"}}},
            "spec.scheduling.topology: Invalid value: scheduling.topology takes exactly one of",
        ),
        (
            {"autoscaling": {"maxReplicas": 2, "minReplicas": 3}},
            "spec.autoscaling.minReplicas: Invalid value: autoscaling.minReplicas must be at most",
        ),
        (
            {"autoscaling": {"maxReplicas": 2, "minReplicas": 0, "scaleToZero": True}},
            "spec.autoscaling.minReplicas: Invalid value: autoscaling.minReplicas: 0 needs "
            "spec.model.cache",
        ),
        (
            {"autoscaling": {"maxReplicas": 2, "scaleToZero": True}},
            "spec.autoscaling.scaleToZero: Invalid value: autoscaling.scaleToZero needs",
        ),
    ],
)
def test_a_broken_rule_is_said_with_its_field_and_message(spec: dict[str, Any], said: str) -> None:
    found = schema_errors(resource(**spec))
    assert any(error.startswith(said) for error in found), found


def test_every_example_and_the_defaults_pass_every_rule() -> None:
    assert cel_errors(resource(), crd_schema()) == []
    assert cel_errors(resource(replicas=3, scheduling={"queueName": "gpus"}), crd_schema()) == []


def test_a_rule_on_the_stored_object_is_left_to_the_api_server() -> None:
    """scheduling.queueName's transition rule reads oldSelf: there is none at create."""
    assert cel_errors(resource(scheduling={"queueName": "gpus"}), crd_schema()) == []


def test_defaults_fill_missing_fields_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "default": 1},
            "b": {"type": "object", "default": {}, "properties": {"c": {"default": "x"}}},
        },
    }
    assert with_defaults({"a": 5}, schema) == {"a": 5, "b": {"c": "x"}}


def test_the_process_keeps_its_recursion_limit() -> None:
    before = sys.getrecursionlimit()
    cel_errors(resource(drafter={"draftTensorParallelSize": 4}), crd_schema())
    assert sys.getrecursionlimit() == before
