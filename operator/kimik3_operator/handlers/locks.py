"""One reconcile or status write at a time per resource: the queue's workers and the
acceptance scraper run in several threads."""

from __future__ import annotations

import threading

_locks: dict[tuple[str, str], threading.Lock] = {}
_guard = threading.Lock()


def lock_for(namespace: str, name: str) -> threading.Lock:
    with _guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def forget_lock(namespace: str, name: str) -> None:
    with _guard:
        _locks.pop((namespace, name), None)
