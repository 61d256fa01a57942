"""What a namespace user's pods answer cannot hurt the operator: the leaders' /metrics and the
download pod's /progress are read through one bounded fetch, against real local HTTP servers
that behave as a hostile image would."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import FakeKube, resource
from kimik3_operator.config import Settings
from kimik3_operator.controller.reconcile import reconcile_for_runtime
from kimik3_operator.observation.acceptance import LeaderWindow, aggregate, parse_metrics
from kimik3_operator.observation.download_progress import parse_progress
from kimik3_operator.runtime.bounded_http import FetchError, fetch
from kimik3_operator.runtime.manager import Manager
from kimik3_operator.runtime.readers import AcceptanceReader

Handler = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(handle: Handler) -> str:
        class Answer(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                handle(self)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _ok(body: bytes, length: bool = True) -> Handler:
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        if length:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return handle


def test_a_plain_answer_is_read(serve: Callable[[Handler], str]) -> None:
    assert fetch(serve(_ok(b"vllm:spec_decode_num_drafts_total 3\n"))) == (
        "vllm:spec_decode_num_drafts_total 3\n"
    )


def test_a_body_over_the_cap_is_refused_without_reading_it_whole(
    serve: Callable[[Handler], str],
) -> None:
    big = b"#" * (8 * 1024 * 1024)
    with pytest.raises(FetchError, match="limit"):
        fetch(serve(_ok(big)))
    # Without a Content-Length the cap still holds while reading.
    with pytest.raises(FetchError, match="limit"):
        fetch(serve(_ok(big, length=False)))


def test_a_server_that_drips_is_cut_at_the_deadline(serve: Callable[[Handler], str]) -> None:
    def drip(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        for _ in range(100):
            h.wfile.write(b"#")
            h.wfile.flush()
            time.sleep(0.2)

    started = time.monotonic()
    with pytest.raises(FetchError, match=r"within|deadline"):
        fetch(serve(drip), deadline_seconds=1.0)
    assert time.monotonic() - started < 2.0


def test_a_drip_with_a_length_is_refused_not_returned_in_part(
    serve: Callable[[Handler], str],
) -> None:
    """The timer may close the socket while a read waits: the bytes read so far are a
    fragment, never an answer."""

    def drip(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(1000):
            h.wfile.write(b"#")
            h.wfile.flush()
            time.sleep(0.4)

    with pytest.raises(FetchError):
        fetch(serve(drip), deadline_seconds=1.0)


def test_an_answer_shorter_than_its_length_is_refused(serve: Callable[[Handler], str]) -> None:
    def short(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        h.wfile.write(b"#" * 10)
        h.close_connection = True

    with pytest.raises(FetchError, match="cut short"):
        fetch(serve(short))


def test_headers_that_drip_are_cut_at_the_deadline_too(serve: Callable[[Handler], str]) -> None:
    def drip_headers(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for number in range(100):
            h.wfile.write(f"X-{number}: 1\r\n".encode())
            h.wfile.flush()
            time.sleep(0.2)

    started = time.monotonic()
    with pytest.raises(FetchError):
        fetch(serve(drip_headers), deadline_seconds=1.0)
    assert time.monotonic() - started < 2.0


def test_a_redirect_is_not_followed(serve: Callable[[Handler], str]) -> None:
    visited = threading.Event()

    def elsewhere(h: BaseHTTPRequestHandler) -> None:
        visited.set()
        _ok(b"secret")(h)

    target = serve(elsewhere)

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", target)
        h.end_headers()

    with pytest.raises(FetchError, match="302"):
        fetch(serve(redirect))
    assert not visited.is_set()


def test_only_http_urls_are_read() -> None:
    for url in ("file:///etc/passwd", "https://127.0.0.1/", "ftp://x/"):
        with pytest.raises(FetchError):
            fetch(url)


def test_a_closed_port_is_a_fetch_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(FetchError):
        fetch(f"http://127.0.0.1:{port}/metrics")


def test_a_huge_position_index_costs_nothing() -> None:
    text = (
        "vllm:spec_decode_num_drafts_total 10\n"
        "vllm:spec_decode_num_draft_tokens_total 30\n"
        "vllm:spec_decode_num_accepted_tokens_total 20\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="30000000"} 5\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 5\n'
    )
    tracemalloc.start()
    window = LeaderWindow()
    for at in (0.0, 10.0):
        snapshot = parse_metrics(text.replace(" 5\n", f" {5 + at:g}\n"), at, positions=3)
        assert snapshot is not None
        assert set(snapshot.per_position) == {1}
        window.add(snapshot, 10.0)
    aggregate([window], 10.0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1024 * 1024


def test_non_finite_and_negative_counters_are_ignored() -> None:
    text = (
        "vllm:spec_decode_num_drafts_total NaN\n"
        "vllm:spec_decode_num_draft_tokens_total -5\n"
        "vllm:spec_decode_num_accepted_tokens_total +Inf\n"
    )
    assert parse_metrics(text, 0.0) is None


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("[1,2,3]", "not an object"),
        ('{"bytesDone": 1e400}', "not a whole number"),
        ('{"bytesDone": -1}', "out of range"),
        ('{"bytesTotal": "12"}', "not a whole number"),
        ('{"bytesDone": true}', "not a whole number"),
        ('{"phase": 3}', "not a string"),
        ("[" * 100000 + "]" * 100000, "nests too deeply"),
        ("not json", "Expecting value"),
    ],
)
def test_a_malformed_progress_answer_is_a_value_error(answer: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_progress(answer)


def test_a_good_progress_answer_is_kept() -> None:
    assert parse_progress('{"phase": "Downloading", "bytesTotal": 10, "bytesDone": 4}') == {
        "phase": "Downloading",
        "bytesTotal": 10,
        "bytesDone": 4,
        "verifiedBytes": 0,
    }


def _leader(owner: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{owner}-0",
            "namespace": "llm",
            "labels": {
                "app.kubernetes.io/instance": owner,
                "app.kubernetes.io/component": "leader",
                "app.kubernetes.io/managed-by": "kimik3-operator",
                "leaderworkerset.sigs.k8s.io/group-index": "0",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": owner,
                    "uid": "sts",
                    "controller": True,
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_slow_leader_does_not_hold_the_periodic_loop() -> None:
    """Every deployment's scrape is handed to the pool and the loop goes on at once; a
    deployment whose scrape still runs is not scraped a second time meanwhile."""
    release = threading.Event()
    calls: list[str] = []

    def stuck(url: str) -> str:
        calls.append(url)
        release.wait(10)
        return ""

    controller = Manager(
        api=FakeKube(),
        api_client=None,
        settings=Settings(gpu_inventory=False, scrape_workers=2),
        acceptance=AcceptanceReader(fetch=stuck),
        reconciler=reconcile_for_runtime,
    )
    for name in ("a", "b"):
        body = resource(name, drafter={"method": "eagle3", "repo": "x/y"})
        body["metadata"]["namespace"] = f"team-{name}"
        controller.store.upsert("KimiK3Deployment", body)
        leader = _leader(name)
        leader["metadata"]["namespace"] = f"team-{name}"
        controller.store.upsert("Pod", leader)
    try:
        started = time.monotonic()
        assert controller.submit_scrapes() == 2
        assert time.monotonic() - started < 0.5
        deadline = time.monotonic() + 5
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) == 2, "both leaders are being read at once"
        assert controller.submit_scrapes() == 0, "still running: not submitted again"
        release.set()
        deadline = time.monotonic() + 5
        assert controller.scrapes is not None
        while controller.scrapes.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert controller.submit_scrapes() == 2
    finally:
        release.set()
        controller.stop()
