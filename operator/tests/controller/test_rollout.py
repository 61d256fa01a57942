"""The acceptance-gated rollout: the canary's verdict as a table, the state machine's steps,
and the reconcile driving the LeaderWorkerSet's partition over a recording fake API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import FakeKube, key_of, resource
from kimik3_operator.api import constants as c
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.types import CanarySpec, SpecError
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.observation.acceptance import (
    Acceptance,
    AcceptanceReading,
    LeaderSeries,
    Snapshot,
)
from kimik3_operator.observation.canary import (
    COMPLETE,
    Evidence,
    Inputs,
    Track,
    describe_change,
    groups_on,
    judge,
    plan,
    stable_of,
    track,
)
from kimik3_operator.observation.readings import Readings

WINDOW = 60.0
READY = Evidence(canary_ready=True, all_updated=False)


def _judge(evidence: Evidence, since_ready: float | None = 90.0, **kw: Any) -> tuple[str, str]:
    args: dict[str, Any] = {
        "bar": 0.5,
        "max_drop": 0.1,
        "speculative": True,
        "since_start": 200.0,
        "since_ready": since_ready,
        "window": WINDOW,
        "ready_timeout": 600.0,
    }
    args.update(kw)
    verdict = judge(evidence, **args)
    return verdict.decision, verdict.message


def _ev(canary: float | None, stable: float | None = 0.8, span: float = 60.0) -> Evidence:
    return Evidence(
        canary_ready=True,
        all_updated=False,
        canary=Track(canary, 100.0 if canary is not None else 0.0, span),
        stable=None if stable == -1 else Track(stable, 100.0, span),
    )


@pytest.mark.parametrize(
    ("evidence", "kwargs", "decision", "says"),
    [
        # A canary pod that fails to start fails the canary at once, with its line.
        (
            Evidence(False, False, failure="pod k3-1 exited 1 (StartupFailed): boom"),
            {"since_ready": None},
            "Fail",
            "boom",
        ),
        # Not Ready yet, within the timeout: wait; past it: fail.
        (Evidence(False, False), {"since_ready": None}, "Wait", "become Ready"),
        (
            Evidence(False, False),
            {"since_ready": None, "since_start": 601.0},
            "Fail",
            "readyTimeout",
        ),
        # Ready, but the window is not over.
        (_ev(0.9), {"since_ready": 30.0}, "Wait", "30s of 60s"),
        # No drafter: Ready for the whole window is enough.
        (Evidence(True, False), {"speculative": False}, "Promote", "no drafter"),
        # No drafts on the canary: no verdict without traffic.
        (_ev(None), {}, "Wait", "waits for traffic"),
        # Samples that do not yet cover the window (an operator restart): wait.
        (_ev(0.9, span=20.0), {}, "Wait", "cover 20s"),
        # Below the bar: fail, with the numbers.
        (_ev(0.02, 0.98), {}, "Fail", "0.020"),
        # Above the bar, but more than maxAcceptanceDrop below the stable groups.
        (_ev(0.6, 0.9), {}, "Fail", "33% below"),
        # Within the drop allowed.
        (_ev(0.85, 0.9), {}, "Promote", "meets the bar 0.5"),
        # Better than the stable groups (which fail the bar themselves): promote.
        (_ev(1.0, 0.0), {}, "Promote", "stable groups 0.000"),
        # The stable groups idle: judged against the bar alone.
        (_ev(0.7, None), {}, "Promote", "stable groups none"),
        # One group: nothing to compare with; the bar alone decides.
        (_ev(0.7, -1), {}, "Promote", "no stable groups"),
        (_ev(0.3, -1), {}, "Fail", "no stable groups"),
    ],
)
def test_the_canary_verdict(
    evidence: Evidence, kwargs: dict[str, Any], decision: str, says: str
) -> None:
    got, message = _judge(evidence, **kwargs)
    assert (got, says in message) == (decision, True), message


CANARY = CanarySpec(groups=1, window="60s")


def _inputs(**kw: Any) -> Inputs:
    args: dict[str, Any] = {
        "canary": CANARY,
        "replicas": 3,
        "desired_hash": "new",
        "stable_hash": "old",
        "record": {},
        "evidence": Evidence(False, False),
        "now": 1_000_000.0,
        "bar": 0.5,
        "speculative": True,
        "change": "drafter.method: dspark -> eagle3",
    }
    args.update(kw)
    return Inputs(**args)


def test_a_change_starts_a_canary_on_the_highest_group() -> None:
    step = plan(_inputs())
    assert (step.use_stable, step.partition, step.promote) == (False, 2, False)
    assert step.section is not None
    assert step.section["phase"] == "Canary" and step.section["canaryGroups"] == [2]
    assert step.condition is not None and step.condition.status == "Unknown"
    assert "dspark -> eagle3" in step.condition.message


def test_the_canary_waits_then_is_promoted() -> None:
    started = plan(_inputs()).section
    assert started is not None
    ready = plan(_inputs(record=started, evidence=READY, now=1_000_010.0))
    assert ready.section is not None and ready.partition == 2 and not ready.promote
    assert ready.section["observingSince"] == "1970-01-12T13:46:50Z"
    done = plan(_inputs(record=ready.section, evidence=_ev(0.95, 0.9), now=1_000_010.0 + WINDOW))
    assert (done.partition, done.promote, done.use_stable) == (0, True, False)
    assert done.section is not None and done.section["phase"] == "Promoting"
    assert done.section["canaryAcceptance"] == 0.95 and done.section["stableAcceptance"] == 0.9
    assert done.condition is not None and done.condition.reason == "CanaryPromoted"
    # Promoted: the spec is the stable one, promoting until every group runs it.
    after = plan(_inputs(stable_hash="new", record=done.section))
    assert after.section is not None and after.section["phase"] == "Promoting"
    complete = plan(_inputs(stable_hash="new", record=done.section, evidence=Evidence(True, True)))
    assert complete.section is not None and complete.section["phase"] == COMPLETE


def test_a_failing_canary_is_rolled_back_and_the_change_refused() -> None:
    started = plan(_inputs()).section
    ready = plan(_inputs(record=started, evidence=READY)).section
    failed = plan(_inputs(record=ready, evidence=_ev(0.02, 0.97), now=1_000_000.0 + WINDOW))
    assert (failed.use_stable, failed.partition, failed.promote) == (True, 0, False)
    assert failed.section is not None
    assert failed.section["phase"] == "RolledBack" and failed.section["refusedHash"] == "new"
    assert failed.condition is not None and failed.condition.status == "False"
    assert failed.condition.reason == "CanaryRolledBack"
    message = failed.condition.message
    assert "0.020" in message and "0.970" in message and "dspark -> eagle3" in message
    # The refused spec stays refused: the stable pods, with no new condition.
    again = plan(_inputs(record=failed.section, now=1_000_500.0))
    assert (again.use_stable, again.partition, again.condition) == (True, 0, None)
    # Reverting the spec settles it; a new change starts a new canary.
    reverted = plan(_inputs(desired_hash="old", record=failed.section))
    assert reverted.section is not None and reverted.section["phase"] == COMPLETE
    assert "refusedHash" not in reverted.section
    other = plan(_inputs(desired_hash="newer", record=failed.section))
    assert other.section is not None and other.section["phase"] == "Canary"
    assert other.partition == 2


def test_hold_keeps_the_canary_groups_as_they_are() -> None:
    held_spec = CanarySpec(groups=2, window="60s", on_failure="Hold")
    started = plan(_inputs(canary=held_spec)).section
    ready = plan(_inputs(canary=held_spec, record=started, evidence=READY)).section
    held = plan(
        _inputs(canary=held_spec, record=ready, evidence=_ev(0.1), now=1_000_000.0 + WINDOW)
    )
    assert (held.use_stable, held.partition, held.promote) == (False, 1, False)
    assert held.section is not None and held.section["phase"] == "Held"
    assert held.condition is not None and held.condition.reason == "CanaryHeld"
    still = plan(_inputs(canary=held_spec, record=held.section, now=1_002_000.0))
    assert (still.partition, still.condition) == (1, None)


def test_without_a_canary_the_change_goes_to_every_group() -> None:
    step = plan(_inputs(canary=None))
    assert (step.use_stable, step.partition, step.promote, step.section) == (False, 0, True, None)


def test_a_single_group_is_its_own_canary() -> None:
    step = plan(_inputs(replicas=1))
    assert step.partition == 0 and step.section is not None
    assert step.section["canaryGroups"] == [0]


def test_no_stable_spec_recorded_takes_the_spec_as_stable() -> None:
    step = plan(_inputs(stable_hash=None))
    assert (step.use_stable, step.partition, step.promote, step.section) == (False, 0, True, None)


def _snap(at: float, drafts: float, tokens: float, accepted: float) -> Snapshot:
    return Snapshot(at, drafts, tokens, accepted)


def test_a_track_sums_the_leaders_of_one_template_since_a_moment() -> None:
    series = [
        LeaderSeries(
            "1", "new", (_snap(0, 0, 0, 0), _snap(10, 10, 30, 3), _snap(70, 110, 330, 33))
        ),
        LeaderSeries("0", "old", (_snap(0, 0, 0, 0), _snap(70, 100, 300, 290))),
    ]
    canary = track(series, "new", since=10)
    assert canary.rate == pytest.approx(0.1) and canary.drafts == 100 and canary.span == 60
    stable = track(series, "old", since=10)
    assert stable.rate == pytest.approx(290 / 300) and stable.span == 70
    assert track(series, "", since=10).rate is None


def _pod(group: int, template: str, ready: bool = True, name: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name or f"k3-{group}",
            "uid": f"uid-{group}-{template}",
            "labels": {c.LWS_GROUP_INDEX_LABEL: str(group), c.TEMPLATE_HASH_LABEL: template},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_groups_on_a_template_need_every_pod_ready_on_it() -> None:
    pods = [_pod(0, "old"), _pod(1, "new"), _pod(2, "new", ready=False), _pod(3, "new")]
    pods.append(_pod(3, "old", name="k3-3-1"))  # a worker still on the old pods
    assert groups_on(pods, "new", 1) == {1}
    assert groups_on(pods, "old", 1) == {0}


def test_the_change_names_fields_and_never_env_values() -> None:
    old = {"replicas": 2, "drafter": {"method": "dspark"}, "engine": {"env": [{"value": "s"}]}}
    new = {"replicas": 3, "drafter": {"method": "eagle3"}, "engine": {"env": [{"value": "t"}]}}
    text = describe_change(old, new)
    assert text == "drafter.method: dspark -> eagle3; engine.env changed"
    assert "replicas" not in text and "t" not in text.split("; ")[1].replace("changed", "")


def test_a_stable_spec_that_does_not_parse_is_no_stable_spec() -> None:
    def lws(text: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {c.STABLE_SPEC_ANNOTATION: text}}}

    assert stable_of(lws("not json")) is None
    assert stable_of(lws(json.dumps({"spec": {"replicas": "many"}}))) is None
    assert stable_of(lws(json.dumps([1]))) is None
    ok = stable_of(lws(json.dumps({"spec": {"replicas": 2}, "weightBytes": 7})))
    assert ok is not None and ok.spec.replicas == 2 and ok.weight_bytes == 7


@pytest.mark.parametrize(
    ("canary", "field"),
    [
        ({"groups": 0}, "groups"),
        ({"window": "15 minutes"}, "window"),
        ({"readyTimeout": "1s2m"}, "readyTimeout"),
        ({"minAcceptanceRate": 1.5}, "minAcceptanceRate"),
        ({"maxAcceptanceDrop": -0.1}, "maxAcceptanceDrop"),
        ({"onFailure": "Retry"}, "onFailure"),
    ],
)
def test_a_bad_canary_names_its_field(canary: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"rollout": {"canary": canary}})
    assert f"spec.rollout.canary.{field}" in str(err.value)


def test_canary_defaults() -> None:
    canary = parse_spec({"rollout": {"canary": {}}}).rollout.canary
    assert canary == CanarySpec()
    assert (canary.window_seconds, canary.ready_timeout_seconds) == (900.0, 1800.0)
    assert parse_spec({}).rollout.canary is None


# The reconcile, over the recording fake API.

LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
KIND = ("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")


def _serving_pods(kube: FakeKube, groups: dict[int, str]) -> None:
    """The leader pod of each group, Ready, made from the given template hash."""
    for group, template in groups.items():
        pod = _pod(group, template)
        pod.update(apiVersion="v1", kind="Pod")
        pod["metadata"].update(namespace="llm")
        pod["metadata"]["labels"].update(
            {
                c.LABEL_INSTANCE: "k3",
                c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
                c.LABEL_COMPONENT: c.COMPONENT_LEADER,
            }
        )
        kube.put(pod)


def _template(kube: FakeKube) -> str:
    lws = kube.get(*LWS)
    assert lws is not None
    labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    return str(labels[c.TEMPLATE_HASH_LABEL])


def _partition(kube: FakeKube) -> int:
    lws = kube.get(*LWS)
    assert lws is not None
    return int(lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"])


def _reading(at: float, series: dict[str, LeaderSeries]) -> Readings:
    acceptance = Acceptance(None, None, None, 0.0, False)
    return Readings(acceptance=AcceptanceReading(acceptance, at, 300.0, series=series))


def _change(kube: FakeKube, **spec: Any) -> None:
    body = kube.get(*KIND)
    assert body is not None
    body["spec"].update(spec)
    body["metadata"]["generation"] += 1
    kube.put(body)


def test_the_reconcile_rolls_a_bad_change_back_on_the_canary_group_only(
    kube: FakeKube,
) -> None:
    rollout = {"canary": {"window": "60s"}}
    body = resource(replicas=2, rollout=rollout, parallelism={"tensor": 8})
    kube.put(body)
    t0 = 1_000_000.0
    reconcile(kube, key_of(body), Context(seconds=lambda: t0))
    old = _template(kube)
    assert _partition(kube) == 0
    _serving_pods(kube, {0: old, 1: old})
    # The change: another speculative token count.
    _change(kube, drafter={"numSpeculativeTokens": 3}, rollout=rollout)
    reconcile(kube, key_of(body), Context(seconds=lambda: t0 + 10))
    new = _template(kube)
    assert new != old and _partition(kube) == 1
    stable = stable_of(kube.get(*LWS))
    assert stable is not None and stable.spec.drafter.num_speculative_tokens is None
    status = (kube.get(*KIND) or {})["status"]
    assert status["speculative"]["numSpeculativeTokens"] == 3
    assert status["rollout"]["phase"] == "Canary" and status["rollout"]["canaryGroups"] == [1]
    assert "drafter.numSpeculativeTokens: unset -> 3" in status["rollout"]["change"]
    # LWS updates group 1; it becomes Ready on the new pods.
    _serving_pods(kube, {1: new})
    reconcile(kube, key_of(body), Context(seconds=lambda: t0 + 20))
    status = (kube.get(*KIND) or {})["status"]
    assert status["rollout"]["observingSince"] and _partition(kube) == 1
    # Over the window the canary accepts 5%, the stable group 90%.
    series = {
        "uid-1-new": LeaderSeries(
            "1", new, (_snap(t0 + 20, 0, 0, 0), _snap(t0 + 80, 100, 300, 15))
        ),
        "uid-0-old": LeaderSeries(
            "0", old, (_snap(t0 + 20, 0, 0, 0), _snap(t0 + 80, 100, 300, 270))
        ),
    }
    kube.writes.clear()
    result = reconcile(
        kube, key_of(body), Context(seconds=lambda: t0 + 81, readings=_reading(t0 + 81, series))
    )
    # Rolled back: the old pods on every group, partition 0; group 0's template never moved.
    assert _template(kube) == old and _partition(kube) == 0
    status = (kube.get(*KIND) or {})["status"]
    assert status["rollout"]["phase"] == "RolledBack"
    assert status["rollout"]["canaryAcceptance"] == 0.05
    assert status["rollout"]["stableAcceptance"] == 0.9
    condition = next(x for x in status["conditions"] if x["type"] == "CanaryVerified")
    assert (condition["status"], condition["reason"]) == ("False", "CanaryRolledBack")
    assert "CanaryVerified=False/CanaryRolledBack" in result.events
    # The status describes what the groups run: the stable spec (the paired drafter's 8
    # tokens), not the refused one's 3.
    assert status["speculative"]["numSpeculativeTokens"] == 8
    events = [w for w in kube.writes if w[0] == "create" and "Event" in str(w)]
    assert events, kube.writes
    # Another reconcile with nothing new writes nothing.
    _serving_pods(kube, {1: old})
    reconcile(kube, key_of(body), Context(seconds=lambda: t0 + 90))
    kube.writes.clear()
    reconcile(kube, key_of(body), Context(seconds=lambda: t0 + 95))
    assert kube.writes == []


def test_scaling_is_no_change_of_the_pods(kube: FakeKube) -> None:
    rollout = {"canary": {}}
    body = resource(replicas=2, rollout=rollout, parallelism={"tensor": 8})
    kube.put(body)
    reconcile(kube, key_of(body), Context())
    before = _template(kube)
    _change(kube, replicas=4)
    reconcile(kube, key_of(body), Context())
    assert _template(kube) == before and _partition(kube) == 0
    assert "rollout" not in ((kube.get(*KIND) or {}).get("status") or {})
