"""Every command line the builders generate is one vLLM's own parser accepts, with the
intended sizes, rank, headless flag and speculative config (real vllm==0.33.0, CPU only)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from kimik3_operator.api.flags import serve_flag_problem
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.children import Part, desired_children
from kimik3_operator.builders.common import Owner
from kimik3_operator.preflight.table import load_table

from .helpers import run_vllm

# The LeaderWorkerSet, its Service and PodMonitor.
SERVED: tuple[Part, ...] = ("groups", "serving")

pytestmark = pytest.mark.vllm
ROOT = pathlib.Path(__file__).resolve().parents[3]
LEADER_ADDRESS = "k3-0.k3.llm"

SPECS: dict[str, dict[str, Any]] = {
    "single-node-text-dspark": {"parallelism": {"tensor": 8}},
    "single-node-no-drafter": {"parallelism": {"tensor": 8}, "drafter": {"method": "none"}},
    "two-nodes-text-dspark": {},
    "two-nodes-multimodal-dspark": {"model": {"architecture": "KimiK3ForConditionalGeneration"}},
    "two-nodes-pp-given-drafter": {
        "parallelism": {"tensor": 8, "pipeline": 2},
        "drafter": {
            "repo": "Inferact/Kimi-K3-DSpark",
            "revision": "v1",
            "numSpeculativeTokens": 4,
            "draftTensorParallelSize": 1,
        },
    },
    "four-nodes-text-dspark-ep": {"parallelism": {"tensor": 32, "expert": True}},
    "four-nodes-multimodal-none-dcp": {
        "model": {"architecture": "KimiK31ForConditionalGeneration"},
        "parallelism": {"tensor": 16, "pipeline": 2, "decodeContext": 2},
        "drafter": {"method": "none"},
    },
    "two-nodes-mtp-pvc": {
        "drafter": {"method": "mtp", "numSpeculativeTokens": 2},
        "model": {"source": {"pvc": {"claimName": "w", "path": "k3"}}},
        "engine": {"extraArgs": ["--max-num-seqs", "5"]},
    },
}


def commands(spec: KimiK3DeploymentSpec) -> dict[str, list[str]]:
    """The leader's and one worker's argv after `vllm serve`, as the kubelet expands them."""
    lws = desired_children(spec, Owner("k3", "llm", "uid"), parts=SERVED)[0]
    template = lws["spec"]["leaderWorkerTemplate"]
    roles = {"leader": template.get("leaderTemplate", template["workerTemplate"])}
    if "leaderTemplate" in template:
        roles["worker"] = template["workerTemplate"]
    env = {
        "$(LWS_GROUP_SIZE)": str(template["size"]),
        "$(LWS_LEADER_ADDRESS)": LEADER_ADDRESS,
        "$(LWS_WORKER_INDEX)": "1",
    }
    out = {}
    for role, pod in roles.items():
        container = pod["spec"]["containers"][0]
        assert container["command"][-2:] == ["vllm", "serve"]
        out[role] = [env.get(a, a) for a in container["args"]]
    return out


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    cases = {}
    for name, raw in SPECS.items():
        for role, argv in commands(parse_spec(raw)).items():
            cases[f"{name}/{role}"] = argv
    cases["refused/bad-tp"] = ["m", "--tensor-parallel-size", "two"]
    for name, args in SPELLINGS.items():
        cases[f"spelling/{name}"] = ["m", *args]
    # In the probe's environment: the probe in the image parses the serve flags there too.
    run = run_vllm(
        [pathlib.Path(__file__).with_name("parse_serve_args.py")],
        input=json.dumps({"cases": cases}),
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


# engine.extraArgs spellings, each judged by the static check against the table's serveFlags
# for 0.33.0 and by the release's own parser.
SPELLINGS: dict[str, list[str]] = {
    "flag": ["--max-num-seqs", "5"],
    "flag=value": ["--max-model-len=4096"],
    "underscores": ["--max_num_seqs", "5"],
    "abbreviation": ["--max-num-se", "5"],
    "ambiguous": ["--max-num", "5"],
    "removed": ["--num-speculative-tokens", "3"],
    "never": ["--speculative-disable-by-batch-size", "4"],
    "typo": ["--enable-prefix-cachng"],
    "negated-boolean": ["--no-enable-prefix-caching"],
    "enable-disable-swap": ["--disable-prefix-caching"],
    "negated-non-boolean": ["--no-max-num-seqs"],
    "negated-store-true": ["--no-disable-log-stats"],
    "short": ["-q", "fp8"],
    "short-attached": ["-qfp8"],
    "short-unknown": ["-x"],
    "negative-value": ["--seed", "-1"],
    "json-key": ["--compilation-config.mode", "0"],
}


def test_serve_flags_are_the_parsers(parsed: dict[str, Any]) -> None:
    assert load_table().data["releases"]["0.33.0"]["serveFlags"] == parsed["__options__"]


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_static_check_reads_extra_args_as_the_parser_does(
    name: str, parsed: dict[str, Any]
) -> None:
    known = load_table().data["releases"]["0.33.0"]["serveFlags"]
    problems = [p for a in SPELLINGS[name] if (p := serve_flag_problem(a, known)) is not None]
    refused = "error" in parsed[f"spelling/{name}"]
    assert bool(problems) == refused, (problems, parsed[f"spelling/{name}"])


def test_parser_refuses_a_bad_value(parsed: dict[str, Any]) -> None:
    assert parsed["refused/bad-tp"]["error"].startswith("exit 2")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_generated_commands_are_accepted_as_intended(name: str, parsed: dict[str, Any]) -> None:
    spec = parse_spec(SPECS[name])
    nodes = spec.nodes_per_replica
    roles = ["leader", "worker"] if nodes > 1 else ["leader"]
    for rank, role in enumerate(roles):
        got = parsed[f"{name}/{role}"]
        assert "error" not in got, got.get("error")
        assert got["tensor_parallel_size"] == spec.parallelism.tensor
        assert got["pipeline_parallel_size"] == spec.parallelism.pipeline
        assert got["decode_context_parallel_size"] == spec.parallelism.decode_context
        assert got["enable_expert_parallel"] == spec.parallelism.expert
        assert got["served_model_name"] in (["moonshotai/Kimi-K3"], "moonshotai/Kimi-K3")
        assert got["port"] == 8000
        assert got["max_model_len"] == 32768
        assert got["kv_cache_dtype"] == "fp8"
        if nodes > 1:
            assert got["nnodes"] == nodes
            assert got["node_rank"] == rank
            assert got["master_addr"] == LEADER_ADDRESS
            assert got["headless"] is (role == "worker")
            assert got["distributed_executor_backend"] == "mp"
        else:
            assert got["nnodes"] == 1 and got["node_rank"] == 0 and not got["headless"]
        assert bool(got["language_model_only"]) == spec.model.multimodal
        spec_config = got["speculative_config"]
        if spec.drafter.method == "none":
            assert spec_config is None
        else:
            assert spec_config["method"] == spec.drafter.method
            assert got["unknown_speculative_keys"] == []


def test_speculative_config_reaches_vllm_whole(parsed: dict[str, Any]) -> None:
    assert parsed["two-nodes-text-dspark/worker"]["speculative_config"] == {
        "method": "dspark",
        "model": "RedHatAI/Kimi-K3-speculator.dspark",
        "num_speculative_tokens": 8,
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block",
    }
    assert parsed["two-nodes-pp-given-drafter/leader"]["speculative_config"] == {
        "method": "dspark",
        "model": "Inferact/Kimi-K3-DSpark",
        "revision": "v1",
        "num_speculative_tokens": 4,
        "draft_tensor_parallel_size": 1,
    }


def test_pvc_source_serves_the_mounted_path(parsed: dict[str, Any]) -> None:
    assert parsed["two-nodes-mtp-pvc/leader"]["model"] == "/models/k3"
