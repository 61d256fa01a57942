"""List-then-watch of one kind in one scope, feeding a callback: the source of every read.

One thread per informer. A list replaces what the consumer holds for the scope (so objects
deleted while the watch was down disappear), then the watch resumes from the list's
resourceVersion; bookmarks keep that version fresh, and 410 Gone or a broken stream falls
back to a new list after a backoff. The API server is never polled.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
Obj = dict[str, Any]
OnEvent = Callable[[str, Obj], None]
OnSync = Callable[[list[Obj]], None]
WATCH_SECONDS = 290
PAGE = 500


class GoneError(Exception):
    """The watch's resourceVersion is too old: list again."""


class NotServedError(Exception):
    """The API server does not serve the resource (its CRD is not installed)."""


@dataclass
class Informer:
    """Keeps a consumer in step with ``path`` (a collection path, e.g. /api/v1/pods)."""

    api_client: Any
    path: str
    on_sync: OnSync
    on_event: OnEvent
    label_selector: str = ""
    field_selector: str = ""
    name: str = ""
    # Applied to every object as it arrives, before a page of a list is kept.
    transform: Callable[[Obj], Obj] | None = None
    # Objects per list page: what one response may hold at once.
    page: int = PAGE
    synced: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"informer {self.name or self.path}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Cut a backoff short, e.g. when the resource's CRD has just been installed."""
        self._wake.set()

    def _pause(self, seconds: float) -> bool:
        """Wait out a backoff; True when the informer is stopping."""
        self._wake.wait(seconds)
        self._wake.clear()
        return self._stop.is_set()

    def _query(self, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
        query = list(extra)
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query

    def _request(self, query: list[tuple[str, str]], timeout: Any) -> Any:
        params = self.api_client.param_serialize(
            method="GET",
            resource_path=self.path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        return self.api_client.call_api(*params, _request_timeout=timeout)

    def _list(self) -> tuple[list[Obj], str]:
        items: list[Obj] = []
        token = ""
        while True:
            extra = [("limit", str(self.page))] + ([("continue", token)] if token else [])
            response = self._request(self._query(extra), 60)
            data = json.loads(response.read() or b"{}")
            if response.status == 404:
                raise NotServedError
            if response.status >= 400:
                raise OSError(f"list {self.path}: {response.status} {data.get('message', '')}")
            page = data.pop("items", None) or []
            items.extend(map(self.transform, page) if self.transform else page)
            meta = data.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def _watch(self, version: str) -> Iterator[tuple[str, Obj]]:
        query = self._query(
            [
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("resourceVersion", version),
                ("timeoutSeconds", str(WATCH_SECONDS)),
            ]
        )
        response = self._request(query, (10, WATCH_SECONDS + 30))
        if response.status == 410:
            raise GoneError
        if response.status >= 400:
            raise OSError(f"watch {self.path}: {response.status} {response.read()[:300]!r}")
        raw = response.response
        try:
            buffer = b""
            for chunk in raw.stream(65536, decode_content=True):
                if self._stop.is_set():
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        yield str(event.get("type", "")), event.get("object") or {}
        finally:
            raw.release_conn()

    def _run(self) -> None:
        backoff = 0.5
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    items, version = self._list()
                    self.on_sync(items)
                    self.synced.set()
                for kind, obj in self._watch(version):
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise GoneError
                        raise OSError(f"watch error: {obj.get('message')}")
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if kind != "BOOKMARK":
                        self.on_event(kind, self.transform(obj) if self.transform else obj)
                backoff = 0.5
            except GoneError:
                version = ""
            except NotServedError:
                # Nothing of a kind that does not exist: say so, and look again later.
                self.on_sync([])
                self.synced.set()
                version = ""
                if self._pause(30.0):
                    return
            except Exception as exc:  # the API server restarting, a broken stream, a bad callback
                log.info("informer %s: %s; retrying in %.1fs", self.name or self.path, exc, backoff)
                if self._pause(backoff):
                    return
                backoff = min(backoff * 2, 30.0)
                # The stream may have missed events: list again rather than trust the version.
                version = ""
