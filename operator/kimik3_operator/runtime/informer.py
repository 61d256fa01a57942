"""List-then-watch of one kind in one scope, feeding a callback: the source of every read.

One thread per informer, with client-go's reflector guarantees:
- a list replaces what the consumer holds for the scope, and every object it held that the
  list no longer has gets a DELETED event (an owner learns of a child deleted during an
  outage at once, not at the next resync);
- the watch resumes from the last resourceVersion it saw (bookmarks keep it fresh); only
  410 Gone, or an expired version, costs a new list. A broken stream or an API server that
  restarts is a new watch from where it left off, not a list of 20,000 pods;
- the backoff after an error and each watch's timeout are jittered, so the informers of many
  operators do not reconnect in lockstep after an API server restart;
- a consumer callback that raises is logged and skipped: it costs neither the watch nor a list;
- an object the decoder refuses (runtime/decode.py: nested too deep) is skipped, reported to
  ``on_rejected`` and, for the consumer, gone; the rest of its page, and the watch, go on.
The API server is never polled.

A cluster-wide watch's first list can take seconds when one tenant holds much; two things
let the other tenants go before it ends: ``on_namespace_listed`` hands over each namespace's
objects as soon as the list has passed them (the API server lists in key order, namespace
first), and ``list_namespace`` reads one namespace alone, up to a byte budget.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kimik3_operator.kube import send
from kimik3_operator.runtime import decode

log = logging.getLogger(__name__)
Obj = dict[str, Any]
OnEvent = Callable[[str, Obj], None]
OnSync = Callable[[list[Obj]], None]
OnRejected = Callable[[Obj], None]
# The watch event that stands for an object the decoder refused.
REJECTED = "REJECTED"
WATCH_SECONDS = 290  # each watch asks for 290 to 580 s (jittered), as client-go does
# Objects per list page. Lists run side by side, each holding the text of one object at a
# time (decode.ListBody): in the operator, a small list never waits behind a large one.
PAGE = 500
BACKOFF_START, BACKOFF_MAX = 0.5, 30.0


class GoneError(Exception):
    """The watch's resourceVersion is too old: list again."""


class NotServedError(Exception):
    """The API server does not serve the resource (its CRD is not installed)."""


class ListTooLargeError(Exception):
    """A namespace's own list read past its byte budget."""


@dataclass
class ByteBudget:
    """Bytes one or more lists may still read (shared by the lists of one namespace)."""

    left: int
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def spend(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            with self._lock:
                self.left -= len(chunk)
                over = self.left < 0
            if over:
                raise ListTooLargeError
            yield chunk


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
    # Makes the transform of one list, in place of ``transform``: one that keeps a state
    # across the list's pages (a byte budget), so a list never holds more than it allows.
    # An object it turns into None is not kept (nor known: no DELETED event for it later).
    list_transform: Callable[[], Callable[[Obj], Obj | None]] | None = None
    # Applied while decoding (decode.loads): trims each JSON object as it is built, so a page
    # of large objects never exists whole in memory.
    object_hook: decode.ObjectHook | None = None
    # Objects per list page: one request each. A page is decoded as it streams in, one
    # object at a time (decode.ListBody), so its size costs no memory.
    page: int = PAGE
    # Refused objects: their name, namespace, uid and resourceVersion, nothing else.
    on_rejected: OnRejected | None = None
    # Check the depth of every object, not only of a body the fast decoder refused: for kinds
    # with open fields (a KimiK3Deployment's status), whose depth only the author bounds.
    strict: bool = False
    # Remember what the consumer holds, to report what a new list no longer has. A consumer
    # whose ``on_sync`` replaces all it holds (the GPU ledger) needs no such report: it then
    # costs nothing per object.
    track: bool = True
    # Called after every list the consumer has taken (``synced`` is set by then).
    on_listed: Callable[[], None] = lambda: None
    # During the first list, each namespace's objects once the list has passed them, before
    # ``on_sync`` has the whole list: a cluster-wide list of a kind is in key order, so a
    # namespace is complete when the next object is in another one.
    on_namespace_listed: Callable[[str, list[Obj]], None] | None = None
    synced: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # What the consumer holds, by (namespace, name): the identity of each object, so a new
    # list can report the ones that vanished.
    _known: dict[tuple[str, str], Obj] = field(default_factory=dict)
    # Jitter and clock, replaceable in tests.
    random: Callable[[], float] = random.random

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

    def _request(self, query: list[tuple[str, str]], timeout: Any, path: str = "") -> Any:
        return send(self.api_client, "GET", path or self.path, query=query, timeout=timeout)

    def list_namespace(self, path: str, budget: ByteBudget) -> list[Obj]:
        """One list of ``path`` (this kind in one namespace), with this informer's selector,
        transform and decoding, reading at most what ``budget`` has left
        (ListTooLargeError past it). The informer's own state is untouched."""
        return self._list(path, budget)[0]

    def _list(
        self,
        path: str = "",
        budget: ByteBudget | None = None,
        on_namespace: Callable[[str, list[Obj]], None] | None = None,
    ) -> tuple[list[Obj], str]:
        items: list[Obj] = []
        token = ""
        transform = self.list_transform() if self.list_transform else self.transform
        runs = NamespaceRuns(on_namespace, self.name or self.path) if on_namespace else None
        while True:
            extra = [("limit", str(self.page))] + ([("continue", token)] if token else [])
            response = self._request(self._query(extra), 60, path)
            if response.status == 404:
                # A group the API server does not serve answers in plain text.
                raise NotServedError
            if response.status >= 400:
                data, _ = decode.loads(response.read() or b"{}")
                raise OSError(
                    f"list {path or self.path}: {response.status} {data.get('message', '')}"
                )
            raw = response.response
            chunks = raw.stream(65536, decode_content=True)
            body = decode.ListBody(budget.spend(chunks) if budget else chunks, self.object_hook)
            try:
                for obj, cut in body.items():
                    if (cut or self.strict) and self._refused(obj):
                        continue
                    kept = transform(obj) if transform else obj
                    if kept is not None:
                        items.append(kept)
                        if runs is not None:
                            runs.add(kept)
            except BaseException:
                raw.close()  # read only in part: the connection cannot carry another request
                raise
            finally:
                raw.release_conn()
            meta = body.rest.get("metadata") or {}
            del body, response
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def _watch(self, version: str) -> Iterator[tuple[str, Obj]]:
        timeout = int(WATCH_SECONDS * (1 + self.random()))
        query = self._query(
            [
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("resourceVersion", version),
                ("timeoutSeconds", str(timeout)),
            ]
        )
        response = self._request(query, (10, timeout + 30))
        if response.status == 410:
            raise GoneError
        if response.status == 404:
            raise NotServedError
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
                        event, cut = decode.loads(line, self.object_hook)
                        obj = event.get("object") or {}
                        if (cut or self.strict) and decode.rejected(obj):
                            yield REJECTED, obj
                        else:
                            yield str(event.get("type", "")), obj
        finally:
            raw.release_conn()

    def _refused(self, obj: Obj) -> bool:
        """Whether ``obj`` is refused; if so it is logged and handed to ``on_rejected``."""
        if not decode.rejected(obj):
            return False
        found = obj.get("metadata")
        meta: Obj = found if isinstance(found, dict) else {}
        kept = {
            k: str(meta[k]) for k in ("name", "namespace", "uid", "resourceVersion") if k in meta
        }
        log.warning(
            "informer %s: %s/%s nests deeper than %d levels; skipped",
            self.name or self.path,
            kept.get("namespace", ""),
            kept.get("name", ""),
            decode.OBJECT_LIMIT,
        )
        if self.on_rejected is not None:
            try:
                self.on_rejected({"metadata": kept})
            except Exception:
                log.exception("informer %s: the rejection handler failed", self.name)
        return True

    def _jittered(self, seconds: float) -> float:
        return seconds * (1 + self.random())

    @staticmethod
    def _identity(obj: Obj) -> tuple[tuple[str, str], Obj]:
        meta = obj.get("metadata") or {}
        # Objects trimmed to their uid (the GPU ledger's pods) are known by it.
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or meta.get("uid") or ""))
        kept = {k: meta[k] for k in ("name", "namespace", "uid", "labels") if k in meta}
        return key, {"metadata": kept}

    def _deliver(self, kind: str, obj: Obj) -> None:
        if self.track:
            key, identity = self._identity(obj)
            if kind == "DELETED":
                self._known.pop(key, None)
            else:
                self._known[key] = identity
        try:
            self.on_event(kind, obj)
        except Exception:
            log.exception("informer %s: the %s handler failed; skipped", self.name, kind)

    def _sync(self, items: list[Obj]) -> None:
        """A fresh list: the consumer's scope replaced, and a DELETED event for each object
        it held that is gone."""
        before = self._known
        self._known = dict(map(self._identity, items)) if self.track else {}
        try:
            self.on_sync(items)
        except Exception:
            log.exception("informer %s: the list handler failed", self.name)
        for key in before.keys() - self._known.keys():
            try:
                self.on_event("DELETED", before[key])
            except Exception:
                log.exception("informer %s: the DELETED handler failed; skipped", self.name)

    def _listed(self) -> None:
        try:
            self.on_listed()
        except Exception:
            log.exception("informer %s: the listed handler failed", self.name)

    def _run(self) -> None:
        backoff = BACKOFF_START
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    started = time.monotonic()
                    first = None if self.synced.is_set() else self.on_namespace_listed
                    items, version = self._list(on_namespace=first)
                    self._sync(items)
                    log.info(
                        "informer %s: listed, %d kept, in %.2fs",
                        self.name or self.path,
                        len(items),
                        time.monotonic() - started,
                    )
                    self.synced.set()
                    self._listed()
                for kind, obj in self._watch(version):
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise GoneError
                        raise OSError(f"watch error: {obj.get('message')}")
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if kind == REJECTED:
                        self._refused(obj)
                        # What the consumer held of it is stale now: for it, the object is gone.
                        if self._identity(obj)[0] in self._known:
                            self._deliver("DELETED", self._identity(obj)[1])
                    elif kind != "BOOKMARK":
                        self._deliver(kind, self.transform(obj) if self.transform else obj)
                backoff = BACKOFF_START
            except GoneError:
                # The version is too old for the API server: only a list can catch up.
                version = ""
            except NotServedError:
                # Nothing of a kind that does not exist: say so, and look again later.
                self._sync([])
                self.synced.set()
                self._listed()
                version = ""
                if self._pause(self._jittered(15.0)):
                    return
            except Exception as exc:  # the API server restarting, a broken stream
                wait = self._jittered(backoff)
                log.info("informer %s: %s; resuming in %.1fs", self.name or self.path, exc, wait)
                if self._pause(wait):
                    return
                backoff = min(backoff * 2, BACKOFF_MAX)
                # The watch resumes from the last version it saw; a list only if none yet.


class NamespaceRuns:
    """Hands over each namespace's objects of a list in key order as soon as the list has
    passed them. Should a namespace come back (the order is not the API server's), it stops
    handing over: what it handed over stays a namespace's complete objects at the time, and
    the whole list follows."""

    def __init__(self, hand_over: Callable[[str, list[Obj]], None], name: str) -> None:
        self.hand_over: Callable[[str, list[Obj]], None] | None = hand_over
        self.name = name
        self.current: str | None = None
        self.run: list[Obj] = []
        self.passed: set[str] = set()

    def add(self, obj: Obj) -> None:
        if self.hand_over is None:
            return
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        if namespace != self.current:
            if self.current is not None:
                self._give(self.current, self.run)
                self.passed.add(self.current)
            if namespace in self.passed:
                log.warning(
                    "informer %s: a list not in namespace order; waiting for it whole", self.name
                )
                self.hand_over, self.run = None, []
                return
            self.current, self.run = namespace, []
        self.run.append(obj)

    def _give(self, namespace: str, objects: list[Obj]) -> None:
        assert self.hand_over is not None
        try:
            self.hand_over(namespace, objects)
        except Exception:
            log.exception("informer %s: the namespace handler failed", self.name)
