"""engine.extraArgs cannot set a flag the operator generates in any spelling vLLM's parser
reads as that flag; the CRD's pattern and the operator's check agree on every argument."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kimik3_operator.api.constants import OWNED_FLAGS
from kimik3_operator.api.flags import owned_flag, owned_flag_pattern


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
    assert re.fullmatch(owned_flag_pattern(), arg)


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
    assert not re.fullmatch(owned_flag_pattern(), arg)


ARG_ALPHABET = st.sampled_from(list("-_=.abcdefghijklmnopqrstuvwxyz0123456789"))


@given(
    st.one_of(
        st.text(ARG_ALPHABET, max_size=30),
        st.builds(
            lambda flag, cut, tail: (
                flag[: max(1, cut)].replace("-", "_")[:2] + flag[2 : max(2, cut)] + tail
            ),
            st.sampled_from(OWNED_FLAGS),
            st.integers(0, 30),
            st.text(ARG_ALPHABET, max_size=8),
        ),
    )
)
def test_the_crd_pattern_and_the_operator_agree(arg: str) -> None:
    assert (owned_flag(arg) is not None) == bool(re.fullmatch(owned_flag_pattern(), arg))


def test_the_preflight_names_the_argument_and_the_flag() -> None:
    from test_preflight_rules import fails, run

    failed = fails(run(engine={"extraArgs": ["--max-num-seqs", "5", "--tensor_parallel_size=4"]}))
    message = failed["ExtraArgsOverrideOwnedFlag"].message
    assert "spec.engine.extraArgs[2]" in message and "--tensor-parallel-size" in message
