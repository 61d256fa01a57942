"""How `vllm serve`'s parser reads an extraArgs entry against the flags a release knows
(the same spellings go through the real parser in vllm_tier/test_vllm_parser.py)."""

from __future__ import annotations

import pytest

from kimik3_operator.api.flags import serve_flag_problem

KNOWN = (
    "-h",
    "--help",
    "-q",
    "--quantization",
    "-tp",
    "--tensor-parallel-size",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--seed",
)


@pytest.mark.parametrize(
    "arg",
    [
        "--max-num-seqs",
        "--max-num-seqs=4",
        "--max_num_seqs",  # vLLM reads "_" as "-"
        "--max-num-s",  # the abbreviation of one flag
        "--enable-prefix",
        "--no-enable-prefix-caching",
        "-q",
        "-qfp8",  # -q with its value attached
        "-t",  # the abbreviation of -tp
        "-1",  # a value: a negative number
        "-0.5",
        "8",
        "--",
    ],
)
def test_the_parser_takes_it(arg: str) -> None:
    assert serve_flag_problem(arg, KNOWN) is None


@pytest.mark.parametrize(
    ("arg", "problem"),
    [
        ("--num-speculative-tokens", "--num-speculative-tokens is not a flag"),
        ("--max-num", "--max-num is ambiguous (--max-num-batched-tokens, --max-num-seqs)"),
        ("--no-max-num-seqs", "--no-max-num-seqs is not a flag"),
        ("-x", "-x is not a flag"),
    ],
)
def test_the_parser_refuses_it(arg: str, problem: str) -> None:
    assert serve_flag_problem(arg, KNOWN) == problem
