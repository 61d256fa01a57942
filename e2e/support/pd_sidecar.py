"""A test-side stand-in for llm-d's P/D routing sidecar (llm-d-router's pd-sidecar, whose
module the Go proxy here refuses). It speaks the sidecar's request protocol with the flags
the operator renders for the real one, and nothing more: no TLS, no SSRF allowlist, no
retries, and it relays a decode answer whole rather than chunk by chunk.

A request naming a prefill engine in ``x-prefiller-host-port`` is sent there first with
``kv_transfer_params.do_remote_decode`` and one token, then on to the local decode engine
with the prefill's ``kv_transfer_params`` (``do_remote_prefill``, the engine, blocks and side
channel to pull from); without the header it goes to the decode engine unchanged."""

from __future__ import annotations

import json
import pathlib
import random
import re
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.children import desired_children
from kimik3_operator.builders.common import Owner

PREFILLER_HEADER = "x-prefiller-host-port"
PROTOCOLS = ("nixlv2",)
TIMEOUT = 30.0


@dataclass(frozen=True)
class SidecarFlags:
    port: int
    engine_port: int
    connector: str


def parse_flags(args: Sequence[str]) -> SidecarFlags:
    """The rendered sidecar's flags, each as --name=value; an unknown one is refused, so a
    flag the operator starts rendering is one this stand-in is made to understand."""
    values: dict[str, str] = {}
    for arg in args:
        name, _, value = arg.partition("=")
        values[name] = value
    known = {"--port", "--vllm-port", "--kv-connector", "--secure-proxy"}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"the stand-in does not know the sidecar flags {sorted(unknown)}")
    if values.get("--secure-proxy", "true") != "false":
        raise ValueError("the stand-in serves plain HTTP only (--secure-proxy=false)")
    connector = values["--kv-connector"]
    if connector not in PROTOCOLS:
        raise ValueError(f"the stand-in speaks {PROTOCOLS}, not {connector}")
    return SidecarFlags(int(values["--port"]), int(values["--vllm-port"]), connector)


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill engine's request: the prompt, one token, no stream, asked to keep its KV
    for a remote decode."""
    return {
        **body,
        "stream": False,
        "max_tokens": 1,
        **({"max_completion_tokens": 1} if "max_completion_tokens" in body else {}),
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }


def spare_port() -> int:
    """A free port below the kernel's ephemeral range (32768 on): one picked there can be taken
    by any outgoing connection before its server binds it, minutes later for an engine."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def rendered(service_port: int) -> tuple[list[str], list[str], list[str]]:
    """The prefill engine's, the decode engine's and the routing sidecar's arguments, as the
    operator renders the DisaggregatedSet's leaders."""
    spec = parse_spec(
        {
            "parallelism": {"tensor": 8},
            "service": {"port": service_port},
            "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        }
    )
    (ds,) = desired_children(spec, Owner("pd", "llm", "uid"), parts=("groups",))
    pods = {
        role["name"]: role["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        for role in ds["spec"]["roles"]
    }
    return (
        pods["prefill"]["containers"][0]["args"],
        pods["decode"]["containers"][0]["args"],
        pods["decode"]["initContainers"][0]["args"],
    )


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log.append(format % args)

    def _reply(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        headers = {"Content-Type": "application/json"}
        request_id = self.headers.get("X-Request-Id")
        if request_id:
            headers["X-Request-Id"] = request_id
        decode_url = f"http://127.0.0.1:{self.server.flags.engine_port}{self.path}"
        prefiller = self.headers.get(PREFILLER_HEADER)
        if not prefiller:
            self._reply(*_post(decode_url, body, headers))
            return
        status, answer = _post(f"http://{prefiller}{self.path}", prefill_body(body), headers)
        if status != 200:
            self._reply(status, answer)
            return
        params = json.loads(answer).get("kv_transfer_params")
        if not isinstance(params, dict):
            message = {"error": f"prefill {prefiller} returned no kv_transfer_params"}
            self._reply(502, json.dumps(message).encode())
            return
        self.server.handoffs.append(params)
        self._reply(*_post(decode_url, {**body, "kv_transfer_params": params}, headers))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, flags: SidecarFlags) -> None:
        super().__init__(("127.0.0.1", flags.port), _Handler)
        self.flags = flags
        self.log: list[str] = []
        # The prefill side's kv_transfer_params, as handed to the decode engine.
        self.handoffs: list[dict[str, Any]] = []


class EngineProcess:
    """An engine (vLLM, or its simulator) run on 127.0.0.1 at ``port``, its output in ``log``:
    its health, its metrics and its stop."""

    def __init__(
        self,
        command: Sequence[str],
        port: int,
        log: pathlib.Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = log.open("w")
        self.process = subprocess.Popen(
            list(command), stdout=self._out, stderr=subprocess.STDOUT, env=env
        )

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the engine exited: {self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                return True
        except OSError:
            return False

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of a metric's samples whose labels start with ``labels``."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        pattern = rf"^{re.escape(name)}(?:\{{{re.escape(labels)}[^}}]*\}})? (\S+)$"
        return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._out.close()


class StandInSidecar:
    """Runs the stand-in on 127.0.0.1 at the rendered --port until close()."""

    def __init__(self, args: Sequence[str]) -> None:
        self.flags = parse_flags(args)
        self._server = _Server(self.flags)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def handoffs(self) -> list[dict[str, Any]]:
        return self._server.handoffs

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
