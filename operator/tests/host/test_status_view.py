from __future__ import annotations

from kimik3_operator.status_view import bar, render_status


def test_bars_scale_with_the_value() -> None:
    assert bar(1.0, 10) == "█" * 10
    assert bar(0.0, 10) == " " * 10
    assert bar(0.55, 10).startswith("█████▌")


def test_status_shows_conditions_and_positions() -> None:
    body = {
        "metadata": {"name": "k3", "namespace": "llm"},
        "status": {
            "replicas": 1,
            "readyReplicas": 1,
            "nodesPerReplica": 2,
            "endpoint": "http://k3:8000",
            "conditions": [
                {"type": "Available", "status": "True", "reason": "Available", "message": "1 of 1"}
            ],
            "speculative": {
                "method": "dspark",
                "drafter": "RedHatAI/x",
                "acceptanceRate": 0.7,
                "meanAcceptanceLength": 6.6,
                "perPositionAcceptance": [0.95, 0.3],
                "sampledAt": "t",
            },
        },
    }
    shown = render_status(body)
    assert "Available  True    Available: 1 of 1" in shown
    assert "acceptance rate 70.0%" in shown and "mean acceptance length 6.60" in shown
    assert "    0 " + "█" * 38 in shown and "95.0%" in shown
    assert "    1 " + "█" * 12 in shown


def test_idle_status_says_no_data() -> None:
    shown = render_status(
        {
            "metadata": {"name": "k3", "namespace": "llm"},
            "status": {"speculative": {"method": "dspark"}},
        }
    )
    assert "no data" in shown


def test_status_shows_the_canary_against_the_stable_groups() -> None:
    body = {
        "metadata": {"name": "k3", "namespace": "llm"},
        "status": {
            "rollout": {
                "phase": "RolledBack",
                "canaryGroups": [1],
                "window": "15m",
                "change": "drafter.method: draft_model -> eagle3",
                "canaryAcceptance": 0.02,
                "stableAcceptance": 0.98,
                "decision": "RolledBack",
                "decidedAt": "2026-12-04T02:00:00Z",
                "message": "canary acceptance 0.020 over 900s is below the bar 0.5",
            }
        },
    }
    text = render_status(body)
    assert "Rollout: RolledBack  canary group(s) 1  window 15m" in text
    assert "change: drafter.method: draft_model -> eagle3" in text
    assert "canary " in text and "  2.0%" in text and " 98.0%" in text
    assert "decision: RolledBack at 2026-12-04T02:00:00Z" in text
