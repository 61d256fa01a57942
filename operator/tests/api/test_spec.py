from __future__ import annotations

import pytest

from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import HuggingFaceSource, ModelSource, SpecError


def test_empty_spec_gets_every_default() -> None:
    spec = parse_spec({})
    assert spec == KimiK3DeploymentSpec()
    assert spec.model.repo == "moonshotai/Kimi-K3"
    assert spec.model.source == ModelSource(HuggingFaceSource())
    assert spec.drafter.method == "dspark"
    assert spec.parallelism.tensor == 16
    assert spec.nodes_per_replica == 2
    assert spec.gpus_per_pod == 8
    assert spec.gpus_per_replica == 16


@pytest.mark.parametrize(
    ("tensor", "pipeline", "per_node", "nodes", "per_pod"),
    [
        (8, 1, 8, 1, 8),
        (4, 1, 8, 1, 4),
        (16, 1, 8, 2, 8),
        (8, 2, 8, 2, 8),
        (32, 1, 8, 4, 8),
        (16, 2, 8, 4, 8),
    ],
)
def test_group_size_follows_the_gpu_count(
    tensor: int, pipeline: int, per_node: int, nodes: int, per_pod: int
) -> None:
    spec = parse_spec(
        {
            "parallelism": {"tensor": tensor, "pipeline": pipeline},
            "placement": {"gpusPerNode": per_node},
        }
    )
    assert (spec.nodes_per_replica, spec.gpus_per_pod) == (nodes, per_pod)


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"replicas": "two"}, "spec.replicas", "must be an integer"),
        ({"model": {"architecture": "llama"}}, "spec.model.architecture", "KimiLinearForCausalLM"),
        ({"model": {"architecture": "Llama/../x"}}, "spec.model.architecture", "class name"),
        (
            {"drafter": {"method": "ngram", "repo": "x/y", "numSpeculativeTokens": 3}},
            "spec.drafter.repo",
            "drafts from the prompt",
        ),
        ({"drafter": {"method": "ngram"}}, "spec.drafter.numSpeculativeTokens", "set it"),
        (
            {"drafter": {"method": "none", "source": {"pvc": {"claimName": "d"}}}},
            "spec.drafter.source",
            "loads no drafter",
        ),
        (
            {
                "drafter": {
                    "method": "draft_model",
                    "repo": "a/b",
                    "source": {"pvc": {"claimName": "d"}},
                }
            },
            "spec.drafter.repo",
            "keep one",
        ),
        (
            {
                "drafter": {
                    "method": "draft_model",
                    "source": {"pvc": {"claimName": "d", "path": "../up"}},
                }
            },
            "spec.drafter.source.pvc.path",
            "without '..'",
        ),
        ({"drafter": {"method": "medusa"}}, "spec.drafter.method", "dspark"),
        ({"parallelism": {"tensor": 0}}, "spec.parallelism.tensor", "at least 1"),
        ({"replicas": -1}, "spec.replicas", "must not be negative"),
        (
            {"drafter": {"method": "none", "repo": "x/y"}},
            "spec.drafter.repo",
            "remove drafter.repo",
        ),
        (
            {"model": {"source": {"pvc": {"claimName": ""}}}},
            "spec.model.source.pvc.claimName",
            "claim",
        ),
        ({"model": {"source": {"pvc": {"path": "x"}}}}, "spec.model.source.pvc", "claimName"),
        ({"engine": {"gpuMemoryUtilization": True}}, "spec.engine.gpuMemoryUtilization", "number"),
    ],
)
def test_bad_spec_names_field_value_and_fix(spec: dict[str, object], path: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert caught.value.path == path
    assert words in str(caught.value)


def test_rollout_takes_percentages() -> None:
    spec = parse_spec({"rollout": {"maxUnavailable": "50%", "maxSurge": 1}})
    assert spec.rollout.max_unavailable == "50%"
    assert spec.rollout.max_surge == 1


def test_a_rollout_value_that_is_neither_a_count_nor_a_percentage_is_refused() -> None:
    import pytest

    from kimik3_operator.api.parse import parse_spec
    from kimik3_operator.api.types import SpecError

    with pytest.raises(SpecError, match=r"spec.rollout.maxUnavailable='x%'.*25%"):
        parse_spec({"rollout": {"maxUnavailable": "x%"}})
    with pytest.raises(SpecError, match=r"spec\.rollout\.maxSurge"):
        parse_spec({"rollout": {"maxSurge": -1}})
    assert parse_spec({"rollout": {"maxUnavailable": "25%"}}).rollout.max_unavailable == "25%"


def test_a_control_character_that_cannot_reach_a_child_is_refused_with_its_field() -> None:
    import pytest

    from kimik3_operator.api.parse import parse_spec
    from kimik3_operator.api.types import SpecError

    with pytest.raises(SpecError, match=r"spec.engine.env\[0\].value.*control character"):
        parse_spec({"engine": {"env": [{"name": "A", "value": "x\x01y"}]}})
    assert parse_spec({"engine": {"env": [{"name": "A", "value": "tab\there"}]}})


def test_a_canary_window_past_six_hours_is_refused_naming_the_field() -> None:
    """Each leader's samples are kept for the canary's window: the window bounds them."""
    from kimik3_operator.api.parse import parse_spec

    assert parse_spec({"rollout": {"canary": {"window": "6h"}}}).rollout.canary is not None
    with pytest.raises(SpecError, match=r"spec\.rollout\.canary\.window='7h'.*6h"):
        parse_spec({"rollout": {"canary": {"window": "7h"}}})


def test_env_values_over_64_kib_together_are_refused_naming_the_field_and_fix() -> None:
    """The CRD's CEL rule, checked again for resources stored before it: what the operator
    holds of each resource is bounded."""
    from kimik3_operator.api.parse import parse_spec

    fits = [{"name": f"V{i}", "value": "x" * 16384} for i in range(4)]
    assert len(parse_spec({"engine": {"env": fits}}).engine.env) == 4
    over = [*fits, {"name": "W", "value": "y"}]
    with pytest.raises(SpecError, match=r"spec\.engine\.env=.*over 64 KiB.*valueFrom"):
        parse_spec({"engine": {"env": over}})
    args = [f"--x{i}=" + "a" * 4000 for i in range(9)]
    with pytest.raises(SpecError, match=r"spec\.engine\.extraArgs=.*over 32 KiB.*file"):
        parse_spec({"engine": {"extraArgs": args}})


def test_a_spec_the_store_could_not_keep_is_refused_naming_its_size() -> None:
    from kimik3_operator.api.constants import OVERSIZED_SPEC_KEY
    from kimik3_operator.api.parse import parse_spec

    with pytest.raises(SpecError, match=r"spec='1200000 bytes': is over 256 KiB.*engine\.env"):
        parse_spec({OVERSIZED_SPEC_KEY: 1200000})


def test_a_leaders_samples_are_bounded_whatever_the_interval() -> None:
    from kimik3_operator.observation.acceptance import MAX_SAMPLES, LeaderWindow, Snapshot

    window = LeaderWindow()
    for second in range(MAX_SAMPLES * 2):
        window.add(Snapshot(float(second), float(second), 0.0, 0.0), retain_seconds=1e9)
    assert len(window.samples) == MAX_SAMPLES
