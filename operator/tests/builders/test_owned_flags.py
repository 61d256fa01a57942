"""engine.extraArgs cannot set a flag the operator generates in any spelling vLLM's parser
reads as that flag (the CRD's rule, the same test, runs against the real API server in
e2e/test_crd.py)."""

from __future__ import annotations

import pytest

from kimik3_operator.api.flags import owned_flag


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("--tensor_parallel_size=4", "--tensor-parallel-size"),
        ("--tensor-parallel-size", "--tensor-parallel-size"),
        ("--speculative_config={}", "--speculative-config"),
        ("--speculative-config.num_speculative_tokens=64", "--speculative-config"),
        ("--speculative_config.method", "--speculative-config"),
        ("--tensor-parallel=4", "--tensor-parallel-size"),
        ("--spec", "--speculative-config"),
        ("-t", "-tp"),
        ("-tp=2", "-tp"),
        ("--po=1", "--port"),
        ("--config=/etc/vllm.yaml", "--config"),
        ("--kv_cache_dtype", "--kv-cache-dtype"),
    ],
)
def test_every_spelling_of_an_owned_flag_is_caught(arg: str, flag: str) -> None:
    assert owned_flag(arg) == flag


@pytest.mark.parametrize(
    "arg",
    [
        "--max-num-seqs",
        "5",
        "--moe-backend=marlin",
        "-O3",
        "--enable-prefix-caching",
        "--compilation-config.level=3",
        "--chat-template",
        "x=--port",
        "--max-num-batched-tokens",
    ],
)
def test_other_flags_and_values_pass(arg: str) -> None:
    assert owned_flag(arg) is None
