"""One object nested too deep costs only itself: the decoder, then the informer around it.

The bodies are written as bytes: Python's own encoder refuses the depths the API server stores
(up to 10,000 levels in an open field)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from scripted_api import FakeApi, Response, pod

from kimik3_operator.runtime import decode
from kimik3_operator.runtime.informer import Informer

Obj = dict[str, Any]


def nested(levels: int) -> bytes:
    """An object ``levels`` deep, with strings that look like brackets along the way."""
    return b'{"a":"]}\\"[","b":' * levels + b"1" + b"}" * levels


def deep_deployment(name: str, levels: int, version: int = 7) -> bytes:
    meta = json.dumps(pod(name, version)["metadata"]).encode()
    return b'{"metadata":' + meta + b',"status":{"capabilities":' + nested(levels) + b"}}"


def page(*items: bytes) -> bytes:
    return b'{"metadata":{"resourceVersion":"10"},"items":[' + b",".join(items) + b"]}"


def test_a_body_the_standard_decoder_takes_is_not_rescanned() -> None:
    body = page(json.dumps(pod("a", 1)).encode(), deep_deployment("b", 30))
    data, cut = decode.loads(body)
    assert not cut
    assert data == json.loads(body)
    assert not decode.rejected(data["items"][0])


def test_a_body_nested_beyond_the_decoder_is_cut_where_it_is_too_deep_and_nowhere_else() -> None:
    body = page(json.dumps(pod("a", 1)).encode(), deep_deployment("b", 1_200))
    try:
        json.loads(body)
        raise AssertionError("the standard decoder was expected to refuse 1,200 levels")
    except RecursionError:
        pass
    data, cut = decode.loads(body)
    assert cut
    good, bad = data["items"]
    assert good == pod("a", 1), "the shallow object is decoded whole"
    assert not decode.rejected(good)
    assert bad["metadata"]["name"] == "b", "the deep one keeps its name for the event"
    assert decode.rejected(bad)


def test_strings_with_brackets_and_escapes_do_not_move_the_depth() -> None:
    text = b'{"x":"[[[{{{\\\\","y":["\\"]]]"],"z":{"w":"}}}"}}'
    assert decode.flattened(text) == text


def test_depth_past_the_object_limit_is_refused_even_when_the_decoder_took_it() -> None:
    shallow, _ = decode.loads(nested(decode.OBJECT_LIMIT - 1))
    deep, cut = decode.loads(nested(decode.OBJECT_LIMIT + 1))
    assert not cut
    assert not decode.rejected(shallow)
    assert decode.rejected(deep)


class RawResponse(Response):
    def __init__(self, body: bytes) -> None:
        super().__init__(200)
        self._body = body


def informer_over(api: FakeApi, strict: bool) -> tuple[list[list[str]], list[str], list[Obj]]:
    synced: list[list[str]] = []
    seen: list[str] = []
    refused: list[Obj] = []
    informer = Informer(
        api,
        "/apis/serving.kimik3.io/v1alpha1/kimik3deployments",
        on_sync=lambda items: synced.append([i["metadata"]["name"] for i in items]),
        on_event=lambda kind, obj: seen.append(f"{kind} {obj['metadata']['name']}"),
        on_rejected=refused.append,
        strict=strict,
        name="deployments",
    )
    informer.random = lambda: 0.0
    informer.start()
    assert api.idle.wait(10), "the script ran out"
    informer.stop()
    return synced, seen, refused


def test_a_list_with_one_object_too_deep_syncs_every_other_object() -> None:
    api = FakeApi([], [])
    body = page(
        json.dumps(pod("a", 1)).encode(),
        deep_deployment("b", 1_200),
        json.dumps(pod("c", 2)).encode(),
    )
    api.call_api = lambda query, _request_timeout=None: (  # type: ignore[method-assign]
        FakeApi.call_api(api, query) if "watch" in query else RawResponse(body)
    )
    synced, _, refused = informer_over(api, strict=False)
    assert synced == [["a", "c"]], "the informer synced without the deep object"
    assert [r["metadata"]["name"] for r in refused] == ["b"]
    assert refused[0]["metadata"] == {
        "name": "b",
        "namespace": "llm",
        "uid": "u-b",
        "resourceVersion": "7",
    }, "only the identity of the refused object is handed on"


def test_a_watch_event_too_deep_is_refused_its_version_passed_and_the_watch_goes_on() -> None:
    def stream() -> Iterator[bytes]:
        yield b'{"type":"MODIFIED","object":' + deep_deployment("a", 1_200, 11) + b"}\n"
        yield (json.dumps({"type": "ADDED", "object": pod("c", 12)}) + "\n").encode()

    api = FakeApi([pod("a", 5)], [lambda _version: Response(200, stream=stream)])
    synced, seen, refused = informer_over(api, strict=False)
    assert synced == [["a"]]
    assert seen == ["DELETED a", "ADDED c"], "what was held of a is dropped; c still arrives"
    assert [r["metadata"]["resourceVersion"] for r in refused] == ["11"]
    assert api.lists == 1, "no list again: the deep event is read once"
    assert api.watch_versions[1] == "12", "the next watch starts after both events"


def test_a_strict_informer_refuses_depth_the_decoder_took() -> None:
    body = page(json.dumps(pod("a", 1)).encode(), deep_deployment("b", decode.OBJECT_LIMIT + 5))

    def api() -> FakeApi:
        fake = FakeApi([], [])
        fake.call_api = lambda query, _request_timeout=None: (  # type: ignore[method-assign]
            FakeApi.call_api(fake, query) if "watch" in query else RawResponse(body)
        )
        return fake

    assert informer_over(api(), strict=True)[0] == [["a"]]
    # A kind whose fields are all closed is checked only when the decoder refused its body.
    assert informer_over(api(), strict=False)[0] == [["a", "b"]]


def bound_pod(number: int, env_bytes: int) -> Obj:
    """A bound pod as the API server lists it, with a large env value and annotation."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p{number}",
            "namespace": "tenant",
            "uid": f"uid-{number}",
            "resourceVersion": str(100 + number),
            "creationTimestamp": "2026-12-05T00:00:00Z",
            "annotations": {"note": "#" * env_bytes},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": f"node-{number % 3}",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [{"name": "BIG", "value": "#" * env_bytes}],
                    "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "1"}},
                }
            ],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "image": "b"}]},
    }


def test_the_ledger_trims_pods_while_they_are_decoded() -> None:
    """A page of 20 bound pods with 1 MiB env values and annotations: decoded with the
    ledger's hook, the ledger reads the same pods, and the decoded page is a few KiB, not
    40 MiB. The decoder's text copy of the body is there either way (the API client holds
    the bytes): beyond it, one pod's strings at a time."""
    import tracemalloc

    from kimik3_operator.runtime.gpu_ledger import ledger_pod_fields, ledger_pod_hook

    body = json.dumps(
        {"metadata": {"resourceVersion": "9"}, "items": [bound_pod(n, 1 << 20) for n in range(20)]}
    ).encode()
    tracemalloc.start()
    whole, _ = decode.loads(body)
    whole_size, whole_peak = tracemalloc.get_traced_memory()
    del whole
    tracemalloc.stop()
    tracemalloc.start()
    trimmed, _ = decode.loads(body, ledger_pod_hook)
    trimmed_size, trimmed_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert whole_size > 40 << 20
    assert trimmed_size < 64 << 10, trimmed_size
    assert trimmed_peak < len(body) + (4 << 20), "the body's text and one pod's strings"
    assert whole_peak > len(body) + (40 << 20)
    assert trimmed["metadata"] == {"resourceVersion": "9"}
    expected = [ledger_pod_fields(bound_pod(n, 8)) for n in range(20)]
    assert [ledger_pod_fields(p) for p in trimmed["items"]] == expected
    assert trimmed["items"][0]["metadata"]["resourceVersion"] == "100", "the watch resumes by it"


def test_the_ledger_hook_leaves_watch_bookmarks_and_errors_whole() -> None:
    from kimik3_operator.runtime.gpu_ledger import ledger_pod_hook

    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "metadata": {"resourceVersion": "77"}},
    }
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "gone"}}
    for event in (bookmark, error):
        assert decode.loads(json.dumps(event), ledger_pod_hook)[0] == event


def chunked(body: bytes, size: int) -> list[bytes]:
    return [body[at : at + size] for at in range(0, len(body), size)]


LISTED = {
    "kind": "PodList",
    "apiVersion": "v1",
    "metadata": {"resourceVersion": "12", "continue": "tok", "remainingItemCount": 7},
    "items": [
        {"metadata": {"name": f"p{n}"}, "spec": {"text": 'é😀]}\\"[' * n, "n": n, "f": -1.5e3}}
        for n in range(12)
    ],
}


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 4096, 1 << 20])
@pytest.mark.parametrize(
    "text",
    [
        json.dumps(LISTED),
        json.dumps(LISTED, indent=2),
        # The API server writes items last; any order is read the same.
        json.dumps(dict(reversed(list(LISTED.items()))), separators=(",", ":")),
    ],
)
def test_a_list_read_as_a_stream_is_the_list_in_any_chunks(size: int, text: str) -> None:
    body = decode.ListBody(chunked(text.encode(), size))
    assert [item for item, _ in body.items()] == LISTED["items"]
    assert body.rest == {k: v for k, v in LISTED.items() if k != "items"}


@pytest.mark.parametrize("text", ['{"items":[]}', '{"items":null,"metadata":{}}', "{}"])
def test_an_empty_list_streams_nothing(text: str) -> None:
    assert list(decode.ListBody([text.encode()]).items()) == []


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 22])
def test_an_item_too_deep_in_a_stream_is_cut_and_its_neighbours_are_whole(size: int) -> None:
    body = page(
        json.dumps(pod("a", 1)).encode(),
        deep_deployment("b", 1_200),
        json.dumps(pod("c", 2)).encode(),
    )
    read = list(decode.ListBody(chunked(body, size)).items())
    assert [cut for _, cut in read] == [False, True, False]
    assert read[0][0] == pod("a", 1) and read[2][0] == pod("c", 2)
    assert read[1][0]["metadata"]["name"] == "b" and decode.rejected(read[1][0])


def test_a_page_of_large_pods_streams_holding_one_pod_at_a_time() -> None:
    """500 pods to a page cost what one pod costs: the page of 20 pods of 2 MiB each (over
    40 MiB) is read in the socket's 64 KiB chunks, and only the pod being read is text."""
    import tracemalloc

    from kimik3_operator.runtime.gpu_ledger import ledger_pod_fields, ledger_pod_hook

    pods = [bound_pod(n, 1 << 20) for n in range(20)]
    chunks = chunked(
        json.dumps({"metadata": {"resourceVersion": "9"}, "items": pods}).encode(), 65536
    )
    del pods
    tracemalloc.start()
    body = decode.ListBody(iter(chunks), ledger_pod_hook)
    read = [ledger_pod_fields(item) for item, _ in body.items()]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert sum(map(len, chunks)) > 40 << 20
    assert body.held < 6 << 20, "about two pods' text (the wait for a pod's end doubles)"
    assert peak < 16 << 20, peak
    assert read == [ledger_pod_fields(bound_pod(n, 8)) for n in range(20)]
    assert body.rest == {"metadata": {"resourceVersion": "9"}}


def test_an_item_over_the_limit_or_a_cut_body_ends_the_list_in_error() -> None:
    big = json.dumps({"items": [{"v": "#" * 5000}]}).encode()
    with pytest.raises(ValueError, match="over 4,096 characters"):
        list(decode.ListBody(chunked(big, 100), item_limit=4096).items())
    for cut in (big[:-2], big[:30], b'{"items":[{"a":1},'):
        with pytest.raises(ValueError):
            list(decode.ListBody(chunked(cut, 7)).items())


def test_the_ledgers_list_keeps_only_pods_holding_gpus_and_tracks_none() -> None:
    """The GPU ledger's informer, the one the manager builds, over a cluster's pods: the
    ones that request no extended resource are not kept by the list nor remembered."""
    from kimik3_operator.runtime.gpu_ledger import GpuLedger, pods_informer

    plain = bound_pod(7, 8)
    plain["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    api = FakeApi([bound_pod(1, 8), plain, bound_pod(2, 8)], [])
    synced: list[list[Obj]] = []
    informer = pods_informer(api, synced.append, lambda kind, obj: None)
    informer.random = lambda: 0.0
    informer.start()
    assert api.idle.wait(10)
    informer.stop()
    assert [p["metadata"]["uid"] for p in synced[0]] == ["uid-1", "uid-2"]
    assert informer._known == {}
    ledger = GpuLedger()
    ledger.nodes_listed(
        [{"metadata": {"name": f"node-{n}"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
         for n in range(3)]
    )  # fmt: skip
    ledger.pods_listed(synced[0])
    counts = ledger.counts("nvidia.com/gpu", {}, own=["uid-1", "uid-7"])
    assert (counts.allocatable, counts.free, counts.own_pods_held) == (24, 8, 1)


class Named:
    def __str__(self) -> str:
        return 'a "named" thing'


@pytest.mark.parametrize(
    "value",
    [
        {},
        [],
        "",
        {"a": "plain", "b": 'quote " and back\\slash', "c": "tab\tnewline\n", "d": "\x00\x1f\x7f"},
        {"é": "naïve ☃", "astral": "\U0001f600", "cjk": "模型"},
        [0, -1, 10**30, 1.5, 1e-7, 1e300, float("inf"), float("nan"), True, False, None],
        {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
        ("a", ("b", ["c", {"d": ()}])),
        {"custom": Named(), "list": [Named()]},
        {"metadata": {"name": "x", "labels": {"k": "v"}}, "data": {"k": "#" * 300_000}},
        ["#" * 5000 + '"', "#" * 5000 + "\\", "#" * 5000 + "\x01", "#" * 5000 + "é"],
    ],
)
def test_the_encoded_size_is_the_length_of_the_compact_json(value: Any) -> None:
    """The store weighs what it keeps by this size: it must be the JSON's length exactly,
    for every kind of value an object holds."""
    from kimik3_operator.runtime.decode import encoded_size

    assert encoded_size(value) == len(json.dumps(value, separators=(",", ":"), default=str))


def test_the_encoded_size_of_an_object_nested_deeper_than_the_recursion_limit() -> None:
    from kimik3_operator.runtime.decode import encoded_size

    deep: Any = "leaf"
    for _ in range(5000):
        deep = {"k": [deep]}
    assert encoded_size(deep) == 5000 * len('{"k":[]}') + len('"leaf"')
