"""The informer against a scripted API: client-go's reflector guarantees, without a server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from scripted_api import FakeApi, Obj, Response, pod

from kimik3_operator.runtime.informer import Informer


def events(*items: tuple[str, Obj], broken: bool = False) -> Callable[[str], Response]:
    def stream() -> Iterator[bytes]:
        for kind, obj in items:
            yield (json.dumps({"type": kind, "object": obj}) + "\n").encode()
        if broken:
            raise ConnectionResetError("stream broken")

    return lambda _version: Response(200, stream=stream)


def run(
    api: FakeApi, on_event: Callable[[str, Obj], None] | None = None
) -> tuple[Informer, list[tuple[str, str]], list[list[str]]]:
    seen: list[tuple[str, str]] = []
    synced: list[list[str]] = []

    def record(kind: str, obj: Obj) -> None:
        seen.append((kind, obj["metadata"]["name"]))
        if on_event is not None:
            on_event(kind, obj)

    informer = Informer(
        api,
        "/api/v1/pods",
        on_sync=lambda items: synced.append([i["metadata"]["name"] for i in items]),
        on_event=record,
        name="pods",
    )
    informer.random = lambda: 0.0  # no jitter: the backoffs are short and known
    informer.start()
    assert api.idle.wait(10), "the script ran out"
    informer.stop()
    return informer, seen, synced


def test_a_broken_stream_resumes_the_watch_from_its_last_version_without_a_list() -> None:
    api = FakeApi(
        [pod("a", 5)],
        [
            events(("ADDED", pod("b", 11)), ("MODIFIED", pod("a", 12)), broken=True),
            events(("DELETED", pod("b", 13))),
        ],
    )
    _, seen, synced = run(api)
    assert api.lists == 1, "one list, however often the stream breaks"
    assert api.watch_versions[:3] == ["10", "12", "13"]
    assert seen == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert synced == [["a"]]


def test_gone_lists_again_and_reports_what_vanished_as_deleted() -> None:
    api = FakeApi(
        [pod("a", 5), pod("b", 6)],
        [lambda _version: Response(410, {"code": 410})],
    )

    original = api.call_api

    def second_list_without_b(query: dict[str, str], _request_timeout: Any = None) -> Response:
        if "watch" not in query and api.lists == 1:
            api.objects = [pod("a", 5)]
        return original(query, _request_timeout)

    api.call_api = second_list_without_b  # type: ignore[method-assign]
    _, seen, synced = run(api)
    assert api.lists == 2, "410 Gone: a new list"
    assert synced == [["a", "b"], ["a"]]
    assert ("DELETED", "b") in seen, "b went while the watch was down: its owner hears of it"


def test_a_watch_error_event_of_410_lists_again() -> None:
    api = FakeApi([pod("a", 5)], [events(("ERROR", {"code": 410, "message": "too old"}))])
    run(api)
    assert api.lists == 2


def test_a_failing_callback_is_skipped_and_the_watch_goes_on() -> None:
    api = FakeApi([], [events(("ADDED", pod("bad", 11)), ("ADDED", pod("good", 12)))])

    def explode(kind: str, obj: Obj) -> None:
        if obj["metadata"]["name"] == "bad":
            raise ValueError("a bug in a handler")

    _, seen, _ = run(api, explode)
    assert seen == [("ADDED", "bad"), ("ADDED", "good")]
    assert api.lists == 1, "a handler's bug costs no list"


@pytest.mark.parametrize(
    "body",
    [b'{"message": "not found"}', b"404 page not found\n"],
    ids=["a Status", "a group the API server does not serve (plain text)"],
)
def test_a_kind_that_is_not_served_is_empty_and_synced(body: bytes) -> None:
    calls: list[str] = []

    class NotServed(FakeApi):
        def call_api(self, query: dict[str, str], _request_timeout: Any = None) -> Response:
            calls.append("watch" if "watch" in query else "list")
            self.idle.set()
            answer = Response(404)
            answer._body = body
            return answer

    api = NotServed([], [])
    informer, _, synced = run(api)
    assert informer.synced.is_set() and synced == [[]]


def test_watch_timeouts_and_backoffs_are_jittered() -> None:
    api = FakeApi([], [events(), events(), events()])
    informer = Informer(api, "/api/v1/pods", on_sync=lambda _: None, on_event=lambda *_: None)
    draws = iter([0.0, 0.5, 0.99] * 10)
    informer.random = lambda: next(draws)
    informer.start()
    api.idle.wait(10)
    informer.stop()
    assert api.watch_timeouts[:3] == [290, 435, 577]
    informer.random = lambda: 0.5
    assert informer._jittered(2.0) == 3.0
