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


def in_namespace(name: str, namespace: str, size: int = 0) -> Obj:
    found = pod(name, 5)
    found["metadata"]["namespace"] = namespace
    found["data"] = "#" * size
    return found


class PathApi(FakeApi):
    """Lists each path's own objects (a namespace's, or all of them) and records the paths."""

    def __init__(self, objects: list[Obj]) -> None:
        super().__init__(objects, [])
        self.paths: list[str] = []
        self.answers: list[Response] = []

    def param_serialize(self, **kwargs: Any) -> tuple[Any, ...]:
        return (dict(kwargs["query_params"]), kwargs["resource_path"])

    def call_api(  # type: ignore[override]
        self, query: dict[str, str], path: str, _request_timeout: Any = None
    ) -> Response:
        self.paths.append(path)
        if "watch" in query:
            return super().call_api(query)
        _, _, rest = path.partition("/namespaces/")
        namespace = rest.split("/", maxsplit=1)[0]
        picked = [o for o in self.objects if namespace in ("", o["metadata"]["namespace"])]
        answer = Response(200, {"items": picked, "metadata": {"resourceVersion": "10"}})
        self.answers.append(answer)
        return answer


def test_the_first_list_hands_over_each_namespace_once_the_list_has_passed_it() -> None:
    """Listing every namespace, a namespace's objects go to the consumer as soon as the list
    is in the next namespace (the API server lists in key order): a tenant sorted after
    another does not wait for all of the list. The last namespace comes with the list."""
    api = PathApi(
        [
            in_namespace("a1", "a"),
            in_namespace("a2", "a"),
            in_namespace("b1", "b"),
            in_namespace("c1", "c"),
        ]
    )
    handed: list[tuple[str, list[str]]] = []
    synced: list[list[str]] = []
    informer = Informer(
        api,
        "/api/v1/pods",
        on_sync=lambda items: synced.append([i["metadata"]["name"] for i in items]),
        on_event=lambda *_: None,
        on_namespace_listed=lambda ns, items: handed.append(
            (ns, [i["metadata"]["name"] for i in items])
        ),
    )
    informer.start()
    assert api.idle.wait(10)
    informer.stop()
    assert handed == [("a", ["a1", "a2"]), ("b", ["b1"])]
    assert synced == [["a1", "a2", "b1", "c1"]]


def test_a_list_out_of_namespace_order_hands_over_nothing_more() -> None:
    api = PathApi(
        [
            in_namespace("a1", "a"),
            in_namespace("b1", "b"),
            in_namespace("a2", "a"),
            in_namespace("c1", "c"),
        ]
    )
    handed: list[str] = []
    informer = Informer(
        api,
        "/api/v1/pods",
        on_sync=lambda _items: None,
        on_event=lambda *_: None,
        on_namespace_listed=lambda ns, _items: handed.append(ns),
    )
    informer.start()
    assert api.idle.wait(10)
    informer.stop()
    # b is handed when a comes back, before the disorder shows; from then on nothing is.
    assert handed == ["a", "b"], "c is not handed: it comes with the whole list"


def test_a_namespaces_own_list_reads_its_path_within_the_budget() -> None:
    from kimik3_operator.runtime.informer import ByteBudget, ListTooLargeError

    api = PathApi(
        [
            in_namespace("a1", "a", 1000),
            in_namespace("b1", "b", 1000),
            in_namespace("b2", "b", 1000),
        ]
    )
    informer = Informer(
        api, "/api/v1/pods", on_sync=lambda _i: None, on_event=lambda *_: None, label_selector="x=y"
    )
    budget = ByteBudget(3000)
    found = informer.list_namespace("/api/v1/namespaces/a/pods", budget)
    assert [o["metadata"]["name"] for o in found] == ["a1"]
    assert api.paths == ["/api/v1/namespaces/a/pods"]
    assert 0 < budget.left < 2000, "what the list read is spent"
    with pytest.raises(ListTooLargeError):
        informer.list_namespace("/api/v1/namespaces/b/pods", budget)
    assert getattr(api.answers[-1], "closed", False), "a list read in part closes its connection"
    assert not informer.synced.is_set(), "the informer's own state is untouched"
