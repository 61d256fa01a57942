"""The namespaces' labels (their Pod Security levels), read from the API server and kept a
while: a reconcile asks at every pass, the server is asked at most once per TTL a namespace.
Without a watch, so the operator needs only ``get`` on namespaces; a relabel is seen within
the TTL, at the next reconcile (the periodic resync at the latest)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from kimik3_operator.kube import Kube, namespace_labels_from_server

TTL_SECONDS = 30.0
# Entries past their TTL are dropped once the map holds this many.
TRIM_AT = 1024


class NamespaceLabels:
    def __init__(
        self, ttl: float = TTL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, Mapping[str, str] | None]] = {}

    def __call__(self, kube: Kube, namespace: str) -> Mapping[str, str] | None:
        now = self.clock()
        with self._lock:
            found = self._known.get(namespace)
        if found is not None and now - found[0] < self.ttl:
            return found[1]
        # A namespace that cannot be read is kept too: a refused read is not retried at
        # every reconcile.
        labels = namespace_labels_from_server(kube, namespace)
        with self._lock:
            if len(self._known) >= TRIM_AT:
                self._known = {k: v for k, v in self._known.items() if now - v[0] < self.ttl}
            self._known[namespace] = (now, labels)
        return labels
