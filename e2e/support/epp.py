"""The Gateway API Inference Extension, real, for the routing tests and bench/routing.py: its
CRDs from its module, its endpoint picker (`cmd/epp` v1.5.0, built by
e2e/cluster/build-tools.sh) run as a host process with the flags and the config the operator
gives the picker's Deployment, and a stand-in gateway (e2e/cluster/fleet/gateway) that asks the
picker over ext_proc for each request, as Envoy's ext_proc filter does (no Envoy can be
installed here), and forwards the request to the endpoint it names.

Stand-ins: KWOK's pods run nothing, so each leader's made-up pod IP is added to the loopback
interface (labelled ``lo:kk3``; down.sh removes what a killed run leaves) and a model server
listens there on the pool's target port: /metrics with vLLM's metric names, whose queue and
KV-cache gauges follow the requests it holds, and /v1/completions answered after a delay
of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

from e2e.support.cluster import RUN, Cluster, free_port, tools_bin, wait_established, wait_for
from e2e.support.kueue import _paths
from e2e.support.vllm_exporter import FakeLeader

LOOPBACK_LABEL = "lo:kk3"
ADDRESS_LOCK = threading.Lock()


def crds_dir() -> pathlib.Path:
    return pathlib.Path(_paths()["manifests"]) / "epp"


def install_crds(cluster: Cluster) -> None:
    """InferencePool v1, the x-k8s kinds v1.5.0's picker watches, and HTTPRoute."""
    for crd in sorted(crds_dir().glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    wait_established(cluster, "crd/inferencepools.inference.networking.k8s.io")
    wait_established(cluster, "crd/httproutes.gateway.networking.k8s.io")


def remove_crds(cluster: Cluster) -> None:
    for crd in sorted(crds_dir().glob("*.yaml")):
        cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", "--wait=false", check=False)


def add_loopback(address: str) -> None:
    with ADDRESS_LOCK:
        shown = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "dev", "lo"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        if f" {address}/" in shown:
            return
        subprocess.run(
            ["ip", "addr", "add", f"{address}/32", "dev", "lo", "label", LOOPBACK_LABEL],
            check=True,
            capture_output=True,
        )


def remove_loopback(address: str) -> None:
    subprocess.run(
        ["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False, capture_output=True
    )


@dataclass
class ModelServer:
    """One leader's vLLM as the picker and a gateway see it."""

    address: str
    port: int = 8000
    # Requests served at once; more wait (vllm:num_requests_waiting).
    capacity: int = 4
    seconds_per_request: float = 0.05
    # Waiting requests reported besides the held ones (a load the test dictates).
    extra_waiting: float = 0.0
    leader: FakeLeader = field(default_factory=lambda: FakeLeader(running=0, waiting=0))
    served: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _slots: threading.Semaphore | None = None
    _server: ThreadingHTTPServer | None = None

    @property
    def held(self) -> int:
        """Requests in the server now, served or waiting."""
        with self._lock:
            return self._in_flight

    def metrics(self) -> str:
        with self._lock:
            held = self._in_flight
        self.leader.running = float(min(held, self.capacity))
        self.leader.waiting = float(max(0, held - self.capacity)) + self.extra_waiting
        self.leader.kv_cache_usage = min(1.0, 0.1 + 0.15 * held)
        return self.leader.exposition()

    def serve(self, body: bytes) -> bytes:
        with self._lock:
            self._in_flight += 1
        try:
            assert self._slots is not None
            with self._slots:
                time.sleep(self.seconds_per_request)
        finally:
            with self._lock:
                self._in_flight -= 1
                self.served += 1
        return json.dumps({"served_by": self.address, "choices": [{"text": "ok"}]}).encode()

    def start(self) -> None:
        add_loopback(self.address)
        self._slots = threading.Semaphore(self.capacity)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, code: int, payload: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    self._answer(200, server.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    self._answer(404, b"", "text/plain")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                self._answer(200, server.serve(body), "application/json")

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            # A burst of new connections (a benchmark's arrivals) is queued, not reset.
            request_queue_size = 256

        self._server = Server((self.address, self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        remove_loopback(self.address)


@contextlib.contextmanager
def model_servers(servers: list[ModelServer]) -> Iterator[list[ModelServer]]:
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


def _with_port(args: list[str], flag: str, port: int) -> list[str]:
    return [f"{flag}={port}" if a.startswith(f"{flag}=") else a for a in args]


class Picker:
    """The endpoint picker as the operator's Deployment runs it: its args and its config
    from the Deployment and the ConfigMap the operator made, its token that of the
    ServiceAccount the operator bound (so the chart's ClusterRole is proven enough). Only
    the ports are changed to free ones (a host has one of each) and the config file's
    path."""

    def __init__(self, cluster: Cluster, namespace: str, name: str, kubeconfig: pathlib.Path):
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.kubeconfig = kubeconfig
        self.log = RUN / f"epp-{namespace}-{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.grpc = self.health = self.metrics = 0

    def start(self) -> None:
        deployment = self.cluster.get("deployment", self.name, self.namespace)
        config = self.cluster.get("configmap", self.name, self.namespace)
        assert deployment is not None and config is not None, "the operator made no picker"
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        config_file = RUN / f"epp-{self.namespace}-{self.name}.yaml"
        config_file.write_text(next(iter(config["data"].values())))
        self.grpc, self.health, self.metrics = free_port(), free_port(), free_port()
        args = list(container["args"])
        args = _with_port(args, "--grpc-port", self.grpc)
        args = _with_port(args, "--grpc-health-port", self.health)
        args = _with_port(args, "--metrics-port", self.metrics)
        args = [
            f"--config-file={config_file}" if a.startswith("--config-file=") else a for a in args
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(tools_bin() / "epp"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        wait_for(self._listening, 60, "the endpoint picker's gRPC port", self.tail)

    def _listening(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the endpoint picker exited:\n{self.tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.grpc), 1):
            return True
        return False

    def metrics_text(self) -> str:
        try:
            url = f"http://127.0.0.1:{self.metrics}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            return ""

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.process = None


class Gateway:
    """e2e/cluster/fleet/gateway against a picker: ``post`` sends one request through it and
    returns the endpoint it went to."""

    def __init__(self, picker_port: int) -> None:
        self.log = RUN / f"epp-gateway-{picker_port}.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(tools_bin() / "epp-gateway"), f"-picker=127.0.0.1:{picker_port}"],
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.process.stdout is not None
        self.address = self.process.stdout.readline().decode().strip()
        assert self.address, f"the gateway did not start: {self.log.read_text()[-2000:]}"

    def post(self, prompt: str = "hello", timeout: float = 30.0) -> tuple[int, str, float]:
        """(status, the endpoint that served it, seconds)."""
        body = json.dumps({"model": "moonshotai/Kimi-K3", "prompt": prompt, "max_tokens": 8})
        request = urllib.request.Request(
            f"http://{self.address}/v1/completions",
            data=body.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        began = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                answer.read()
                return (
                    answer.status,
                    answer.headers.get("X-Kimik3-Endpoint", ""),
                    (time.monotonic() - began),
                )
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("X-Kimik3-Endpoint", ""), time.monotonic() - began

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()


def pool_endpoints(cluster: Cluster, namespace: str, name: str) -> dict[int, str]:
    """Each routable leader's group and ip:port, as the pool's selector picks them."""
    selector = ",".join(
        f"{k}={v}"
        for k, v in {
            "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "leader",
            "serving.kimik3.io/routable": "true",
        }.items()
    )
    pods = cluster.items("pods", namespace, selector)
    return {
        int(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]): str(
            p.get("status", {}).get("podIP", "")
        )
        for p in pods
    }


def dump(objects: Any) -> str:
    return yaml.safe_dump(objects)[-4000:]
