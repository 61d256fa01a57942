from __future__ import annotations

from kimik3_operator.api.conditions import Condition, changed, find, set_condition

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def test_new_condition_gets_the_current_time() -> None:
    result = set_condition([], Condition("Available", "False", "NoGroupReady", "0 of 1"), 3, T0)
    assert result == [
        {
            "type": "Available",
            "status": "False",
            "reason": "NoGroupReady",
            "message": "0 of 1",
            "lastTransitionTime": T0,
            "observedGeneration": 3,
        }
    ]


def test_transition_time_moves_only_when_status_changes() -> None:
    first = set_condition([], Condition("Available", "False", "NoGroupReady", "0 of 1"), 1, T0)
    same_status = set_condition(
        first, Condition("Available", "False", "PodCrashLooping", "crash"), 2, T1
    )
    assert find(same_status, "Available") == {
        "type": "Available",
        "status": "False",
        "reason": "PodCrashLooping",
        "message": "crash",
        "lastTransitionTime": T0,
        "observedGeneration": 2,
    }
    flipped = set_condition(same_status, Condition("Available", "True", "Available", "ok"), 2, T1)
    found = find(flipped, "Available")
    assert found is not None
    assert found["lastTransitionTime"] == T1


def test_other_conditions_are_kept_in_order() -> None:
    start = set_condition([], Condition("Progressing", "True", "GroupsStarting", ""), 1, T0)
    start = set_condition(start, Condition("Degraded", "False", "AsExpected", ""), 1, T0)
    updated = set_condition(start, Condition("Progressing", "False", "Available", ""), 1, T1)
    assert [c["type"] for c in updated] == ["Progressing", "Degraded"]
    assert updated[1] == start[1]


def test_changed_sees_reason_and_message_too() -> None:
    current = set_condition([], Condition("Degraded", "False", "AsExpected", "fine"), 1, T0)
    assert not changed(current, Condition("Degraded", "False", "AsExpected", "fine"))
    assert changed(current, Condition("Degraded", "False", "AsExpected", "other"))
    assert changed(current, Condition("Degraded", "True", "PodOOMKilled", "fine"))
    assert changed(current, Condition("Available", "True", "Available", ""))
