"""The serving container's launcher (programs/launch.py) on a stop, as real processes: the
launcher given inline to ``python3 -c`` as the pod runs it, a stand-in for ``vllm serve``
that records when SIGTERM reaches it, and a leader's /metrics served over HTTP whose
in-flight requests the test sets (no vLLM: its drain is what is under test, not vLLM)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

import pytest

SERVE = """
import signal, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
def stop(number, frame):
    out.write_text(repr(time.time()))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1] + ".ready").write_text("1")
while True:
    time.sleep(0.05)
"""


class Leader:
    def __init__(self) -> None:
        self.running = 1.0
        self.waiting = 0.0


@pytest.fixture
def leader() -> Iterator[tuple[Leader, str]]:
    state = Leader()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (
                "# HELP vllm:num_requests_running running\n"
                f'vllm:num_requests_running{{model_name="m",engine="0"}} {state.running}\n'
                f'vllm:num_requests_waiting{{model_name="m",engine="0"}} {state.waiting}\n'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def launch(
    tmp: pathlib.Path, url: str, seconds: float
) -> tuple[subprocess.Popen[bytes], pathlib.Path]:
    script = resources.files("kimik3_operator.programs").joinpath("launch.py").read_text()
    stopped = tmp / "stopped"
    env = {
        **os.environ,
        "KIMIK3_DRAIN_URL": url,
        "KIMIK3_DRAIN_SECONDS": str(seconds),
        "KIMIK3_DRAIN_SETTLE_SECONDS": "0.2",
        "KIMIK3_TERMINATION_LOG": str(tmp / "termination-log"),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", script, sys.executable, "-c", SERVE, str(stopped)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not (tmp / "stopped.ready").exists():
        assert time.monotonic() < deadline and process.poll() is None, "the stand-in never started"
        time.sleep(0.05)
    return process, stopped


def stop_after(process: subprocess.Popen[bytes], stopped: pathlib.Path) -> float:
    """Seconds from SIGTERM to the launcher until it reached the stand-in."""
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    return float(stopped.read_text()) - sent


def test_a_stop_waits_until_the_leaders_requests_finish(
    tmp_path: pathlib.Path, leader: tuple[Leader, str]
) -> None:
    state, url = leader
    process, stopped = launch(tmp_path, url, seconds=20)
    threading.Timer(2.0, lambda: setattr(state, "running", 0.0)).start()
    waited = stop_after(process, stopped)
    assert 2.0 <= waited < 5.0, waited
    # A stop on request is not a failure to explain.
    assert not (tmp_path / "termination-log").exists()


def test_waiting_requests_hold_the_stop_too(
    tmp_path: pathlib.Path, leader: tuple[Leader, str]
) -> None:
    state, url = leader
    state.running, state.waiting = 0.0, 3.0
    process, stopped = launch(tmp_path, url, seconds=20)
    threading.Timer(1.5, lambda: setattr(state, "waiting", 0.0)).start()
    assert 1.5 <= stop_after(process, stopped) < 4.5


def test_the_drain_ends_at_its_deadline(tmp_path: pathlib.Path, leader: tuple[Leader, str]) -> None:
    _, url = leader  # a request that never finishes
    process, stopped = launch(tmp_path, url, seconds=2)
    assert 2.0 <= stop_after(process, stopped) < 4.0


def test_an_unreachable_leader_stops_at_once(tmp_path: pathlib.Path) -> None:
    process, stopped = launch(tmp_path, "http://127.0.0.1:9/metrics", seconds=20)
    assert stop_after(process, stopped) < 2.0


def test_a_second_signal_stops_without_waiting(
    tmp_path: pathlib.Path, leader: tuple[Leader, str]
) -> None:
    _, url = leader
    process, stopped = launch(tmp_path, url, seconds=30)
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert float(stopped.read_text()) - sent < 2.0
