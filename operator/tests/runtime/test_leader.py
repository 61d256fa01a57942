"""Leader election on a Lease: exactly one leader, takeover only after the lease expires as
the follower has seen it, handover at once on release, and no write after leadership is lost."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from conftest import FakeKube
from kimik3_operator.kube import KubeError
from kimik3_operator.runtime.leader import LeaseElector
from kimik3_operator.runtime.store import NotLeaderError, Store, StoreKube


class LeaseApi:
    """The Lease endpoints with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise KubeError(503, "Service Unavailable", "{}")

    def get(self, *_: Any) -> dict[str, Any] | None:
        self._check()
        return copy.deepcopy(self.lease)

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        self._check()
        if self.lease is not None:
            raise KubeError(409, "Conflict", "{}")
        self.version += 1
        self.lease = {
            **copy.deepcopy(dict(manifest)),
            "metadata": {"resourceVersion": str(self.version)},
        }
        return copy.deepcopy(self.lease)

    def patch(self, _api: str, _kind: str, _name: str, _ns: str, patch: Mapping[str, Any]) -> Any:
        self._check()
        assert self.lease is not None
        if patch["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "{}")
        self.version += 1
        self.lease["spec"].update(patch["spec"])
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def elector(api: LeaseApi, clock: Clock, identity: str, log: list[str]) -> LeaseElector:
    return LeaseElector(
        api,  # type: ignore[arg-type]
        "kimik3-operator",
        "kimik3-system",
        identity,
        on_started=lambda: log.append(f"{identity} leads"),
        on_stopped=lambda: log.append(f"{identity} stops"),
        lease_seconds=12,
        renew_deadline_seconds=8,
        retry_seconds=1.5,
        clock=clock,
    )


def test_exactly_one_leads_and_a_dead_leader_is_replaced_after_the_lease() -> None:
    api, clock, log = LeaseApi(), Clock(), []
    a, b = elector(api, clock, "a", log), elector(api, clock, "b", log)
    for _ in range(5):
        a.step()
        b.step()
        clock.now += 1.5
    assert log == ["a leads"] and a.leading.is_set() and not b.leading.is_set()
    # a is killed: it renews no more. b takes over only once the Lease has not changed for
    # its duration, by b's own clock.
    died = clock.now
    while not b.leading.is_set():
        b.step()
        clock.now += 1.5
    assert 12 <= clock.now - died <= 12 + 1.5 + 1.5
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1


def test_release_hands_over_at_the_next_step() -> None:
    api, clock, log = LeaseApi(), Clock(), []
    a, b = elector(api, clock, "a", log), elector(api, clock, "b", log)
    a.step()
    b.step()
    a.release()
    assert log == ["a leads", "a stops"]
    clock.now += 1.5
    b.step()
    assert b.leading.is_set(), "the released Lease is free: no wait for its duration"


def test_a_leader_that_cannot_renew_steps_down_before_anyone_may_take_over() -> None:
    api, clock, log = LeaseApi(), Clock(), []
    a = elector(api, clock, "a", log)
    a.step()
    api.down = True
    while a.leading.is_set():
        clock.now += 1.5
        a.step()
    assert 8 <= clock.now <= 8 + 1.5, "within the renew deadline, before the 12 s lease ends"
    assert log == ["a leads", "a stops"]


def test_a_racing_takeover_has_one_winner() -> None:
    api, clock, log = LeaseApi(), Clock(), []
    a, b = elector(api, clock, "a", log), elector(api, clock, "b", log)
    a.step()
    b.step()
    a.release()
    c = elector(api, clock, "c", log)
    c.step()
    b.step()
    holders = [e.identity for e in (b, c) if e.leading.is_set()]
    assert len(holders) == 1


class RacingLeaseApi(LeaseApi):
    """Both electors read the Lease before either writes (a barrier in ``get``); the write
    checks the resourceVersion and bumps it atomically, as etcd does."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=5)
        self.lock = threading.Lock()
        self.conflicts = 0

    def get(self, *args: Any) -> dict[str, Any] | None:
        found = super().get(*args)
        self.barrier.wait()
        return found

    def patch(self, *args: Any) -> Any:
        with self.lock:
            try:
                return super().patch(*args)
            except KubeError:
                self.conflicts += 1
                raise


def test_two_electors_that_read_the_same_version_cannot_both_take_the_lease() -> None:
    """An expired Lease read by two replicas at once: both write against the version they
    read, the API server takes one, the other gets 409 and does not lead."""
    api, clock, log = RacingLeaseApi(parties=2), Clock(), []
    api.lease = {
        "metadata": {"resourceVersion": "7"},
        "spec": {"holderIdentity": "gone", "leaseDurationSeconds": 12, "leaseTransitions": 3},
    }
    api.version = 7
    a, b = elector(api, clock, "a", log), elector(api, clock, "b", log)
    for racer in (a, b):
        racer._seen = ("7", -100.0)  # both saw the Lease unrenewed for longer than it lasts
    threads = [threading.Thread(target=racer.step) for racer in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    leaders = [e.identity for e in (a, b) if e.leading.is_set()]
    assert len(leaders) == 1 and api.conflicts == 1
    assert api.lease["spec"]["holderIdentity"] == leaders[0]
    assert api.lease["spec"]["leaseTransitions"] == 4


def test_no_write_leaves_a_replica_that_lost_leadership() -> None:
    kube = StoreKube(FakeKube(), Store())
    leading = [True]
    kube.may_write = lambda: leading[0]
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "a"},
    }
    kube.apply(manifest)
    leading[0] = False
    with pytest.raises(NotLeaderError):
        kube.apply(manifest)
    with pytest.raises(NotLeaderError):
        kube.patch_status("v1", "ConfigMap", "x", "a", {})
