"""Runs inside the vllm virtual environment: parses `vllm serve` argument lists with vLLM's
own CLI parser and prints what vLLM understood, as JSON.

Input (stdin): {"cases": {"name": ["arg", ...], ...}}. Output: {"name": {...} | {"error": ...}},
and under "__options__" every option string the parser accepts.
No GPU is needed: the parser asks the platform for a device type, so it is set to cuda first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys
from typing import Any


def main() -> None:
    from vllm.platforms import current_platform

    type(current_platform).device_type = "cuda"
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    cases: dict[str, list[str]] = json.load(sys.stdin)["cases"]
    results: dict[str, Any] = {}
    for name, argv in cases.items():
        parser = make_arg_parser(FlexibleArgumentParser())
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                args = parser.parse_args(argv)
                validate_parsed_serve_args(args)
        except SystemExit as exc:
            results[name] = {"error": f"exit {exc.code}: {stderr.getvalue().strip()[-2000:]}"}
            continue
        except Exception as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        args.model = args.model_tag
        engine = AsyncEngineArgs.from_cli_args(args)
        spec = engine.speculative_config
        results[name] = {
            "model": engine.model,
            "served_model_name": engine.served_model_name,
            "revision": engine.revision,
            "tensor_parallel_size": engine.tensor_parallel_size,
            "pipeline_parallel_size": engine.pipeline_parallel_size,
            "decode_context_parallel_size": engine.decode_context_parallel_size,
            "enable_expert_parallel": engine.enable_expert_parallel,
            "distributed_executor_backend": engine.distributed_executor_backend,
            "nnodes": engine.nnodes,
            "node_rank": engine.node_rank,
            "master_addr": engine.master_addr,
            "headless": args.headless,
            "port": args.port,
            "max_model_len": engine.max_model_len,
            "gpu_memory_utilization": engine.gpu_memory_utilization,
            "kv_cache_dtype": engine.kv_cache_dtype,
            "language_model_only": getattr(engine, "language_model_only", None),
            "speculative_config": spec,
            "unknown_speculative_keys": sorted(set(spec or {}) - spec_fields),
        }
    every = make_arg_parser(FlexibleArgumentParser())
    results["__options__"] = sorted(every._option_string_actions)
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__":
    main()
