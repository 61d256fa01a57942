"""The offline CLI: as strict as `kubectl apply`, and `render` shows what the operator applies
(e2e/test_crd.py runs the same bad specs through the real API server and the CLI)."""

from __future__ import annotations

import copy
import filecmp
import pathlib
from typing import Any

import pytest
import yaml

from kimik3_operator.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "kimi-k3-text-dspark.yaml"
OLD_VLLM = ROOT / "examples" / "kimi-k3-text-dspark-old-vllm.yaml"


def written(tmp_path: pathlib.Path, resource: dict[str, Any]) -> str:
    path = tmp_path / "k3.yaml"
    path.write_text(yaml.safe_dump(resource))
    return str(path)


def example() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return copy.deepcopy(loaded)


def test_the_package_carries_the_crd_the_cluster_gets() -> None:
    crd = ROOT / "manifests" / "crd" / "kimik3deployments.yaml"
    for copy_ in (
        ROOT / "charts" / "kimik3-operator" / "crds" / "kimik3deployments.yaml",
        ROOT / "operator" / "kimik3_operator" / "data" / "crd.yaml",
    ):
        assert filecmp.cmp(crd, copy_, shallow=False), f"run scripts/sync-crd.sh: {copy_}"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: r["spec"]["drafter"].update(methd="eagle3"), "spec.drafter.methd: unknown"),
        (lambda r: r.update(apiVersion="serving.kimik3.io/v1"), "apiVersion: 'serving.kimik3"),
        (lambda r: r["metadata"].update(name="K3"), "metadata.name: Invalid value: 'K3'"),
        (lambda r: r["spec"].update(replicas=-1), "spec.replicas: Invalid value: -1"),
        (lambda r: r["spec"].update(replicas="two"), "spec.replicas: Invalid value: 'string'"),
    ],
)
def test_what_the_schema_refuses_the_cli_refuses_naming_the_field(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], change: Any, named: str
) -> None:
    resource = example()
    change(resource)
    for command in ("preflight", "render"):
        assert main([command, "-f", written(tmp_path, resource)]) == 1
        err = capsys.readouterr().err
        assert named in err, err


def test_a_misspelt_field_or_value_gets_the_nearest_one(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resource = example()
    resource["spec"]["drafter"]["numSpeculativeToken"] = 3
    resource["spec"]["drafter"]["method"] = "eagel3"
    assert main(["preflight", "-f", written(tmp_path, resource)]) == 1
    err = capsys.readouterr().err
    assert "did you mean spec.drafter.numSpeculativeTokens?" in err
    assert "did you mean 'eagle3'?" in err


def test_render_refuses_a_spec_the_preflight_refuses_unless_forced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["render", "-f", str(OLD_VLLM)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "verdict: Fail" in err and "--force" in err
    assert main(["render", "-f", str(OLD_VLLM), "--force"]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert "LeaderWorkerSet" in kinds and "Job" not in kinds, "no probe for a refused spec"


def test_render_prints_every_child_the_operator_applies_in_its_order(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resource = example()
    resource["spec"]["model"]["cache"] = {"size": "2Ti"}
    assert main(["render", "-f", written(tmp_path, resource), "-n", "llm"]) == 0
    children = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in children]
    assert kinds == [
        "ConfigMap",  # the probe's script
        "Job",  # the probe
        "PersistentVolumeClaim",
        "ConfigMap",  # the download's script
        "Job",  # the download
        "LeaderWorkerSet",
        "Service",
        "PodMonitor",
    ]
    assert {d["metadata"]["namespace"] for d in children} == {"llm"}


def test_a_namespace_in_the_file_and_a_different_n_is_an_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resource = example()
    resource["metadata"]["namespace"] = "team-a"
    assert main(["render", "-f", written(tmp_path, resource), "-n", "team-b"]) == 1
    assert "does not match -n 'team-b'" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == "kimik3 0.1.0"


def test_an_architecture_near_a_kimi_class_gets_it_named(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resource = example()
    resource["spec"]["model"]["architecture"] = "KimiLinearForCausalLm"
    assert main(["preflight", "-f", written(tmp_path, resource)]) == 3
    assert "(did you mean KimiLinearForCausalLM?)" in capsys.readouterr().out


def test_the_checkpoints_configs_given_in_the_spec_are_judged_offline(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """spec.model.config and spec.drafter.config: the static verdict on the files' facts,
    a file on the command line read in their place."""
    import json

    resource = example()
    drafter = {
        "architectures": ["K3DSparkModel"],
        "model_type": "k3_dspark",
        "vocab_size": 163840,
        "target_layer_ids": [2, 23, 47, 71, 89],
        "num_target_layers": 5,
        "dspark_noise_token_id": 163838,
        "mla_use_nope": True,
    }
    resource["spec"]["drafter"]["config"] = json.dumps(drafter)
    assert main(["preflight", "-f", written(tmp_path, resource)]) == 2
    out = capsys.readouterr().out
    assert "DrafterConfigRefused" in out and "spec.drafter.config" in out
    fine = tmp_path / "drafter.json"
    fine.write_text(json.dumps({**drafter, "mla_use_nope": False}))
    path = written(tmp_path, resource)
    assert main(["preflight", "-f", path, "--drafter-config", str(fine)]) == 0
    resource["spec"]["drafter"]["config"] = "{not json"
    assert main(["preflight", "-f", written(tmp_path, resource)]) == 1
    assert "spec.drafter.config" in capsys.readouterr().err
