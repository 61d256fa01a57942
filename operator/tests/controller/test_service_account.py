"""spec.pod.serviceAccountName: used only when the operator's settings list the account, and
refused, naming the allowed ones, before any child otherwise."""

from __future__ import annotations

import pytest
from decide_support import LWS, said, snapshot

from kimik3_operator.config import Settings, SettingsError
from kimik3_operator.controller.decide import decide

ACCOUNT = {"pod": {"serviceAccountName": "weights-reader"}}


def test_an_allowed_account_runs_the_pods_without_a_token() -> None:
    decision = decide(snapshot(ACCOUNT, service_accounts=("weights-reader",)))
    made = next(w for w in decision.writes if w.ref == LWS)
    pod = made.body["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert pod["serviceAccountName"] == "weights-reader"
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("allowed", [(), ("deployer",)])
def test_another_account_is_refused_before_any_child(allowed: tuple[str, ...]) -> None:
    decision = decide(snapshot(ACCOUNT, service_accounts=allowed))
    assert decision.writes == ()
    assert said(decision, "Degraded") == ("True", "ServiceAccountNotAllowed")
    message = next(x for x in decision.status["conditions"] if x["type"] == "Degraded")["message"]
    assert "'weights-reader'" in message and (", ".join(allowed) or "none") in message


def test_the_setting_lists_names_and_refuses_one_that_is_not() -> None:
    settings = Settings.from_env({"KIMIK3_SERVICE_ACCOUNTS": "a, b.c"})
    assert settings.service_accounts == ("a", "b.c")
    with pytest.raises(SettingsError, match="KIMIK3_SERVICE_ACCOUNTS"):
        Settings.from_env({"KIMIK3_SERVICE_ACCOUNTS": "a,B_C"})
