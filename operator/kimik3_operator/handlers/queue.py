"""A coalescing work queue: many events for one resource become one reconcile.

A key added while it waits is not added twice; a key added while it is being reconciled is
reconciled once more afterwards (never twice at the same time). Keys wait ``delay`` seconds
before they are handed out, so a burst of pod events lands in one reconcile.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, delay: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.delay = delay
        self._clock = clock
        self._heap: list[tuple[float, int, K]] = []
        self._waiting: dict[K, float] = {}
        self._active: set[K] = set()
        self._again: dict[K, float] = {}
        self._counter = 0
        self._closed = False
        self._cond = threading.Condition()
        self.coalesced = 0

    def add(self, key: K, delay: float | None = None) -> None:
        with self._cond:
            if key in self._active:
                # Once more after this run, at the soonest delay asked for meanwhile.
                wanted = self.delay if delay is None else delay
                self._again[key] = min(self._again.get(key, wanted), wanted)
                self.coalesced += 1
                return
            due = self._clock() + (self.delay if delay is None else delay)
            if key in self._waiting:
                self.coalesced += 1
                if due >= self._waiting[key]:
                    return
            self._waiting[key] = due
            self._counter += 1
            heapq.heappush(self._heap, (due, self._counter, key))
            self._cond.notify()

    def get(self, timeout: float | None = None) -> K | None:
        """The next due key, or None when closed or after ``timeout`` seconds."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while not self._closed:
                now = self._clock()
                while self._heap and self._waiting.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded by an earlier due time
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._waiting[key]
                    self._active.add(key)
                    return key
                wait = self._heap[0][0] - now if self._heap else None
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)
            return None

    def done(self, key: K) -> None:
        with self._cond:
            self._active.discard(key)
            again = key in self._again
            delay = self._again.pop(key, None)
        if again:
            self.add(key, delay=delay)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)
