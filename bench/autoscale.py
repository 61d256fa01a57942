"""The operator's autoscaling against a plain ScaledObject on the same signal, side by side in
one run, over the same load ramp, drafter collapse and start-up lull.

Both run the same model of what happens between KEDA and the groups, second by second:

- the load: requests arrive at a rate the scenario sets; each Ready group runs SLOTS requests
  at once, each for SERVICE_SECONDS while its drafter is healthy and COLLAPSE_SLOWDOWN times
  longer after the acceptance collapsed (each token then costs several verification passes);
  what finds no slot waits, and ``vllm:num_requests_waiting`` summed over the leaders is the
  trigger's value;
- the HPA of kube-controller-manager as Kubernetes computes it (a model: the replica
  calculator's ceil(value / target) for an AverageValue external metric with its 10 %
  tolerance, every 15 s, the stabilization windows as the largest (scale-down) or smallest
  (scale-up) recommendation over the window, the default scale-up policy of 4 pods or 100 %
  per 15 s, a Disabled policy while KEDA's paused-scale-out/-in annotation is set);
- a group takes START_SECONDS from being made to Ready (Kimi-K3 from the model cache on two
  nodes); the cluster has GPUs for GPU_GROUPS groups, and a group beyond them waits Pending.

"plain" is what the anchors render: a ScaledObject with the same trigger and threshold, KEDA's
defaults otherwise (the HPA's 300 s scale-down window and its default policies), every
replica the HPA asks for made at once. "ours" is the operator's own code: the ScaledObject's
windows from ``builders/scaled_object.py`` and, at every step, ``scaling_plan`` from
``controller/autoscaling.py`` deciding which groups are made and which directions are held.

Printed per scenario and per side: seconds from the queue first crossing the target to the
first new group asked for (for ours, held while the drafter is broken), groups made while
the drafter was collapsed, groups removed while still starting (a start-up thrown away),
group-seconds spent Pending for want of GPUs, and the peak of groups asked for. Prints
figures; asserts nothing.

    .venv/bin/python bench/autoscale.py
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.scaled_object import scale_down_window
from kimik3_operator.controller.autoscaling import ScalingInput, ScalingPlan, scaling_plan

SLOTS = 16  # requests a group runs at once
SERVICE_SECONDS = 10.0  # per request, with a healthy drafter
COLLAPSE_SLOWDOWN = 3.0
MU = SLOTS / SERVICE_SECONDS  # requests a healthy group finishes per second
START_SECONDS = 1750  # builders/health_checks.py: 900 + 1.7 TB / 2 nodes / 1 GB/s
GPU_GROUPS = 4
TARGET = 8  # waiting requests per group
SYNC = 15  # the HPA's sync period
TOLERANCE = 0.1
PLAIN_DOWN_WINDOW = 300
SPEC = parse_spec(
    {
        "parallelism": {"tensor": 16},
        "model": {"cache": {"size": "2Ti"}},
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 8,
            "target": {"waitingRequestsPerGroup": TARGET},
        },
    }
)
OURS_DOWN_WINDOW = scale_down_window(SPEC, 1_700_000_000_000)
MAX_REPLICAS = 8


@dataclass
class Group:
    made: int
    ready_at: int
    pending: bool = False


@dataclass
class Side:
    name: str
    ours: bool
    down_window: int
    replicas: int = 1  # spec.replicas, as the HPA writes it
    min_replicas: int = 1
    groups: list[Group] = field(default_factory=list)
    in_system: float = 0.0
    waiting: float = 0.0
    recommendations: list[tuple[int, int]] = field(default_factory=list)
    # Figures
    crossed: int | None = None
    first_request: int | None = None
    bought_in_collapse: int = 0
    removed_starting: int = 0
    pending_seconds: int = 0
    peak: int = 1

    def ready(self, now: int) -> int:
        return sum(1 for g in self.groups if not g.pending and g.ready_at <= now)


def hpa(side: Side, now: int, value: float, pause_out: bool, pause_in: bool) -> None:
    """One sync of the HPA on an AverageValue external metric."""
    current = side.replicas
    ratio = value / (TARGET * max(current, 1))
    wanted = (
        current
        if abs(ratio - 1) <= TOLERANCE
        else max(side.min_replicas, math.ceil(value / TARGET))
    )
    wanted = min(wanted, MAX_REPLICAS)
    side.recommendations.append((now, wanted))
    window = [w for t, w in side.recommendations if t > now - side.down_window]
    side.recommendations = [(t, w) for t, w in side.recommendations if t > now - 3600]
    if wanted < current:
        wanted = max(window)  # scale-down stabilization: the largest over the window
        if pause_in:
            wanted = current
        elif side.ours:
            wanted = max(wanted, current - 1)  # one group per period (policy)
    elif wanted > current:
        wanted = current if pause_out else min(wanted, max(current * 2, current + 4))
    side.replicas = wanted


def plan_for(side: Side, now: int, collapsed: bool) -> ScalingPlan:
    """The operator's decision for this side's state (its own code)."""
    placed = sum(1 for g in side.groups if not g.pending)
    scaling = dataclasses.replace(SPEC.autoscaling, min_replicas=side.min_replicas)
    return scaling_plan(
        dataclasses.replace(SPEC, replicas=side.replicas, autoscaling=scaling),
        ScalingInput(
            live_replicas=len(side.groups),
            ready_replicas=side.ready(now),
            keda_installed=True,
            acceptance_collapsed=collapsed,
            pods_that_fit=(GPU_GROUPS - placed) * SPEC.nodes_per_replica,
            free_gpus=(GPU_GROUPS - placed) * SPEC.gpus_per_replica,
        ),
    )


def step(side: Side, now: int, arrivals: float, collapsed: bool) -> None:
    service = SERVICE_SECONDS * (COLLAPSE_SLOWDOWN if collapsed else 1.0)
    running = min(side.in_system, side.ready(now) * SLOTS)
    side.in_system = max(0.0, side.in_system + arrivals - running / service)
    side.waiting = max(0.0, side.in_system - side.ready(now) * SLOTS)
    pause_out = pause_in = False
    if side.ours:
        held = plan_for(side, now, collapsed)
        pause_out, pause_in = held.pause_scale_out, held.pause_scale_in
    if side.crossed is None and side.waiting > TARGET * side.replicas * (1 + TOLERANCE):
        side.crossed = now
    if now % SYNC == 0:
        before = side.replicas
        hpa(side, now, side.waiting, pause_out, pause_in)
        if side.replicas > before and side.first_request is None:
            side.first_request = now
    accepted = plan_for(side, now, collapsed).replicas if side.ours else side.replicas
    side.peak = max(side.peak, side.replicas)
    # The LeaderWorkerSet follows: new groups at the end, removals from the end.
    while len(side.groups) < accepted:
        placed = sum(1 for g in side.groups if not g.pending)
        side.groups.append(Group(now, now + START_SECONDS, pending=placed >= GPU_GROUPS))
        if collapsed:
            side.bought_in_collapse += 1
    while len(side.groups) > accepted:
        gone = side.groups.pop()
        if gone.pending or gone.ready_at > now:
            side.removed_starting += 1
    # A Pending group is placed when GPUs free up; its start begins then.
    for group in side.groups:
        if group.pending and sum(1 for g in side.groups if not g.pending) < GPU_GROUPS:
            group.pending, group.ready_at = False, now + START_SECONDS
    side.pending_seconds += sum(1 for g in side.groups if g.pending)


Scenario = Callable[[int], tuple[float, bool]]


def ramp(now: int) -> tuple[float, bool]:
    """One group's worth of load, then three groups' worth from t=600 s."""
    return (0.9 * MU if now < 600 else 2.7 * MU), False


def collapse(now: int) -> tuple[float, bool]:
    """1.6 groups' worth on two Ready groups (minReplicas 2); the drafter collapses for 40
    minutes: the same requests then need 4.8 groups."""
    return 1.6 * MU, 1200 <= now < 3600


def lull(now: int) -> tuple[float, bool]:
    """A spike buys a second group; the load drops back to one group's worth for 10 minutes
    while that group loads, then comes back."""
    if now < 300:
        return 0.8 * MU, False
    if now < 900:
        return 1.6 * MU, False
    if now < 1500:
        return 0.5 * MU, False
    return 1.6 * MU, False


def run(name: str, scenario: Scenario, seconds: int, start_groups: int) -> None:
    """``start_groups`` Ready at the start, and minReplicas."""
    sides = [
        Side("plain ScaledObject", ours=False, down_window=PLAIN_DOWN_WINDOW),
        Side("kimik3 operator", ours=True, down_window=OURS_DOWN_WINDOW),
    ]
    for side in sides:
        side.replicas = side.min_replicas = start_groups
        side.groups = [Group(-START_SECONDS, 0) for _ in range(start_groups)]
    for now in range(seconds):
        arrivals, collapsed = scenario(now)
        for side in sides:
            step(side, now, arrivals, collapsed)
    print(f"\n{name} ({seconds} s, {start_groups} group(s) Ready at the start)")
    print(
        f"  {'':20} {'to first new group':>19} {'bought in collapse':>19} "
        f"{'removed starting':>17} {'group-s Pending':>16} {'peak asked':>11}"
    )
    for side in sides:
        delay = (
            f"{side.first_request - side.crossed} s"
            if side.first_request is not None and side.crossed is not None
            else "-"
        )
        print(
            f"  {side.name:20} {delay:>19} {side.bought_in_collapse:>19} "
            f"{side.removed_starting:>17} {side.pending_seconds:>16} {side.peak:>11}"
        )


def main() -> None:
    print(
        f"groups of {SPEC.gpus_per_replica} GPUs, {START_SECONDS} s to start, GPUs for "
        f"{GPU_GROUPS} groups; target {TARGET} waiting per group; HPA sync {SYNC} s; "
        f"scale-down window plain {PLAIN_DOWN_WINDOW} s, ours {OURS_DOWN_WINDOW} s"
    )
    run("load ramp", ramp, 3000, 1)
    run("drafter collapse under the same load", collapse, 4800, 2)
    run("lull while a new group loads", lull, 4000, 1)


if __name__ == "__main__":
    main()
