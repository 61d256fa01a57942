"""What the generator reads as `vllm serve`'s flags from a release's source (the vllm tier
holds the result to the image's own parser, option string for option string)."""

from __future__ import annotations

import textwrap

from kimik3_operator.preflight.generate import parallel_drafting_tokens
from kimik3_operator.preflight.serve_flags import serve_flags

ENGINE = """
from vllm.config import CacheConfig
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        cache_kwargs = get_kwargs(CacheConfig)
        group = parser.add_argument_group("cache")
        group.add_argument("--block-size", **cache_kwargs["block_size"])
        group.add_argument(
            "--enable-prefix-caching", **{**cache_kwargs["enable_prefix_caching"], "default": None}
        )
        parser.add_argument("--disable-log-stats", action="store_true")
        parser.add_argument("--quantization", "-q", type=str)
        parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction)
"""
CONFIG = """
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
"""
CLI = """
class BaseFrontendArgs:
    lora_modules: list[str] | None = None
    enable_auto_tool_choice: bool = False
    _private: int = 0
    @classmethod
    def _customize_cli_kwargs(cls, kwargs):
        kwargs["lora_modules"]["action"] = LoRAParserAction
        kwargs["enable_auto_tool_choice"]["flags"] = ["-tc"]
        return kwargs
class FrontendArgs(BaseFrontendArgs):
    host: str | None = None
    allow_credentials: bool = False
    chat_template_kwargs: bool | str | None = None
def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--headless", action="store_true")
    parser = FrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser
"""
FILES = {
    "vllm/engine/arg_utils.py": ENGINE,
    "vllm/config/cache.py": CONFIG,
    "vllm/entrypoints/openai/cli_args.py": CLI,
}


def flags(swap: bool) -> list[str]:
    files = dict(FILES)
    if swap:
        files["vllm/utils/argparse_utils.py"] = "class EnableDisableAction: ..."
    return serve_flags(files.get, files)


def test_literal_field_and_boolean_flags() -> None:
    found = flags(swap=False)
    assert found == sorted(
        [
            "-h",
            "--help",
            "--block-size",
            "--enable-prefix-caching",
            "--no-enable-prefix-caching",  # a bool field of the config class
            "--disable-log-stats",  # store_true: no negation
            "--quantization",
            "-q",
            "--enforce-eager",
            "--no-enforce-eager",
            "--headless",
            "--lora-modules",  # its action replaced: not boolean
            "--enable-auto-tool-choice",
            "--no-enable-auto-tool-choice",
            "-tc",
            "--host",
            "--allow-credentials",
            "--no-allow-credentials",
            "--chat-template-kwargs",  # bool | str | None: a value or a bare flag
        ]
    )


def test_enable_disable_pairs_where_the_release_registers_them() -> None:
    found = set(flags(swap=True))
    assert {"--disable-prefix-caching", "--disable-auto-tool-choice"} <= found
    assert "--disable-prefix-caching" not in flags(swap=False)


def test_no_parser_no_flags() -> None:
    assert serve_flags({}.get, []) == []


def test_parallel_drafting_tokens_in_the_order_vllm_tries_them() -> None:
    source = textwrap.dedent(
        """
        def get_parallel_drafting_token_id(hf_config) -> int:
            dflash_config = getattr(hf_config, "dflash_config", None) or {}
            if "mask_token_id" in dflash_config:
                return int(dflash_config["mask_token_id"])
            if hasattr(hf_config, "dspark_noise_token_id"):
                return int(hf_config.dspark_noise_token_id)
            raise ValueError("no token")
        """
    )
    assert parallel_drafting_tokens(source) == [
        "dflash_config.mask_token_id",
        "dspark_noise_token_id",
    ]
    assert parallel_drafting_tokens("def other(): pass") == []
