"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does.

One thread per replica. Every ``retry_seconds`` (jittered) it reads the Lease: a free or
expired Lease is taken, the holder renews its own; every write carries the resourceVersion
it read, so two replicas never both win. Expiry is judged by this replica's own clock from
when it last saw the Lease change, never from the timestamps another machine wrote. A holder
that cannot renew within ``renew_deadline_seconds`` steps down before anyone else may take
over (``lease_seconds`` after its last renewal). ``release`` (on SIGTERM) hands the Lease
over at once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kimik3_operator.kube import Kube, KubeError

log = logging.getLogger(__name__)
API = "coordination.k8s.io/v1"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseElector:
    kube: Kube
    name: str
    namespace: str
    identity: str
    on_started: Callable[[], None]
    on_stopped: Callable[[], None]
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0
    clock: Callable[[], float] = time.monotonic
    random: Callable[[], float] = random.random
    leading: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _seen: tuple[str, float] = ("", 0.0)  # resourceVersion last seen, and when it changed
    _renewed: float = 0.0

    def start(self) -> None:
        threading.Thread(target=self._run, name="leader-election", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # the election must outlive any one bad answer
                log.exception("leader election on Lease %s/%s", self.namespace, self.name)
            self._stop.wait(self.retry_seconds * (1 + 0.2 * self.random()))

    def step(self) -> None:
        """One round: take, renew or wait; steps down when a renewal is overdue."""
        now = self.clock()
        try:
            lease = self.kube.get(API, "Lease", self.name, self.namespace)
            if lease is None:
                self._create()
            else:
                self._try(lease, now)
        except KubeError as exc:
            log.info("leader election on Lease %s/%s: %s", self.namespace, self.name, exc)
        if self.leading.is_set() and now - self._renewed > self.renew_deadline_seconds:
            log.warning(
                "could not renew Lease %s/%s in time: stepping down", self.namespace, self.name
            )
            self._lose()

    def _spec(self, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_seconds),
            "renewTime": _now(),
            "leaseTransitions": transitions,
        }
        if acquired is not None:
            spec["acquireTime"] = acquired
        return spec

    def _create(self) -> None:
        manifest = {
            "apiVersion": API,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(0, _now()),
        }
        try:
            self.kube.create(manifest)
        except KubeError as exc:
            if exc.status == 409:
                return  # another replica made it first
            raise
        self._win()

    def _try(self, lease: dict[str, Any], now: float) -> None:
        meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        version = str(meta.get("resourceVersion", ""))
        if version != self._seen[0]:
            self._seen = (version, now)
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            self._write(version, self._spec(transitions))
            self._renewed = now
            if not self.leading.is_set():
                self._win()
            return
        if self.leading.is_set():
            log.warning(
                "Lease %s/%s is held by %s now: stepping down", self.namespace, self.name, holder
            )
            self._lose()
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and now - self._seen[1] < duration:
            return  # held, and renewed within its duration as this replica has seen it
        self._write(version, self._spec(transitions + 1, _now()))
        self._renewed = now
        self._win()

    def _write(self, version: str, spec: dict[str, Any]) -> None:
        # The resourceVersion makes the patch conditional: a 409 if anyone wrote since.
        patch = {"metadata": {"resourceVersion": version}, "spec": spec}
        written = self.kube.patch(API, "Lease", self.name, self.namespace, patch)
        self._seen = (str((written.get("metadata") or {}).get("resourceVersion", "")), self.clock())

    def _win(self) -> None:
        if not self.leading.is_set():
            self._renewed = self.clock()
            self.leading.set()
            log.info("leading: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)
            self.on_started()

    def _lose(self) -> None:
        self.leading.clear()
        self.on_stopped()

    def release(self) -> None:
        """Stops, and if leading, frees the Lease for the next replica at once."""
        self._stop.set()
        if not self.leading.is_set():
            return
        self._lose()
        try:
            lease = self.kube.get(API, "Lease", self.name, self.namespace)
            spec = (lease or {}).get("spec") or {}
            if lease is not None and spec.get("holderIdentity") == self.identity:
                version = str(lease["metadata"].get("resourceVersion", ""))
                free = {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now()}
                self.kube.patch(
                    API,
                    "Lease",
                    self.name,
                    self.namespace,
                    {"metadata": {"resourceVersion": version}, "spec": free},
                )
                log.info("released Lease %s/%s", self.namespace, self.name)
        except KubeError as exc:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)
