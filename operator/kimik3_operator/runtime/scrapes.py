"""The scrape pool shared fairly between namespaces.

Deployments due for a scrape wait in one queue per namespace; a free worker takes the next
deployment from the next namespace in turn, and no namespace holds more than its share of
the workers (the workers divided by the namespaces that have deployments, at least one). A
tenant's many deployments, or leaders that answer only at the fetch's deadline, then slow
that tenant's own scrapes, never another's. A deployment already waiting or being scraped is
not queued again.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
Key = tuple[str, str]


@dataclass
class FairScrapes:
    workers: int
    run: Callable[[Key], None]
    # A fixed share per namespace instead of the workers over the namespaces (benchmarks).
    share: int | None = None
    _pool: ThreadPoolExecutor | None = None
    _waiting: dict[str, deque[Key]] = field(default_factory=dict)
    _queued: set[Key] = field(default_factory=set)  # waiting or running
    _running: dict[str, int] = field(default_factory=dict)
    _namespaces: int = 1
    _turn: int = 0
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.workers, "scrape")

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def submit(self, keys: Iterable[Key]) -> int:
        """Queues each deployment not already waiting or running; returns how many."""
        keys = list(keys)
        added = 0
        with self._lock:
            self._namespaces = max(1, len({namespace for namespace, _ in keys}))
            for key in keys:
                if key in self._queued:
                    continue
                self._queued.add(key)
                self._waiting.setdefault(key[0], deque()).append(key)
                added += 1
            self._dispatch()
        return added

    def running(self) -> int:
        with self._lock:
            return sum(self._running.values())

    def _limit(self) -> int:
        return self.share or max(1, self.workers // self._namespaces)

    def _dispatch(self) -> None:
        """Hands waiting deployments to free workers, namespaces in turn (under the lock)."""
        assert self._pool is not None
        while not self._closed and sum(self._running.values()) < self.workers:
            key = self._next()
            if key is None:
                return
            self._running[key[0]] = self._running.get(key[0], 0) + 1
            self._pool.submit(self._scrape, key)

    def _next(self) -> Key | None:
        namespaces = sorted(n for n, waiting in self._waiting.items() if waiting)
        limit = self._limit()
        for offset in range(len(namespaces)):
            namespace = namespaces[(self._turn + offset) % len(namespaces)]
            if self._running.get(namespace, 0) < limit:
                self._turn = (self._turn + offset + 1) % max(1, len(namespaces))
                return self._waiting[namespace].popleft()
        return None

    def _scrape(self, key: Key) -> None:
        try:
            self.run(key)
        except Exception:  # one deployment's scrape never stops the others
            log.exception("the scrape of %s/%s failed", *key)
        finally:
            with self._lock:
                self._queued.discard(key)
                self._running[key[0]] -= 1
                if not self._running[key[0]]:
                    del self._running[key[0]]
                if not self._waiting.get(key[0], True):
                    del self._waiting[key[0]]
                self._dispatch()
