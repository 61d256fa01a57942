"""A coalescing work queue: many events for one resource become one reconcile.

A key added while it waits is not added twice; a key added while it is being reconciled is
reconciled once more afterwards (never twice at the same time). Keys wait ``delay`` seconds
before they are handed out, so a burst of pod events lands in one reconcile.

A key whose reconcile failed comes back after a per-key exponential backoff (``retry_base``
doubling up to ``retry_max``, reset by ``forget`` on success) and no sooner than an overall
token bucket allows (``retry_qps``, ``retry_burst``): client-go's default controller rate
limiter, so one failing resource is retried ever more slowly and a thousand failing at once
do not flood the API server. The queue reports client-go's workqueue metrics.

Keys that are due are handed out in turns between their groups (``fair_by``: the resource's
namespace), first come first served within a group: a tenant who applies 200 resources at
once waits for its own, and another tenant's one change goes next, not 200th. With
``workers``, a group also holds at most its share of them at a time (the workers over the
groups that have work, and never all of them): a tenant whose reconciles are slow, or many,
leaves workers free for the others' instead of making them wait for one to end.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

K = TypeVar("K", bound=Hashable)

DEPTH = Gauge("kimik3_workqueue_depth", "Keys waiting in the reconcile queue")
ADDS = Counter("kimik3_workqueue_adds", "Keys added to the reconcile queue")
RETRIES = Counter("kimik3_workqueue_retries", "Keys added again after a failed reconcile")
DURATIONS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
QUEUE_SECONDS = Histogram(
    "kimik3_workqueue_queue_duration_seconds",
    "Time a key waits in the queue after it is due",
    buckets=DURATIONS,
)
WORK_SECONDS = Histogram(
    "kimik3_workqueue_work_duration_seconds", "Time one reconcile takes", buckets=DURATIONS
)
UNFINISHED = Gauge(
    "kimik3_workqueue_unfinished_work_seconds", "Seconds the reconciles now running have taken"
)
LONGEST = Gauge(
    "kimik3_workqueue_longest_running_processor_seconds",
    "Seconds the longest reconcile now running has taken",
)


class TokenBucket:
    """``qps`` tokens a second up to ``burst``; ``reserve`` says how long to wait for one."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float]) -> None:
        self.qps: float = qps
        self.burst: int = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def reserve(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


class WorkQueue(Generic[K]):
    def __init__(
        self,
        delay: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        retry_base: float = 0.01,
        retry_max: float = 300.0,
        retry_qps: float = 10.0,
        retry_burst: int = 100,
        fair_by: Callable[[K], Hashable] = lambda _key: None,
        workers: int = 0,
    ) -> None:
        self.delay = delay
        self._group_of = fair_by
        # The workers that take keys; 0: no share per group.
        self.workers = workers
        self._running: dict[Hashable, int] = {}
        # Due keys, per group in the order they fell due, and the groups' turns.
        self._ready: dict[Hashable, deque[tuple[float, K]]] = {}
        self._turns: deque[Hashable] = deque()
        self.retry_base = retry_base
        self.retry_max = retry_max
        self._bucket = TokenBucket(retry_qps, retry_burst, clock)
        self._failures: dict[K, int] = {}
        self._started: dict[K, float] = {}
        # Seconds each running key waited after it was due.
        self._waited: dict[K, float] = {}
        self._clock = clock
        self._heap: list[tuple[float, int, K]] = []
        self._waiting: dict[K, float] = {}
        self._active: set[K] = set()
        self._again: dict[K, float] = {}
        self._counter = 0
        self._closed = False
        UNFINISHED.set_function(lambda: self.running_seconds()[0])
        LONGEST.set_function(lambda: self.running_seconds()[1])
        self._cond = threading.Condition()
        self.coalesced = 0

    def add(self, key: K, delay: float | None = None) -> None:
        with self._cond:
            ADDS.inc()
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
            DEPTH.set(len(self._waiting))
            self._cond.notify()

    def add_after_failure(self, key: K) -> float:
        """Adds ``key`` back after its backoff; returns the delay."""
        with self._cond:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay: float = min(self.retry_base * 2.0 ** (failures - 1), self.retry_max)
            delay = max(delay, self._bucket.reserve())
        RETRIES.inc()
        self.add(key, delay=delay)
        return delay

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """``key`` reconciled: its next failure starts the backoff afresh."""
        with self._cond:
            self._failures.pop(key, None)

    def running_seconds(self) -> tuple[float, float]:
        """(all running reconciles together, the longest of them), in seconds."""
        now = self._clock()
        with self._cond:
            spans = [now - t for t in self._started.values()]
        return sum(spans), max(spans, default=0.0)

    def _promote(self, now: float) -> None:
        """Moves the keys that are due from the heap into their groups' turns."""
        while self._heap and self._heap[0][0] <= now:
            due, _, key = heapq.heappop(self._heap)
            if self._waiting.get(key) != due:
                continue  # superseded by an earlier due time
            group = self._group_of(key)
            if group not in self._ready:
                self._ready[group] = deque()
                self._turns.append(group)
            self._ready[group].append((due, key))

    def share(self) -> int | None:
        """Keys one group may hold running at once: the workers over the groups with work
        (due or running), one left for a newcomer when only one has work; None without
        ``workers``."""
        if self.workers <= 0:
            return None
        groups = len(set(self._ready) | set(self._running))
        return max(1, min(self.workers - 1, self.workers // max(1, groups)))

    def _next_ready(self) -> tuple[float, K] | None:
        share = self.share()
        for _ in range(len(self._turns)):
            group = self._turns.popleft()
            if share is not None and self._running.get(group, 0) >= share:
                self._turns.append(group)  # at its share: the others go first
                continue
            keys = self._ready[group]
            due, key = keys.popleft()
            if keys:
                self._turns.append(group)  # its next key waits for the other groups' turns
            else:
                del self._ready[group]
            self._running[group] = self._running.get(group, 0) + 1
            return due, key
        return None

    def get(self, timeout: float | None = None) -> K | None:
        """The next due key, or None when closed or after ``timeout`` seconds."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while not self._closed:
                now = self._clock()
                self._promote(now)
                ready = self._next_ready()
                if ready is not None:
                    due, key = ready
                    del self._waiting[key]
                    self._active.add(key)
                    self._started[key] = now
                    self._waited[key] = max(0.0, now - due)
                    DEPTH.set(len(self._waiting))
                    QUEUE_SECONDS.observe(self._waited[key])
                    return key
                while self._heap and self._waiting.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded by an earlier due time
                wait = self._heap[0][0] - now if self._heap else None
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)
            return None

    def waited(self, key: K) -> float:
        """Seconds the running ``key`` waited for a worker after it was due."""
        with self._cond:
            return self._waited.get(key, 0.0)

    def done(self, key: K) -> None:
        with self._cond:
            self._waited.pop(key, None)
            started = self._started.pop(key, None)
            if started is not None:
                WORK_SECONDS.observe(self._clock() - started)
            if key in self._active:
                self._active.discard(key)
                group = self._group_of(key)
                self._running[group] -= 1
                if not self._running[group]:
                    del self._running[group]
                self._cond.notify_all()  # a key held back at its group's share may go now
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
