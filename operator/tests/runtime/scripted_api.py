"""A scripted API for the informer's tests: list pages and watch streams as given, with
the status codes and errors a real API server answers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

Obj = dict[str, Any]


def pod(name: str, version: int) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": f"u-{name}",
            "resourceVersion": str(version),
        }
    }


class Response:
    def __init__(
        self,
        status: int,
        body: Obj | None = None,
        stream: Callable[[], Iterator[bytes]] | None = None,
    ) -> None:
        self.status = status
        self._body = json.dumps(body or {}).encode()
        self.response = self
        self._stream = stream

    def read(self) -> bytes:
        return self._body

    def stream(self, size: int = 65536, *_: Any, **__: Any) -> Iterator[bytes]:
        if self._stream is None:  # a list's body, in the chunks a socket gives
            yield from (self._body[at : at + size] for at in range(0, len(self._body), size))
        else:
            yield from self._stream()

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeApi:
    """Answers lists from ``objects`` and watches from a script of callables, one a watch."""

    def __init__(self, objects: list[Obj], watches: list[Callable[[str], Response]]) -> None:
        self.objects = objects
        self.watches = watches
        self.lists = 0
        self.watch_versions: list[str] = []
        self.watch_timeouts: list[int] = []
        self.idle = threading.Event()

    @staticmethod
    def _quiet() -> Iterator[bytes]:
        time.sleep(0.05)  # a watch that times out with nothing to say
        yield from ()

    def param_serialize(self, **kwargs: Any) -> tuple[Any, ...]:
        return (dict(kwargs["query_params"]),)

    def call_api(self, query: dict[str, str], _request_timeout: Any = None) -> Response:
        if "watch" not in query:
            self.lists += 1
            return Response(
                200, {"items": list(self.objects), "metadata": {"resourceVersion": "10"}}
            )
        self.watch_versions.append(query["resourceVersion"])
        self.watch_timeouts.append(int(query["timeoutSeconds"]))
        if not self.watches:
            self.idle.set()
            return Response(200, stream=self._quiet)
        return self.watches.pop(0)(query["resourceVersion"])
