"""The P/D request protocol through the decode leader's routing sidecar as the operator
renders it, between two engines that honour ``kv_transfer_params``.

Real: llm-d's vLLM simulator (``llm-d-inference-sim`` v0.10.2, built from its module), one
as the prefill engine and one as the decode engine, each on the port the operator's rendered
command line gives it (the prefill one on a free port: on a cluster both roles listen on the
same port of different pods). Stand-ins: llm-d's routing sidecar (its module is refused here)
is e2e/support/pd_sidecar.py, run with the rendered sidecar's flags; the test plays llm-d's
router, which names the prefill leader in ``x-prefiller-host-port``. No Kubernetes: the
rendering is the operator's builders'.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.support.cluster import RUN, tools_bin, wait_for
from e2e.support.pd_sidecar import (
    PREFILLER_HEADER,
    EngineProcess,
    StandInSidecar,
    flag,
    rendered,
    spare_port,
)

# The tools' tier: no cluster, but the tools build (the simulator among them).
pytestmark = pytest.mark.kwok

MODEL = "served-model"
# The decode engine's own prefill is slow, the transfer fast: which of the two a request
# took shows in its time, with a wide margin either way.
LOCAL_PREFILL = "3s"
TRANSFER = "20ms"


def sim(name: str, port: int, *extra: str) -> EngineProcess:
    """One llm-d-inference-sim process on 127.0.0.1, healthy."""
    command = [
        str(tools_bin() / "llm-d-inference-sim"),
        f"--port={port}",
        f"--model={MODEL}",
        "--mode=random",
        "--inter-token-latency=0s",
        *extra,
    ]
    engine = EngineProcess(command, port, RUN / f"pd-sim-{name}.log")
    wait_for(engine.healthy, 60, f"the {name} simulator on {port}", engine.tail)
    return engine


def served(engine: EngineProcess, finish_reason: str = "") -> float:
    """Requests it finished (vLLM's vllm:request_success_total), of one finish reason or all."""
    labels = f'finish_reason="{finish_reason}"' if finish_reason else ""
    return engine.metric("vllm:request_success_total", labels)


@pytest.fixture
def pair() -> Iterator[tuple[EngineProcess, EngineProcess, StandInSidecar, int]]:
    prefill_args, decode_args, sidecar_args = rendered(spare_port())
    prefill_port = spare_port()
    assert flag(prefill_args, "--port") != flag(decode_args, "--port")
    started: list[Any] = []
    try:
        prefill = sim("prefill", prefill_port)
        started.append(prefill)
        decode = sim(
            "decode",
            int(flag(decode_args, "--port")),
            f"--time-to-first-token={LOCAL_PREFILL}",
            f"--kv-cache-transfer-latency={TRANSFER}",
        )
        started.append(decode)
        sidecar = StandInSidecar(sidecar_args)
        started.append(sidecar)
        yield prefill, decode, sidecar, prefill_port
    finally:
        for one in reversed(started):
            one.close()


def ask(port: int, body: dict[str, Any], headers: dict[str, str]) -> tuple[dict[str, Any], float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as answer:
        payload: dict[str, Any] = json.loads(answer.read())
    return payload, time.monotonic() - started


def test_the_rendered_sidecar_prefills_remotely_then_decodes_with_the_handoff(
    pair: tuple[EngineProcess, EngineProcess, StandInSidecar, int],
) -> None:
    prefill, decode, sidecar, prefill_port = pair
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8}
    # As llm-d's router answers: the decode leader's sidecar, and the prefill leader named.
    answer, took = ask(sidecar.flags.port, body, {PREFILLER_HEADER: f"127.0.0.1:{prefill_port}"})
    assert answer["choices"][0]["text"]
    # The prefill engine answered one token and left the decode to a remote engine.
    assert served(prefill, "remote_decode") == 1, "the prompt went to the prefill engine first"
    assert served(decode) == 1
    (handoff,) = sidecar.handoffs
    # The prefill engine's answer, handed to the decode engine as vLLM's NIXL schema has it.
    assert handoff["do_remote_prefill"] is True and handoff["do_remote_decode"] is False
    for key in ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port"):
        assert handoff.get(key), (key, handoff)
    # The decode engine pulled the KV cache instead of prefilling: its own prefill takes 3 s.
    assert took < 1.5, f"{took:.2f}s: the decode engine prefilled the prompt itself"

    # Without a prefill leader named (no P/D router in front), decode serves it all, slowly:
    # the silent decode-only serving a misconfigured router gives.
    answer, took = ask(sidecar.flags.port, body, {})
    assert answer["choices"][0]["text"]
    assert served(prefill) == 1 and served(decode) == 2
    assert took >= 2.5, f"{took:.2f}s: a local prefill takes the decode engine's 3 s"


def test_a_prefill_leader_that_refuses_fails_the_request_without_a_decode(
    pair: tuple[EngineProcess, EngineProcess, StandInSidecar, int],
) -> None:
    _, decode, sidecar, prefill_port = pair
    body = {"model": "not-served", "prompt": "hello", "max_tokens": 4}
    with pytest.raises(urllib.error.HTTPError) as refused:
        ask(sidecar.flags.port, body, {PREFILLER_HEADER: f"127.0.0.1:{prefill_port}"})
    assert refused.value.code == 404
    assert served(decode) == 0 and not sidecar.handoffs
