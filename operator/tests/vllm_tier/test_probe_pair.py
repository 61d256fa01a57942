"""A prefill/decode pair judged by vLLM itself: the probe script, run against the real
vllm==0.33.0 on a CPU with the small Kimi-K3 and DSpark config.json files, builds each
role's configuration from its rendered command line and computes vLLM's NIXL compatibility
hash of both (`compute_nixl_compatibility_hash`, which the decode side compares at its
first handshake, after both sides loaded their weights)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from e2e.support.k3_configs import DRAFTER_CONFIG, TARGET_CONFIG
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.preflight_job import probe_request
from kimik3_operator.preflight.gate import probed_facts
from kimik3_operator.preflight.rules import Facts, run_rules
from kimik3_operator.preflight.table import load_table

from .test_probe_script import probe_report

pytestmark = pytest.mark.vllm


def _pair(tmp: pathlib.Path, prefill_args: list[str], decode_args: list[str]) -> tuple[Any, Any]:
    for name, config in (("target", TARGET_CONFIG), ("drafter", DRAFTER_CONFIG)):
        (tmp / name).mkdir(exist_ok=True)
        (tmp / name / "config.json").write_text(json.dumps(config))
    spec = parse_spec(
        {
            "parallelism": {"tensor": 8},
            "disaggregation": {
                "prefill": {"extraArgs": prefill_args},
                "decode": {"extraArgs": decode_args},
            },
        }
    )
    request = probe_request(spec)
    request["target"] = {"path": str(tmp / "target")}
    request["drafter"] = {"path": str(tmp / "drafter")}
    return spec, probe_report(request)


def _kv(spec: Any, facts: Facts) -> Any:
    return next(f for f in run_rules(spec, facts) if f.id == "kv-transfer")


def test_two_spellings_of_one_dtype_hash_alike_where_the_static_rule_cannot_tell(
    tmp_path: pathlib.Path,
) -> None:
    spec, report = _pair(tmp_path, ["--dtype", "half"], ["--dtype=float16"])
    assert _kv(spec, Facts(load_table())).status == "Unknown"
    pair = report["pair"]
    assert pair["ok"] is True, pair
    assert pair["prefillHash"] == pair["decodeHash"]
    assert pair["connectorVersion"] == 15
    assert report["serve"] == {"leader": {"ok": True}, "prefill-leader": {"ok": True}}
    finding = _kv(spec, probed_facts(load_table(), report))
    assert (finding.status, finding.reason) == ("Pass", "KVTransferCompatible")
    assert pair["decodeHash"] in finding.message


def test_a_pair_that_would_not_handshake_is_refused_naming_vllms_factor(
    tmp_path: pathlib.Path,
) -> None:
    spec, report = _pair(tmp_path, ["--dtype", "float16"], [])
    pair = report["pair"]
    assert pair["ok"] is False and pair["prefillHash"] != pair["decodeHash"]
    assert sorted(pair["differing"]) == ["dtype"]
    finding = _kv(spec, probed_facts(load_table(), report))
    assert (finding.status, finding.reason) == ("Fail", "KVTransferIncompatible")
    assert "dtype (prefill 'torch.float16', decode 'torch.bfloat16')" in finding.message
